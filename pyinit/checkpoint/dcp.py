"""``torch.distributed.checkpoint`` (DCP) on O_DIRECT, with a CRC-32C per
item and a checkpoint that appears whole or not at all:

    import torch.distributed.checkpoint as dcp
    from pyinit.checkpoint import DirectStorageReader, DirectStorageWriter

    dcp.save(state, storage_writer=DirectStorageWriter("/ckpt/step-100"))
    dcp.async_save(state, storage_writer=DirectStorageWriter("/ckpt/step-200"))
    dcp.load(state, storage_reader=DirectStorageReader("/ckpt/step-200"))

The folder is DCP's own layout (a ``.metadata`` pickle and one
``__R_0.distcp`` per rank, each item as ``torch.save`` writes it), so DCP's
``FileSystemReader`` reads what this writer wrote and this reader reads what
``FileSystemWriter`` wrote. Resharding on load is DCP's planner, as with theirs.

Publishing: the ranks write their files into ``.NAME.saving`` beside the
target; the coordinator, once every rank's files are synced, writes
``.metadata`` into it, with every item's CRC-32C among its storage data,
and renames the folder into place (or exchanges it with the previous
version, which is then removed). A save killed at any point leaves the
previous checkpoint as it was, and no folder under the target's name
without its metadata.

A checkpoint folder is data, never code: ``.metadata`` is unpickled with
only the classes DCP's metadata is made of (torch's own reader would run
whatever the pickle names), and an item that is not a tensor, which DCP's
planner unpickles with ``torch.load(weights_only=False)``, is first checked
with torch's weights-only unpickler.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import math
import os
import pickle
import queue
import re
import shutil
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import _weights_only_unpickler
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from pyinit.checkpoint.staging import (
    ALIGN,
    BLOCK_BYTES,
    Copies,
    Held,
    aligned_range,
    block,
    mark,
    whole_pages,
)
from pyinit.errors import InputError
from pyinit.io import (
    ChecksumMismatch,
    DirectReader,
    DirectWriter,
    crc32c,
    crc32c_combine,
    publish_directory,
    write_file,
)
from pyinit.jsonfile import load_json, read_input, read_input_text
from pyinit.phases import phase

METADATA = ".metadata"  # DCP's name for it: FileSystemReader opens this
# Ours, in the metadata's storage data beside DCP's items (whose keys are
# MetadataIndex: torch's readers look those up and never meet this one):
# "FILE:OFFSET" -> the item's CRC-32C. Its presence says every item has one.
CRC_KEY = "pyinit.crc32c"
LEGACY_CHECKSUMS = ".crc32c"  # where the first version of this writer kept the table
# What DCP's metadata is made of: a .metadata that names anything else is refused.
METADATA_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
})  # fmt: skip
SUFFIX = ".distcp"
DCP_VERSION = "1.0.0"  # the layout version FileSystemWriter writes
COPY_AHEAD = 256 << 20  # device bytes copied to the host ahead of the writes
# Runs read at once, each by a thread that then checks, deserialises and copies
# it: with two, both were often past their read at the same moment and the
# disk idled (a 2 GiB load to an H200, 1.29 GB/s against 1.66 for the same
# bytes through checkpoint.load).
READ_THREADS = 4


def staging_folder(path: str) -> str:
    """Where a save of `path` is written before it is published."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.saving")


STAGING_NAME = re.compile(r"\..+\.saving")
# What a staging folder holds, each a file: rank files, the metadata, a writer's
# hidden temporary (pyinit.io's, where the filesystem has no O_TMPFILE). A folder of
# anything else is not one of ours, whatever its name, and is never swept.
STAGED_FILE = re.compile(r"__\d+_\d+\.distcp|\.metadata|\..+\.pod-init-\d+-\d+")
# A staging folder younger than this is left by a sweep even when unlocked: a save
# creates its folder first and locks it just after.
SWEEP_AFTER_S = 60.0


