"""Checkpoints of torch tensors in the safetensors layout, written with
O_DIRECT and published whole (``pyinit.io.DirectWriter``): a crash or a full
disk while saving leaves the previous checkpoint as it was.

    from pyinit import checkpoint

    checkpoint.save(model.state_dict(), "/ckpt/model.safetensors")
    pending = checkpoint.save(model.state_dict(), path, background=True)  # training goes on
    ...
    pending.wait()                                     # raises what the writing raised
    state = checkpoint.load("/ckpt/model.safetensors", device="cuda:0")
    state = checkpoint.load("/models/llama/", device="cuda:0")  # a folder, or its index.json
    some = checkpoint.load(folder, keys=["lm_head.weight"])

The files are plain safetensors (``safetensors.torch.load_file`` reads them,
and ``load`` reads files that ``safetensors`` wrote), packed in order of
decreasing element size so every tensor starts aligned for its type. The
state dict must be flat: names to tensors, as ``model.state_dict()`` is.

Device tensors never pass through a whole-file host buffer: loads and saves
go through a few pinned blocks (``staging``), the disk and the copy engines
working at once. For ``torch.distributed.checkpoint``:
``DirectStorageWriter`` and ``DirectStorageReader`` (``pyinit.checkpoint.dcp``).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyinit.extras import require

require("torch", "pyinit.checkpoint")

import torch  # noqa: E402

from pyinit.checkpoint import in_place, staging  # noqa: E402
from pyinit.checkpoint.format import (  # noqa: E402
    DTYPES,
    TORCH_DTYPES,
    Entry,
    checked_items,
    header_bytes,
    read_layout,
)
from pyinit.errors import InputError  # noqa: E402
from pyinit.io import (  # noqa: E402
    ChecksumMismatch,
    DirectReader,
    DirectWriter,
)
from pyinit.jsonfile import load_json, read_input_text  # noqa: E402
from pyinit.phases import boottime, phase, record  # noqa: E402

if TYPE_CHECKING:
    from pyinit.checkpoint.dcp import DirectStorageReader, DirectStorageWriter

__all__ = ["DTYPES", "TORCH_DTYPES", "DirectStorageReader", "DirectStorageWriter", "PendingSave",
           "load", "save", "wait_pending"]  # fmt: skip

Device = str | torch.device
Devices = Device | Mapping[str, Device]


def __getattr__(name: str) -> Any:
    # torch.distributed.checkpoint costs a second of imports: only a DCP user pays it.
    if name in ("DirectStorageWriter", "DirectStorageReader"):
        from pyinit.checkpoint import dcp

        return getattr(dcp, name)
    raise AttributeError(f"module 'pyinit.checkpoint' has no attribute {name!r}")


def _nbytes(items: list[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in items)


def _write(items: list[tuple[str, torch.Tensor]], path: str, queue_depth: int) -> int:
    """The tensors first, after room for the header; then the header, which
    holds their CRCs (the writer's own, taken as the bytes went by)."""
    placeholder, data_bytes = header_bytes(items)
    size = len(placeholder) + data_bytes
    on_host = all(t.device.type == "cpu" for _, t in items)
    # Behind the staging blocks the writer needs a shallower queue of its own.
    depth = queue_depth if on_host else min(queue_depth, staging.WRITER_DEPTH)
    with DirectWriter(path, size=size, queue_depth=depth,
                      head_bytes=len(placeholder)) as out:  # fmt: skip
        if on_host:
            crcs = [out.write(staging.flat_bytes(tensor).numpy()) for _, tensor in items]
        else:
            crcs = staging.drain([tensor for _, tensor in items], out.write)
        out.write_head(header_bytes(items, crcs)[0])
    return out.crc


_pending: set[PendingSave] = set()  # started and not yet waited for
_pending_lock = threading.Lock()


class PendingSave:
    """A checkpoint being written in the background. The process does not
    exit before it is written, waited for or not: its thread is not a daemon,
    so the interpreter joins it at exit, and ``pyinit run``'s worker waits for
    it (``wait_pending``) and reports a save that failed."""

    def __init__(self, snapshot: Snapshot, path: str, queue_depth: int, began: float,
                 blocked: float):  # fmt: skip
        self.path = path
        self.crc: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(snapshot, queue_depth, began, blocked), name="pyinit-checkpoint"
        )
        with _pending_lock:
            _pending.add(self)
        self._thread.start()

    def _run(self, snapshot: Snapshot, queue_depth: int, began: float, blocked: float) -> None:
        try:
            for copied in snapshot.copied:
                copied.synchronize()  # an error of the copies surfaces here, as the save's
            self.crc = _write(snapshot.items, self.path, queue_depth)
        except BaseException as error:  # handed to wait(), in the caller's thread
            self._error = error
            return
        finally:
            staging.snapshots.give(snapshot.arena, snapshot.pinned)
        record("checkpoint save", began, boottime(), path=self.path, bytes=_nbytes(snapshot.items),
               blocked_s=round(blocked, 6), background=True)  # fmt: skip

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
    Returns the file's CRC-32C. Device tensors are copied to the host a block
    at a time while earlier blocks are written. With ``background``, a
    ``PendingSave`` at once: the tensors are copied to host memory, a GPU's
    on its current stream, so that what the training queues there next (the
    optimizer's step) changes them only after the copy, and the caller waits
    for none of it; a thread writes the copy once it is done. Work on another
    stream that changes them must wait for the current one first."""
    target = os.fspath(path)
    items = checked_items(state_dict, target)
    with phase("checkpoint"):  # under pyinit run, a wait of the step it falls in
        began = boottime()
        if background:
            snapshot = _snapshot(items)
            return PendingSave(snapshot, target, queue_depth, began, boottime() - began)
        with phase("checkpoint save") as detail:
            detail.update(path=target, bytes=_nbytes(items))
            crc = _write(items, target, queue_depth)
            detail["blocked_s"] = round(boottime() - began, 6)
        return crc


@dataclass
class Snapshot:
    """Host copies of the tensors, views of one block from the pool; a GPU's
    copies are there once its event in `copied` has passed."""

    items: list[tuple[str, torch.Tensor]]
    arena: torch.Tensor
    pinned: bool
    copied: list[torch.cuda.Event]


def _snapshot(items: list[tuple[str, torch.Tensor]]) -> Snapshot:
    """Host copies of the tensors, so training may change them while they
    are written: packed in file order into one block (largest elements
    first, so every copy starts aligned for its type). A GPU tensor's copy is
    queued on its device's current stream and not waited for: what the
    training queues there next runs after it, and the writer waits for the
    event recorded behind the copies."""
    pinned = any(t.is_cuda for _, t in items)
    arena = staging.snapshots.take(_nbytes(items), pinned)
    snapshot = []
    at = 0
    try:
        for name, tensor in items:
            nbytes = tensor.numel() * tensor.element_size()
            copy = arena[at : at + nbytes].view(tensor.dtype).reshape(tensor.shape)
            copy.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
            snapshot.append((name, copy))
            at += nbytes
    except BaseException:
        # The copies queued so far still write into the arena: they run before it is reused.
        for device in {t.device for _, t in items[: len(snapshot) + 1] if t.is_cuda}:
            torch.cuda.current_stream(device).synchronize()
        staging.snapshots.give(arena, pinned)
        raise
    copied = []
    for device in {t.device for _, t in items if t.is_cuda}:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        copied.append(event)
    return Snapshot(snapshot, arena, pinned, copied)


# ---------------------------------------------------------------------------
# Loads


def _index_files(index: str) -> tuple[list[str], dict[str, str]]:
    """The files of a ``*.safetensors.index.json`` and which holds each tensor."""
    document = load_json(read_input_text(index), index)
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise InputError("no weight_map of tensor names to file names", file=index)
    folder = os.path.dirname(index)
    # One file however it is spelt ("s1.safetensors", "./s1.safetensors").
    files = {name: os.path.normpath(name) for name in set(weight_map.values())}
    for name, plain in files.items():
        if os.path.isabs(plain) or plain.split("/")[0] == "..":
            raise InputError(f"weight_map names {name!r}, outside the index's folder", file=index)
    holder = {key: os.path.join(folder, files[name]) for key, name in weight_map.items()}
    return sorted(set(holder.values())), holder


def _sources(target: str) -> tuple[list[str], dict[str, str] | None]:
    """The files a load reads: the one file, a folder's (through its index
    when it has exactly one), or an index's; and the index's map, if any."""
    if target.endswith(".index.json"):
        return _index_files(target)
    if os.path.isdir(target):
        indexes = sorted(glob.glob(os.path.join(glob.escape(target), "*.safetensors.index.json")))
        if len(indexes) == 1:
            return _index_files(indexes[0])
        files = sorted(glob.glob(os.path.join(glob.escape(target), "*.safetensors")))
        if not files:
            raise InputError("no *.safetensors file in the folder", file=target)
        return files, None
    return [target], None


def _device_of(devices: Devices, name: str, target: str) -> torch.device:
    if isinstance(devices, Mapping):
        if name not in devices:
            raise InputError(f"device= names no device for tensor {name!r}", file=target)
        wanted = devices[name]
    else:
        wanted = devices
    try:
        device = torch.device(wanted)
    except (RuntimeError, TypeError):
        device = None
    problem = staging.device_problem(device)
    if problem:
        raise InputError(f"device= {wanted!r}: {problem}", file=target)
    return device


def load(
    path: str | os.PathLike[str],
    device: Devices = "cpu",
    verify: bool = True,
    queue_depth: int = 32,
    keys: Collection[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, of a folder of them, or of a
    ``*.safetensors.index.json`` (a pretrained model's layout), read with O_DIRECT.

    ``device``: where the tensors go, one device ("cuda:1", a ``torch.device``)
    or a map from names to devices. Each tensor is allocated there and filled
    through a few pinned blocks, the reads and the copies overlapping: no
    host buffer of the file's size, whatever the device.
    ``keys``: only these tensors, and only their bytes are read. With
    ``verify``, every tensor is checked against the CRC-32C that ``save``
    recorded in the header (``ChecksumMismatch``, an InputError, naming the
    file and the tensor); files other tools wrote have none. InputError (a
    ValueError) naming the file and the tensor for content that is not
    safetensors."""
    target = os.fspath(path)
    # Under pyinit run: a wait of the step it falls in, and a phase of its own
    # (a restart's load shows in the timeline).
    with phase("checkpoint"), phase("checkpoint load") as detail:
        tensors = _load(target, device, verify, queue_depth, keys)
        moved = sum(t.numel() * t.element_size() for t in tensors.values())
        detail.update(path=target, bytes=moved)
        return tensors


