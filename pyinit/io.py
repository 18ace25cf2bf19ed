"""Direct (O_DIRECT) reads for data loaders: any offset and length, served by
aligned reads with a deep queue on io_uring (or a pread pool), straight into
the memory the caller gets back.

    from pyinit.io import DirectReader

    with DirectReader("/data/shard-0001.bin") as reader:
        window = reader.read(offset, 4096)            # numpy uint8, owns its memory
        rows = reader.read_batch(offsets, 2049 * 2)    # shape (len(offsets), 4098)
        reader.read_into(pinned.numpy(), offset)       # any writable buffer
        reader.read_batch(offsets, 4096, out=buffer)   # reuse one buffer between calls

    # One queue over many files: row i comes from file files[i].
    with DirectReader(shard_paths, page_cache=True) as reader:
        rows = reader.read_batch(offsets, 2050, files=shard_of_row)

Reads go straight into the destination when its address, the offset and the
length are aligned (``aligned_empty`` makes such buffers; pinned torch memory
is page-aligned); otherwise through bounce buffers and one copy.

O_DIRECT goes to the device even when the page cache holds the data. With
``page_cache=True``, batch rows whose pages are all resident (mincore on a
read-only mapping; no IO, no readahead) are copied from memory instead, so a
data set that fits in RAM and was read before costs no device reads.

A reader made before a DataLoader forks its workers works in each of them (the
child builds its own ring on first use) and pickles for spawn-based workers
(the child reopens the path).

``read()``, ``read_batch()`` and ``aligned_empty()`` hand out memory from a
pool of page-aligned, already-faulted blocks that the ring registers, so a
plain call costs neither an mmap nor page faults nor pinning per read.
``stream()`` keeps reads in flight between iterations:

    for row in reader.stream(offsets, 1 << 20, depth=16):   # in order, the queue kept full
        consume(row)

Writes, for checkpoints: whole or absent, never half-written.

    write_file("/ckpt/step-100.bin", [header, payload])    # O_DIRECT, fsync, rename
    with DirectWriter("/ckpt/step-100.bin", size=total) as out:
        for part in parts:
            out.write(part)                               # committed when the block ends
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pyinit import _native
from pyinit.errors import InputError

BACKENDS = ("auto", "io_uring", "pread")


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    """An uninitialised array whose memory starts on a page boundary, so
    ``read_into`` and ``read_batch(out=...)`` can read straight into it (numpy's
    own arrays are only 16-byte aligned and go through bounce buffers)."""
    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return _native.aligned_empty(nbytes).view(dtype).reshape(dims)


ReadStream = _native.ReadStream


class DirectWriter(_native.DirectWriter):
    """Writes a new version of ``path`` with O_DIRECT through the ring and
    publishes it whole: the bytes go to an unnamed file in the same folder
    (``O_TMPFILE``), which ``commit()`` syncs, names and renames over ``path``
    before syncing the folder. Until then, and after any failure or crash,
    ``path`` is what it was. ``size``: the final size when known, checked
    against the free space up front so a full disk fails (``OSError`` ENOSPC naming ``path``) before
    anything is written. The content's CRC-32C is returned by ``commit()`` and
    kept in the ``user.pod-init.crc32c`` attribute (see ``verify``).

    ``write()`` returns the CRC-32C of what it took. ``head_bytes`` (a
    multiple of 4096) are left at the start for ``write_head()``, once, before
    ``commit()``: a header that describes what follows (its checksums) is
    written after it.

    As a context manager it commits when the block ends normally and discards
    the file when it raises.
    """

    def __init__(self, path: str | os.PathLike[str], size: int = 0, queue_depth: int = 32,
                 head_bytes: int = 0):  # fmt: skip
        super().__init__(os.fsencode(path), size, queue_depth, head_bytes)

    def __enter__(self) -> DirectWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.bytes} bytes written"
        return f"<DirectWriter {self.path!r} {state}>"


def write_file(path: str | os.PathLike[str], buffers: Any, queue_depth: int = 32) -> int:
    """Writes ``buffers`` (one buffer, or a sequence of them: bytes, numpy
    arrays, memoryviews) as the new content of ``path``, crash-safe as
    ``DirectWriter``; returns the CRC-32C."""
    one = isinstance(buffers, (bytes, bytearray, memoryview, np.ndarray))
    parts = [buffers] if one else list(buffers)
    views = [memoryview(part).cast("B") for part in parts]
    with DirectWriter(path, size=sum(v.nbytes for v in views), queue_depth=queue_depth) as out:
        for view in views:
            out.write(view)
    return out.crc


def stored_checksum(path: str | os.PathLike[str]) -> int | None:
    """The CRC-32C that DirectWriter recorded for ``path``, or None when the
    file has none (written by something else, or copied without attributes)."""
    try:
        value = os.getxattr(path, _native.CHECKSUM_ATTRIBUTE)
    except OSError as error:
        if error.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise
    try:
        return int(value.decode("ascii"), 16)
    except ValueError:
        raise InputError(f"{os.fspath(path)}: checksum attribute {value!r} is not hex") from None


class ChecksumMismatch(InputError):
    """A file's content does not match the checksum recorded when it was written."""