def _lock(folder: str, exclusive: bool) -> int | None:
    """`folder` opened and locked (flock), its descriptor; None where it
    cannot be locked: an exclusive lock is only tried, and fails while
    another process holds one (a shared one waits for a sweep's look at
    the folder), and the filesystem may take no locks. OSError when the
    folder cannot be opened."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep_abandoned_saves(parent: str) -> None:
    """Removes the staging folders in `parent` that no save holds: those of
    saves that failed or were killed. Checkpoints are usually saved to a
    new folder each time (``step-200`` after ``step-100``), so no later save
    of the same path would remove them, and on a full disk what one holds
    would fail the next save too. A save under way holds its folder's lock
    (a shared flock, taken by the coordinator until it publishes or drops
    the save), and a folder younger than SWEEP_AFTER_S may be one about to
    be locked; where the filesystem takes no locks, nothing is removed,
    nor a folder holding anything a save does not write."""
    for name in os.listdir(parent):
        if not STAGING_NAME.fullmatch(name):
            continue
        folder = os.path.join(parent, name)
        try:
            fd = _lock(folder, exclusive=True)
        except OSError:  # gone meanwhile, or not a folder
            continue
        if fd is None:  # held by a save under way, or no locks here to tell
            continue
        try:
            old = time.time() - os.fstat(fd).st_ctime >= SWEEP_AFTER_S
            with os.scandir(fd) as entries:
                ours = all(
                    entry.is_file(follow_symlinks=False) and STAGED_FILE.fullmatch(entry.name)
                    for entry in entries
                )
            if old and ours:
                shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Stored:
    """An item's place, as DCP's metadata records it, and its CRC-32C."""

    info: _StorageInfo
    crc: int


class _ItemStream:
    """The file-like torch.save writes an item into: it appends to the
    rank's file and keeps the item's CRC."""

    def __init__(self, out: DirectWriter):
        self._out = out
        self.crc = 0
        self.begin = 0

    def start(self) -> None:
        self.crc = 0
        self.begin = self._out.bytes

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = crc32c_combine(self.crc, self._out.write(view), view.nbytes)
        return view.nbytes

    def tell(self) -> int:
        return self._out.bytes

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True


def _host_tensors(items: Sequence[WriteItem], planner: SavePlanner
                  ) -> Iterator[tuple[WriteItem, torch.Tensor]]:  # fmt: skip
    """Each item's tensor on the host, in order, whole (torch.save writes a
    view's whole storage). Device tensors are copied into pinned memory up to
    COPY_AHEAD bytes ahead of the one being written."""
    copies = Copies()
    ahead: deque[tuple[WriteItem, torch.Tensor, Held]] = deque()
    ahead_bytes = 0

    def oldest() -> tuple[WriteItem, torch.Tensor]:
        nonlocal ahead_bytes
        done, host, held = ahead.popleft()
        held.wait()
        ahead_bytes -= host.nbytes
        return done, host

    for item in items:
        tensor = planner.resolve_data(item).detach()
        if tensor.device.type == "cpu":
            while ahead:  # in order
                yield oldest()
            if tensor.untyped_storage().nbytes() != tensor.nbytes or not tensor.is_contiguous():
                tensor = tensor.contiguous().clone()
            yield item, tensor
            continue
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        held = Held(host)
        stream = copies.copy(host, tensor)
        mark(held, {stream} if stream is not None else set())
        ahead.append((item, host, held))
        ahead_bytes += host.nbytes
        while ahead_bytes > COPY_AHEAD and len(ahead) > 1:
            yield oldest()
    while ahead:
        yield oldest()


def _item_bytes(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    return math.prod(item.tensor_data.size) * item.tensor_data.properties.dtype.itemsize


def _write_rank_file(path: str, name: str, items: Sequence[WriteItem], planner: SavePlanner,
                     queue_depth: int) -> list[WriteResult]:  # fmt: skip
    results = []
    blobs = [item for item in items if item.type == WriteItemType.BYTE_IO]
    tensors = [item for item in items if item.type != WriteItemType.BYTE_IO]
    size = sum(_item_bytes(item) for item in tensors)  # at least: checked against the free space
    with DirectWriter(path, size=size, queue_depth=queue_depth) as out:
        stream = _ItemStream(out)

        def stored(item: WriteItem) -> WriteResult:
            length = out.bytes - stream.begin
            info = _StorageInfo(name, stream.begin, length)
            return WriteResult(index=item.index, size_in_bytes=length,
                               storage_data=_Stored(info, stream.crc))  # fmt: skip

        for item in blobs:
            stream.start()
            stream.write(planner.resolve_data(item).getbuffer())
            results.append(stored(item))
        for item, tensor in _host_tensors(tensors, planner):
            stream.start()
            torch.save(tensor, stream)
            results.append(stored(item))
    return results


class _Folder:
    """What DCP asks of either storage about the checkpoint it names: a folder."""

    path: str

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


class DirectStorageWriter(_Folder, StorageWriter):
    """DCP's StorageWriter: each rank writes one file with O_DIRECT (its
    device tensors copied to pinned memory ahead of the writes), synced
    before the coordinator publishes the folder. ``path`` (or the
    checkpoint_id DCP passes) is the checkpoint's folder."""

    def __init__(self, path: str | os.PathLike[str] | None = None, queue_depth: int = 32):
        super().__init__()
        self.path = os.fspath(path) if path is not None else ""
        self.queue_depth = queue_depth
        self.save_id = uuid.uuid4().hex
        # The coordinator's lock on the staging folder while its save is under way
        # (see sweep_abandoned_saves); closed when the writer is dropped.
        self._held: weakref.finalize | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None}  # a lock stays with its process

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._release()  # the save before, if it failed, is over
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        if not self.path:
            raise ValueError("DirectStorageWriter needs a path: DirectStorageWriter(path) or "
                             "dcp.save(..., checkpoint_id=path)")  # fmt: skip
        self.save_id = uuid.uuid4().hex

    def _release(self) -> None:
        if self._held is not None:
            self._held()
            self._held = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Nothing per rank: the plan names each rank's file (prepare_global_plan)."""

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator, before any rank writes. The target is replaced
        # whole, so it must be a checkpoint (or nothing): a folder of other
        # files is refused, not swapped out and removed.
        if os.path.lexists(self.path):
            if not os.path.isdir(self.path) or os.path.islink(self.path):
                raise InputError("not a folder: a checkpoint is a folder", file=self.path)
            if os.listdir(self.path) and not os.path.exists(os.path.join(self.path, METADATA)):
                raise InputError(f"holds files and no {METADATA}: not a checkpoint to replace "
                                 "(save into a new folder)", file=self.path)  # fmt: skip
        staged = staging_folder(self.path)
        shutil.rmtree(staged, ignore_errors=True)  # a failed or killed save's
        os.makedirs(staged)
        # Held until this save is published or dropped: other saves' sweeps leave it.
        fd = _lock(staged, exclusive=False)
        if fd is not None:
            self._held = weakref.finalize(self, os.close, fd)
            sweep_abandoned_saves(os.path.dirname(staged))
        return [dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_"))
                for i, plan in enumerate(plans)]  # fmt: skip

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        staged = staging_folder(self.path)
        name = f"{plan.storage_data.prefix}0{SUFFIX}"
        with phase("checkpoint save") as detail:
            try:
                results = _write_rank_file(os.path.join(staged, name), name, plan.items,
                                           planner, self.queue_depth)  # fmt: skip
            except BaseException:
                self._release()  # the save fails on every rank: its folder is abandoned
                raise
            detail.update(path=self.path, bytes=sum(r.size_in_bytes for r in results), dcp=True)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        staged = staging_folder(self.path)
        storage = {}
        checksums = {}
        for rank_results in results:
            for result in rank_results:
                stored: _Stored = result.storage_data
                storage[result.index] = stored.info
                checksums[f"{stored.info.relative_path}:{stored.info.offset}"] = stored.crc
        storage[CRC_KEY] = checksums
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        metadata.version = DCP_VERSION
        # The metadata last: a folder that has it has everything it names.
        write_file(os.path.join(staged, METADATA), pickle.dumps(metadata))
        exchanged = publish_directory(staged, self.path)
        self._release()
        if exchanged:
            shutil.rmtree(staged)  # the previous version, exchanged out

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)


