"""The safetensors layout: an 8-byte little-endian header length, a JSON
header (dtype, shape and byte range of every tensor), then the tensors'
bytes. What is written here is what ``safetensors.torch.load_file`` reads,
and what is read is checked as safetensors checks it.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pyinit.errors import InputError
from pyinit.jsonfile import MalformedJson, parse_json

# safetensors' names for torch's types.
DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}  # fmt: skip
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}
# A header larger than this is not a checkpoint's (safetensors refuses 100 MB too).
MAX_HEADER = 100 << 20
# The header's own entry: safetensors keeps the file's metadata under this name.
METADATA = "__metadata__"
# Ours in it: each tensor's CRC-32C, 8 hex digits, comma-separated, in the order of the data.
CRC_KEY = "pyinit.crc32c"
HEAD_ALIGN = 4096  # the data starts here: direct IO's unit


def checked_items(state_dict: Mapping[str, Any], path: str) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"save takes a dict of tensors, not {type(state_dict).__name__}")
    items = []
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise InputError(f"tensor names must be str, not {name!r}", file=path)
        if name == METADATA:
            # Written, it would be read back as the file's metadata: dropped by
            # load, and the whole file refused by safetensors.
            raise InputError(f"tensor {name!r}: the name safetensors keeps for the file's "
                             "metadata; rename the tensor", file=path)  # fmt: skip
        if not isinstance(value, torch.Tensor):
            raise InputError(
                f"tensor {name!r} is a {type(value).__name__}, not a tensor: the safetensors "
                "layout holds tensors only (flatten nested state, or keep it beside the "
                "checkpoint)",
                file=path,
            )
        if value.dtype not in DTYPES:
            raise InputError(f"tensor {name!r}: dtype {value.dtype} has no safetensors name",
                             file=path)  # fmt: skip
        if value.is_meta:
            raise InputError(f"tensor {name!r} is a meta tensor (no data): only tensors with "
                             "data are saved (materialise it first)", file=path)  # fmt: skip
        if value.layout != torch.strided:
            raise InputError(f"tensor {name!r} is layout {value.layout}: only dense tensors "
                             "are saved (.to_dense() it)", file=path)  # fmt: skip
        items.append((name, value))
    # Larger elements first, as safetensors orders them: every offset stays aligned.
    items.sort(key=lambda item: (-item[1].element_size(), item[0]))
    return items


def header_bytes(items: list[tuple[str, torch.Tensor]],
                 crcs: list[int] | None = None) -> tuple[bytes, int]:  # fmt: skip
    """The length prefix and JSON header, padded with spaces so the data
    starts on a HEAD_ALIGN boundary (the writer writes it last, in the space
    it left); and the data's size. Without `crcs`, zeros hold their place: a
    header of the same length."""
    crcs = crcs if crcs is not None else [0] * len(items)
    metadata = {"format": "pt", CRC_KEY: ",".join(f"{crc:08x}" for crc in crcs)}
    entries: dict[str, Any] = {METADATA: metadata}
    at = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        entries[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [at, at + nbytes]}  # fmt: skip
        at += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % HEAD_ALIGN)
    return struct.pack("<Q", len(text)) + text, at


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: where its bytes lie, counted from the file's start."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int
    crc: int | None  # recorded at save; None in files other tools wrote

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Layout:
    """A safetensors file's header: its size, where the data starts, its tensors."""

    path: str
    size: int
    data_start: int
    entries: list[Entry]


def read_layout(reader: Any, path: str) -> Layout:
    """The header of the file ``reader`` (a DirectReader) holds, checked."""
    size = reader.size
    if size < 8:
        raise InputError(f"{size} bytes, too short for a safetensors file", file=path)
    (length,) = struct.unpack("<Q", reader.read(0, 8).tobytes())
    if length > min(MAX_HEADER, size - 8):
        raise InputError(f"header length {length} does not fit the file ({size} bytes)", file=path)
    start = 8 + length
    parsed, metadata = parse_header(path, reader.read(8, length).tobytes(), size - start)
    parsed.sort(key=lambda e: (e[3], e[4]))  # the order of the data, as the CRCs are
    crcs: list[int | None] = [None] * len(parsed)
    if CRC_KEY in metadata:
        text = metadata[CRC_KEY]
        values = text.split(",") if text else []
        if len(values) != len(parsed) or not all(
            len(v) == 8 and all(c in "0123456789abcdef" for c in v) for v in values
        ):
            raise InputError(f"{METADATA} {CRC_KEY} holds {len(values)} values, not "
                             f"{len(parsed)} CRCs of 8 hex digits", file=path)  # fmt: skip
        crcs = [int(v, 16) for v in values]
    entries = [
        Entry(name, TORCH_DTYPES[dtype], tuple(shape), start + begin, start + end, crc)
        for (name, dtype, shape, begin, end), crc in zip(parsed, crcs, strict=True)
    ]
    return Layout(path, size, start, entries)


def parse_header(path: str, text: bytes, data_bytes: int
                 ) -> tuple[list[tuple[str, str, list, int, int]], dict[str, str]]:  # fmt: skip
    """The tensors a header describes, checked as safetensors checks them:
    names, dtypes, shapes and offsets of the right types and ranges, and
    offsets that cover the data exactly once, in order (no gap, no overlap);
    and the file's metadata. InputError naming the file and the tensor for
    anything else."""
    try:
        header = parse_json(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError("the safetensors header is not UTF-8 text", file=path) from None
    except MalformedJson as error:
        raise InputError(f"the safetensors header is not JSON ({error})", file=path) from None
    if not isinstance(header, dict):
        raise InputError("the safetensors header is not a JSON object", file=path)
    metadata = header.get(METADATA, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InputError(f"{METADATA} must map names to strings", file=path)
    entries = []
    for name, entry in header.items():
        if name == METADATA:
            continue

        def bad(what: str, name: str = name) -> InputError:
            return InputError(f"tensor {name!r}: {what}", file=path)

        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise bad("lacks dtype, shape or data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in TORCH_DTYPES:
            raise bad(f"dtype {dtype!r} is unknown here")
        if not isinstance(shape, list) or not all(_whole(n) and n >= 0 for n in shape):
            raise bad(f"shape {shape!r} is not a list of whole numbers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_whole, offsets))):
            raise bad(f"data_offsets {offsets!r} is not two whole numbers")
        begin, end = offsets
        numel = math.prod(shape)  # Python's ints: no overflow, compared below
        if (
            not 0 <= begin <= end <= data_bytes
            or end - begin != numel * TORCH_DTYPES[dtype].itemsize
        ):
            raise bad(f"claims bytes {begin}..{end} of {data_bytes}, which do not hold "
                      f"{shape} of {dtype}")  # fmt: skip
        entries.append((name, dtype, shape, begin, end))
    at = 0
    for name, _dtype, _shape, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != at:
            what = (
                "overlaps the tensor before it"
                if begin < at
                else f"leaves bytes {at}..{begin} unused"
            )
            raise InputError(f"tensor {name!r}: {what}", file=path)
        at = end
    if at != data_bytes:
        raise InputError(f"the tensors end at byte {at} of {data_bytes}: the rest is unused",
                         file=path)  # fmt: skip
    return entries, metadata
