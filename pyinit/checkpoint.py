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
from pyinit.run.steps import phase  # noqa: E402

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


def _tensors(state_dict: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"save takes a dict of tensors, not {type(state_dict).__name__}")
    items = []
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be str, not {name!r}")
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{name!r} is a {type(value).__name__}, not a tensor: the safetensors layout "
                "holds tensors only (flatten nested state, or keep it beside the checkpoint)"
            )
        if value.dtype not in DTYPES:
            raise ValueError(f"{name!r}: dtype {value.dtype} has no safetensors name")
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


class PendingSave:
    """A checkpoint being written in the background."""

    def __init__(self, items: list[tuple[str, torch.Tensor]], path: str, queue_depth: int):
        self.path = path
        self.crc: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(items, queue_depth), name="pyinit-checkpoint", daemon=True
        )
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
        if self._error is not None:
            raise self._error
        assert self.crc is not None
        return self.crc


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
    items = _tensors(state_dict)
    target = os.fspath(path)
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


def _parse_header(path: str, text: bytes, data_bytes: int) -> list[tuple[str, str, list, int, int]]:
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: the safetensors header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: the safetensors header is not a JSON object")
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise InputError(
                f"{path}: tensor {name!r} lacks dtype, shape or data_offsets"
            ) from None
        if dtype not in TORCH_DTYPES:
            raise InputError(f"{path}: tensor {name!r} has dtype {dtype!r}, unknown here")
        numel = int(np.prod(shape, dtype=np.int64))
        if (
            not 0 <= begin <= end <= data_bytes
            or end - begin != numel * TORCH_DTYPES[dtype].itemsize
        ):
            raise InputError(
                f"{path}: tensor {name!r} claims bytes {begin}..{end} of {data_bytes}, which do "
                f"not hold {shape} of {dtype}"
            )
        entries.append((name, dtype, shape, begin, end))
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
    target = os.fspath(path)
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