class _Bytes(io.RawIOBase):
    """A read-only file over a buffer, for torch.load: it reads records with
    readinto, straight from the buffer (io.BytesIO would copy it first)."""

    def __init__(self, data: memoryview):
        super().__init__()
        self._data = data
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._data)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(view.nbytes, len(self._data) - self._at))
        # numpy's copy lets go of the GIL: the other reading thread goes on.
        source = np.frombuffer(self._data, np.uint8, n, self._at)
        np.copyto(np.frombuffer(view, np.uint8, n), source)
        self._at += n
        return n


@dataclass
class _Run:
    """Consecutive items of one file, read at once."""

    path: str
    begin: int
    end: int
    requests: list[tuple[ReadItem, _StorageInfo]]


def _runs(path: str, requests: list[tuple[ReadItem, _StorageInfo]]) -> list[_Run]:
    runs: list[_Run] = []
    for request, info in sorted(requests, key=lambda r: r[1].offset):
        end = info.offset + info.length
        last = runs[-1] if runs else None
        if last is not None and info.offset <= last.end + ALIGN and end - last.begin <= BLOCK_BYTES:
            last.end = max(last.end, end)
            last.requests.append((request, info))
        else:
            runs.append(_Run(path, info.offset, end, [(request, info)]))
    return runs