def _load(target: str, devices: Devices, verify: bool, queue_depth: int,
          keys: Collection[str] | None) -> dict[str, torch.Tensor]:  # fmt: skip
    if isinstance(keys, str):
        raise InputError(f"keys= takes a list of tensor names, not the string {keys!r}",
                         file=target)  # fmt: skip
    paths, holder = _sources(target)
    wanted = None if keys is None else set(keys)
    if wanted is not None and holder is not None:
        missing = sorted(wanted - holder.keys())
        if missing:
            raise InputError(f"no tensor {missing[0]!r} in the index", file=target)
        paths = sorted({holder[k] for k in wanted})
    layouts = []
    seen: dict[str, str] = {}
    for path in paths:
        with DirectReader(path, queue_depth=queue_depth) as reader:
            layout = read_layout(reader, path)
        for entry in layout.entries:
            if entry.name in seen:
                raise InputError(f"tensor {entry.name!r} is in {seen[entry.name]} too", file=path)
            seen[entry.name] = path
            if holder is not None and holder.get(entry.name, path) != path:
                raise InputError(f"tensor {entry.name!r}: the index puts it in "
                                 f"{holder[entry.name]}", file=path)  # fmt: skip
        layouts.append(layout)
    # Every tensor asked for, or that the index names, is somewhere.
    missing = sorted((wanted if wanted is not None else (holder or {}).keys()) - seen.keys())
    if missing and holder is not None:
        more = f" (and {len(missing) - 1} more)" if missing[1:] else ""
        raise InputError(f"tensor {missing[0]!r}: the index puts it in {holder[missing[0]]}, "
                         f"which does not hold it{more}", file=target)  # fmt: skip
    if missing:
        raise InputError(f"no tensor {missing[0]!r}", file=target)
    chosen = [[e for e in layout.entries if wanted is None or e.name in wanted]
              for layout in layouts]  # fmt: skip
    places = {e.name: _device_of(devices, e.name, target) for entries in chosen for e in entries}
    return _read_tensors(layouts, chosen, places, verify, queue_depth)