def check_recorded(path: str | os.PathLike[str], content_crc: Callable[[], int]) -> bool:
    """Compares the CRC-32C recorded for ``path`` with ``content_crc()`` (called
    only when there is one): True when they match, False when none is
    recorded; ``ChecksumMismatch`` (a ValueError) naming the file when they differ."""
    expected = stored_checksum(path)
    if expected is None:
        return False
    crc = content_crc()
    if crc != expected:
        raise ChecksumMismatch(
            f"{os.fspath(path)}: content CRC-32C {crc:08x}, recorded {expected:08x}: the file "
            "changed or is damaged"
        )
    return True


def verify(path: str | os.PathLike[str], queue_depth: int = 32) -> bool:
    """Reads ``path`` (O_DIRECT) and checks it against its recorded CRC-32C, as
    ``check_recorded``."""

    def content_crc() -> int:
        crc = 0
        chunk = aligned_empty(8 << 20)
        with DirectReader(path, queue_depth=queue_depth) as reader:
            for offset in range(0, reader.size, chunk.nbytes):
                got = reader.read_into(chunk, offset)
                crc = crc32c(chunk[:got], crc)
        return crc

    return check_recorded(path, content_crc)


crc32c = _native.crc32c
crc32c_combine = _native.crc32c_combine
populate = _native.populate


def map_file(path: str | os.PathLike[str], offset: int, length: int) -> np.ndarray:
    """[offset, offset + length) of the file at `path`, mapped privately, as a
    writable uint8 array (see ``_native.map_file``); `path` goes down as
    bytes, since a file's name need not be UTF-8."""
    return _native.map_file(os.fsencode(path), offset, length)


def publish_directory(staged: str | os.PathLike[str], target: str | os.PathLike[str]) -> bool:
    """Puts the folder ``staged`` (its files synced) in place of ``target`` in
    one step: a rename, or an exchange when ``target`` exists, after which
    ``staged`` holds the previous version (True) for the caller to remove.
    A reader of ``target`` sees the old folder or the new one, never neither."""
    return _native.publish_directory(os.fsencode(staged), os.fsencode(target))


memory_stats = _native.memory_stats


class PendingBatch:
    """A batch a DirectReader is reading (``read_batch_async``)."""

    def __init__(self, reader: DirectReader, ticket: int, rows: int, length: int):
        self._reader, self._ticket, self._shape = reader, ticket, (rows, length)
        self._rows: np.ndarray | None = None

    def result(self) -> np.ndarray:
        """The (rows, length) uint8 array, once every row has arrived; the
        reader's OSError if a read failed, ValueError when an earlier batch
        has not been waited for."""
        if self._rows is None:
            self._rows = self._reader._wait_batch(self._ticket, *self._shape)
        return self._rows


class DirectIOUnavailable(RuntimeWarning):
    """The filesystem refused O_DIRECT: reads go through the page cache."""


class DirectReader(_native.DirectReader):
    """Reads ``path`` (a file or a raw block device, or a list of them) with O_DIRECT.

    ``queue_depth``: reads kept in flight (1 to 4096). ``backend``: ``"auto"``
    (io_uring, else pread with the reason in ``backend_note``), ``"io_uring"``
    (OSError when the kernel refuses it) or ``"pread"``. ``page_cache``: serve
    batch rows that are wholly in the page cache from it. A reader over several
    files reads batches across them (``read_batch(..., files=...)``); ``path``
    and ``size`` belong to single-file readers, ``paths`` and ``sizes`` to all.

    Raises the matching ``OSError`` subclass with ``.filename`` (for example
    ``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``) and
    ``ValueError`` for bad arguments or a closed reader.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        queue_depth: int = 32,
        backend: str = "auto",
        page_cache: bool = False,
    ):
        # As bytes: a file's name need not be UTF-8.
        if isinstance(path, (str, os.PathLike)):
            paths: bytes | list[bytes] = os.fsencode(path)
        else:
            paths = [os.fsencode(p) for p in path]
        super().__init__(paths, queue_depth, backend, bool(page_cache))
        self._backend_choice = backend
        if not self.direct:
            warnings.warn(
                f"{self.paths[0]}{' and others' if len(self.paths) > 1 else ''}: the filesystem "
                "refuses O_DIRECT; reading through the page cache",
                DirectIOUnavailable,
                stacklevel=2,
            )

    def __enter__(self) -> DirectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_batch_async(self, offsets: Any, length: int, files: Any = None) -> PendingBatch:
        """``read_batch``'s rows, read in the background: the batch's reads
        are queued behind those of the batches before it, and ``result()``
        waits for them. Submitting the next batch before waiting for this one
        keeps the queue full between batches (``read_batch`` back to back lets
        it drain at the end of each). Batches are waited for in the order they
        were submitted; another call on the reader first lets them arrive."""
        return PendingBatch(self, *self._submit_batch(offsets, length, files))

    def __reduce__(self) -> tuple[Any, ...]:
        # Spawned workers reopen the file; a forked one keeps the open reader.
        paths = self.paths
        return (
            type(self),
            (
                paths[0] if len(paths) == 1 else paths,
                self.queue_depth,
                self._backend_choice,
                self.page_cache,
            ),
        )

    def __repr__(self) -> str:
        paths = self.paths
        where = repr(paths[0]) if len(paths) == 1 else f"{len(paths)} files"
        state = "closed" if self.closed else f"{sum(self.sizes)} bytes"
        mode = "direct" if self.direct else "buffered"
        queue = f"{self.backend} depth {self.queue_depth}"
        return f"<DirectReader {where} {state}, {mode}, {queue}>"