def _saved_tensor(item: memoryview) -> torch.Tensor:
    """The tensor torch.save wrote into `item`, as a view of it: torch.load's
    own path for memory-mapped files (its records located in one storage
    that holds them all), with the weights-only unpickler torch.load uses.
    torch.load of a file-like would copy every record first."""
    whole = torch.frombuffer(item, dtype=torch.uint8).untyped_storage()
    with torch.serialization._open_zipfile_reader(_Bytes(item)) as archive:
        return torch.serialization._load(archive, "cpu", _weights_only_unpickler,
                                         overall_storage=whole, encoding="utf-8")  # fmt: skip


def _apply(path: str, request: ReadItem, item: memoryview, planner: LoadPlanner,
           planner_lock: threading.Lock) -> None:  # fmt: skip
    """One item's bytes, from the file `path`, into the planner's target
    (DCP's narrowing of a saved shard to the requested part, as
    FileSystemReader does it)."""
    if request.type == LoadItemType.BYTE_IO:
        _refuse_code(path, request, item)
        with planner_lock:
            planner.load_bytes(request, io.BytesIO(item))
        return
    tensor = _saved_tensor(item)
    tensor = narrow_tensor_by_index(tensor, request.storage_offsets, request.lengths)
    with planner_lock:
        target = planner.resolve_tensor(request).detach()
    if target.size() != tensor.size():
        raise InputError(f"item {request.storage_index.fqn!r}: {tuple(tensor.size())} in the "
                         f"checkpoint, {tuple(target.size())} in the state dict")  # fmt: skip
    target.copy_(tensor)
    with planner_lock:
        planner.commit_tensor(request, target)


