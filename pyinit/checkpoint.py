"""Checkpoints of torch tensors in the safetensors layout, written with
O_DIRECT and published whole (``pyinit.io.DirectWriter``): a crash or a full
disk while saving leaves the previous checkpoint as it was.

    from pyinit import checkpoint

    checkpoint.save(model.state_dict(), "/ckpt/model.safetensors")
    pending = checkpoint.save(model.state_dict(), path, background=True)  # training goes on
    ...
    pending.wait()                                     # raises what the writing raised
    state = checkpoint.load("/ckpt/model.safetensors")  # checks the CRC-32C when recorded

The files are plain safetensors (``safetensors.torch.load_file`` reads them,
and ``load`` reads files that ``safetensors`` wrote): an 8-byte little-endian
header length, a JSON header (dtype, shape and byte range of every tensor),
then the tensors' bytes, packed in order of decreasing element size so every
tensor starts aligned for its type. The state dict must be flat: names to
tensors, as ``model.state_dict()`` is.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from pyinit.extras import require

require("torch", "pyinit.checkpoint")

import torch  # noqa: E402

from pyinit.errors import InputError  # noqa: E402
from pyinit.io import (  # noqa: E402
    DirectReader,
    DirectWriter,
    aligned_empty,
    check_recorded,
    crc32c,
)
from pyinit.jsonfile import MalformedJson, parse_json  # noqa: E402
from pyinit.phases import phase  # noqa: E402

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


def _tensors(state_dict: Mapping[str, Any], path: str) -> list[tuple[str, torch.Tensor]]:
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
        if value.layout != torch.strided or value.is_meta:
            what = "a meta tensor (no data)" if value.is_meta else f"layout {value.layout}"
            raise InputError(f"tensor {name!r} is {what}: only dense tensors with data are "
                             "saved (.to_dense() a sparse one)", file=path)  # fmt: skip
        items.append((name, value))
    # Larger elements first, as safetensors orders them: every offset stays aligned.
    items.sort(key=lambda item: (-item[1].element_size(), item[0]))
    return items


def _header(items: list[tuple[str, torch.Tensor]]) -> tuple[bytes, int]:
    """The length prefix and JSON header, padded with spaces so the data
    starts on an 8-byte boundary; and the data's size."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        entries[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [at, at + nbytes]}  # fmt: skip
        at += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, at


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a uint8 array, without a copy when it is a
    contiguous CPU tensor."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if flat.numel() == 0:
        return np.empty(0, np.uint8)
    return flat.view(torch.uint8).numpy()


def _write(items: list[tuple[str, torch.Tensor]], path: str, queue_depth: int) -> int:
    header, data_bytes = _header(items)
    with DirectWriter(path, size=len(header) + data_bytes, queue_depth=queue_depth) as out:
        out.write(header)
        for _, tensor in items:
            out.write(_bytes_of(tensor))
    return out.crc


_pending: set[PendingSave] = set()  # started and not yet waited for
_pending_lock = threading.Lock()