def _read_tensors(layouts: list[Any], chosen: list[list[Entry]],
                          places: dict[str, torch.device], verify: bool,
                          queue_depth: int) -> dict[str, torch.Tensor]:  # fmt: skip
    paths = [layout.path for layout in layouts]
    sizes = [layout.size for layout in layouts]
    if all(place.type == "cpu" for place in places.values()):
        views, crcs = in_place.fill(paths, sizes, chosen, verify, queue_depth)
        flat = [entry for entries in chosen for entry in entries]
        tensors = {entry.name: tensor for entry, tensor in zip(flat, views, strict=True)}
    else:
        tensors = {}
        crcs = _fill_through_blocks(paths, sizes, chosen, places, tensors, verify, queue_depth)
    if verify:
        keyed = [(layouts[file].path, entry) for file, entries in enumerate(chosen)
                 for entry in entries]  # fmt: skip
        for key, (path, entry) in enumerate(keyed):
            _check(path, entry, crcs.get(key, 0))
    return tensors


def _fill_through_blocks(paths: list[str], sizes: list[int], chosen: list[list[Entry]],
                         places: dict[str, torch.device], tensors: dict[str, torch.Tensor],
                         verify: bool, queue_depth: int) -> dict[int, int]:  # fmt: skip
    """Allocates every tensor on its device (into `tensors`) and fills it
    through the staging blocks; returns the CRCs by tensor number."""
    pieces = []
    for file, entries in enumerate(chosen):
        for entry in entries:
            tensor = torch.empty(entry.shape, dtype=entry.dtype, device=places[entry.name])
            tensors[entry.name] = tensor
            pieces.append((file, entry.begin, entry.end, tensor))
    return staging.fill(paths, sizes, staging.pieces_of(pieces), verify, queue_depth)


def _check(path: str, entry: Entry, crc: int) -> None:
    if entry.crc is not None and crc != entry.crc:
        raise ChecksumMismatch(
            f"tensor {entry.name!r}: content CRC-32C {crc:08x}, recorded {entry.crc:08x}: the "
            "file changed or is damaged",
            file=path,
        )