def _refuse_code(path: str, request: ReadItem, item: memoryview) -> None:
    """An item that is not a tensor is a pickle, which DCP's planners load
    with torch.load(weights_only=False): whatever it names would run. It is
    unpickled first as torch.load does by default, with the globals torch
    allows and those the program added (torch.serialization.add_safe_globals);
    one that names anything else is refused, never run. What passes holds
    only what that unpickler builds, which the planner's load then builds
    again."""
    try:
        torch.load(io.BytesIO(item), weights_only=True)
    except pickle.UnpicklingError as error:
        named = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = named.group(1) if named else "what weights-only loading refuses"
        raise InputError(f"item {request.storage_index.fqn!r} is a pickle that names {what}, "
                         "which torch's weights-only loading does not allow: refused, never run "
                         "(torch.serialization.add_safe_globals allows a class you trust)",
                         file=path) from None  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata and nothing else: a global outside
    METADATA_GLOBALS (or torch's dtypes) is refused before it is touched."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP's metadata is not "
                                     "made of: refused, never run")  # fmt: skip


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class DirectStorageReader(_Folder, StorageReader):
    """DCP's StorageReader: each rank reads the byte ranges its plan names
    with O_DIRECT, in runs of up to 16 MiB, four at a time, and checks
    each item against the CRC-32C the writer recorded (a checkpoint that
    FileSystemWriter wrote has none: its items are read unchecked)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, queue_depth: int = 32):
        super().__init__()
        self.path = os.fspath(path) if path is not None else ""
        self.queue_depth = queue_depth
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[Any, _StorageInfo] = {}
        self.checksums: dict[str, int] | None = None
        self._metadata: tuple[tuple[int, ...], Metadata] | None = None
        if self.path:
            self._metadata = self._read_metadata_file()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
            self._metadata = self._read_metadata_file()
        self.load_id = uuid.uuid4().hex

    def _read_metadata_file(self) -> tuple[tuple[int, ...], Metadata]:
        """The folder's metadata, read where the folder is named: a folder
        that is not a checkpoint is then our one error, raised to the caller.
        Inside dcp.load, torch logs a failed read_metadata with its traceback
        and raises an AssertionError of its own. Kept with the identity of
        the file it came from, so read_metadata reads it again only if the
        checkpoint was replaced since."""
        path = os.path.join(self.path, METADATA)
        try:
            identity = _identity(os.stat(path))
            metadata = _MetadataUnpickler(io.BytesIO(read_input(path, limit=1 << 30))).load()
        except FileNotFoundError:
            raise FileNotFoundError(
                2, f"no {METADATA}: not a checkpoint, or one whose save did not finish", path
            ) from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError,
                ValueError, IndexError, KeyError, RecursionError) as error:  # fmt: skip
            raise InputError(f"not DCP metadata ({error})", file=path) from None
        if not isinstance(metadata, Metadata):
            raise InputError(f"holds a {type(metadata).__name__}, not DCP metadata", file=path)
        return identity, metadata

    def read_metadata(self) -> Metadata:
        # No rank argument: this writer writes one global metadata file, and
        # DCP looks for rank-local ones only from readers that take it.
        kept, self._metadata = self._metadata, None
        try:
            current = _identity(os.stat(os.path.join(self.path, METADATA)))
        except OSError:
            current = None
        if kept is None or kept[0] != current:
            kept = self._read_metadata_file()
        metadata = kept[1]
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:  # fmt: skip
        self.storage_data = metadata.storage_data
        self.checksums = self._checksums(metadata)

    def _checksums(self, metadata: Metadata) -> dict[str, int] | None:
        """Every item's CRC-32C, from the metadata (this writer's), or from
        the first version's ``.crc32c`` beside it; None when neither holds
        one (FileSystemWriter's checkpoints: read unchecked)."""
        storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
        where = os.path.join(self.path, METADATA)
        table = storage.get(CRC_KEY)
        if table is None:
            where = os.path.join(self.path, LEGACY_CHECKSUMS)
            if not os.path.exists(where):
                return None
            table = load_json(read_input_text(where, limit=1 << 30), where)
        if not isinstance(table, dict) or not all(isinstance(v, int) for v in table.values()):
            raise InputError("not a map of items to CRC-32C values", file=where)
        return table

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with phase("checkpoint load") as detail:
            detail.update(path=self.path, bytes=self._read(plan, planner), dcp=True)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read(self, plan: LoadPlan, planner: LoadPlanner) -> int:
        """Reads the plan's items into the planner's tensors; the bytes read.
        READ_THREADS threads take runs in turn and do all of a run's work
        (the read, CRCs, deserialising, the copy into the target), so the
        CPU work spreads as the reads do; only the planner's calls are
        serialised."""
        per_file: dict[str, list[tuple[ReadItem, _StorageInfo]]] = {}
        for request in plan.items:
            info = self.storage_data[request.storage_index]
            per_file.setdefault(info.relative_path, []).append((request, info))
        todo: queue.SimpleQueue[_Run] = queue.SimpleQueue()
        runs = [run for relative, requests in sorted(per_file.items())
                for run in _runs(relative, requests)]  # fmt: skip
        for run in runs:
            todo.put(run)
        planner_lock = threading.Lock()
        failures: list[BaseException] = []

        # Each thread reads into one buffer, reused run after run (a new one
        # would be faulted in every time); pinned where CUDA is, so the copies
        # into device targets go at the copy engines' speed.
        pinned = torch.cuda.is_available()
        longest = max((run.end - run.begin + 2 * ALIGN for run in runs), default=0)

        def read_runs() -> None:
            readers: dict[str, DirectReader] = {}
            buffer = block(pinned, max(BLOCK_BYTES, longest)).numpy()
            try:
                while not failures:
                    try:
                        run = todo.get_nowait()
                    except queue.Empty:
                        return
                    path = os.path.join(self.path, run.path)
                    reader = readers.get(path)
                    if reader is None:
                        reader = readers[path] = DirectReader(path, queue_depth=self.queue_depth)
                    begin, end = aligned_range(run.begin, run.end, whole_pages(reader.size))
                    got = reader.read_into(buffer[: end - begin], begin) if end > begin else 0
                    if got < run.end - begin:
                        raise InputError(
                            f"holds {begin + got} bytes, the metadata names bytes up to "
                            f"{run.end}: the file is truncated",
                            file=path,
                        )
                    data = memoryview(buffer[: end - begin])
                    for request, info in run.requests:
                        item = data[info.offset - begin : info.offset - begin + info.length]
                        self._check(path, info, request, item)
                        _apply(path, request, item, planner, planner_lock)
            except BaseException as error:
                failures.append(error)
            finally:
                for reader in readers.values():
                    reader.close()

        threads = [threading.Thread(target=read_runs, name="pyinit-dcp-read")
                   for _ in range(min(READ_THREADS, len(runs)))]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return sum(info.length for run in runs for _, info in run.requests)

    def _check(self, path: str, info: _StorageInfo, request: ReadItem, item: memoryview) -> None:
        if self.checksums is None:
            return
        expected = self.checksums.get(f"{info.relative_path}:{info.offset}")
        if expected is None:
            raise ChecksumMismatch(
                f"{path}: item {request.storage_index.fqn!r} (bytes {info.offset}.."
                f"{info.offset + info.length}) has no CRC-32C recorded, though the checkpoint "
                "records them: its metadata is damaged"
            )
        crc = crc32c(item)
        if crc != expected:
            raise ChecksumMismatch(
                f"{path}: item {request.storage_index.fqn!r} (bytes {info.offset}.."
                f"{info.offset + info.length}): CRC-32C {crc:08x}, recorded {expected:08x}: "
                "the file changed or is damaged"
            )