class PendingSave:
    """A checkpoint being written in the background. The process does not
    exit before it is written, waited for or not: its thread is not a daemon,
    so the interpreter joins it at exit, and ``pyinit run``'s worker waits for
    it (``wait_pending``) and reports a save that failed."""

    def __init__(self, items: list[tuple[str, torch.Tensor]], path: str, queue_depth: int):
        self.path = path
        self.crc: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(items, queue_depth), name="pyinit-checkpoint"
        )
        with _pending_lock:
            _pending.add(self)
        self._thread.start()

    def _run(self, items: list[tuple[str, torch.Tensor]], queue_depth: int) -> None:
        try:
            self.crc = _write(items, self.path, queue_depth)
        except BaseException as error:  # handed to wait(), in the caller's thread
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> int:
        """Waits until the file is published; returns its CRC-32C and raises
        what the writing raised. TimeoutError when it is still writing."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.path}: still writing after {timeout} s")
        with _pending_lock:
            _pending.discard(self)
        if self._error is not None:
            raise self._error
        assert self.crc is not None
        return self.crc


def wait_pending() -> list[str]:
    """Waits for every background save not yet waited for; one line per
    save that failed (the file and why), for the caller to report."""
    with _pending_lock:
        pending = sorted(_pending, key=lambda save: save.path)
    failures = []
    for save in pending:
        try:
            save.wait()
        except (OSError, ValueError) as error:
            failures.append(f"{save.path}: the background save failed: {error}")
    return failures


def save(
    state_dict: Mapping[str, Any],
    path: str | os.PathLike[str],
    background: bool = False,
    queue_depth: int = 32,
) -> int | PendingSave:
    """Writes ``state_dict`` (names to tensors, on any device) to ``path`` in
    the safetensors layout, replacing it whole once everything is on disk.
    Returns the file's CRC-32C; with ``background``, a ``PendingSave`` at once:
    the tensors are first copied to host memory (so training may change them),
    then written by a thread while the caller goes on."""
    target = os.fspath(path)
    items = _tensors(state_dict, target)
    with phase("checkpoint"):  # under pyinit run, counted apart in its report
        if not background:
            return _write([(name, tensor.cpu()) for name, tensor in items], target, queue_depth)
        return PendingSave(_snapshot(items), target, queue_depth)


def _snapshot(items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Host copies of the tensors, so training may change them while they are written."""
    snapshot = []
    pin = torch.cuda.is_available()
    for name, tensor in items:
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin and tensor.is_cuda)
        copy.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
        snapshot.append((name, copy))
    if pin:
        torch.cuda.synchronize()
    return snapshot


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_header(path: str, text: bytes, data_bytes: int) -> list[tuple[str, str, list, int, int]]:
    """The tensors a header describes, checked as safetensors checks them:
    names, dtypes, shapes and offsets of the right types and ranges, and
    offsets that cover the data exactly once, in order (no gap, no overlap).
    InputError naming the file and the tensor for anything else."""
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
    return entries


def load(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    verify: bool = True,
    queue_depth: int = 32,
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, read with O_DIRECT in one pass into
    one block of memory that the CPU tensors share (it lives while any of
    them does). With ``verify``, a recorded CRC-32C is checked
    (``ChecksumMismatch``, a ValueError, naming the file). InputError (a
    ValueError) naming the file for content that is not safetensors."""
    # Under pyinit run: a wait of the step it falls in, and a phase of its own
    # (a restart's load shows in the timeline).
    with phase("checkpoint"), phase("checkpoint load"):
        return _load_file(os.fspath(path), device, verify, queue_depth)


def _load_file(target: str, device: str | torch.device, verify: bool,
               queue_depth: int) -> dict[str, torch.Tensor]:  # fmt: skip
    with DirectReader(target, queue_depth=queue_depth) as reader:
        size = reader.size
        if size < 8:
            raise InputError(f"{target}: {size} bytes, too short for a safetensors file")
        prefix = reader.read(0, 8)
        (header_bytes,) = struct.unpack("<Q", prefix.tobytes())
        if header_bytes > min(MAX_HEADER, size - 8):
            raise InputError(
                f"{target}: header length {header_bytes} does not fit the file ({size} bytes)"
            )
        # The whole file in one aligned block, so the reads go straight into it.
        content = aligned_empty(size)
        got = reader.read_into(content, 0)
        if got != size:
            raise InputError(f"{target}: read {got} of {size} bytes (the file shrank)")
    if verify:
        check_recorded(target, lambda: crc32c(content))
    start = 8 + header_bytes
    entries = _parse_header(target, content[8:start].tobytes(), size - start)
    data = torch.from_numpy(content[start:])
    tensors = {}
    for name, dtype_name, shape, begin, end in entries:
        dtype = TORCH_DTYPES[dtype_name]
        raw = data[begin:end]
        if (start + begin) % dtype.itemsize:
            raw = raw.clone()  # written unaligned by another tool: a copy of its own is aligned
        tensor = raw.view(dtype).reshape(shape)
        tensors[name] = tensor if torch.device(device).type == "cpu" else tensor.to(device)
    return tensors
