"""Tensors between a device and a file through a few host blocks: pinned
(page-locked, so copies run on the GPU's copy engines while the disk works)
where CUDA is, page-aligned (so O_DIRECT reads land in them) everywhere.

A load reads aligned windows of the files into free blocks, a reader thread
per two cores (4 to 8) at a time, each its own reader and ring; the thread
that read a window takes its parts' CRCs at once, while the bytes are still
in the CPU's cache, and the calling thread copies every window's part of
each tensor into that tensor, allocated on its device. A reader thread waits for the copies out of
a block before it reads into it again, so the calling thread never waits for
a copy or a CRC. A save copies the tensors' bytes
into blocks in file order, and writes a block once its copies have run, while
the copies of the next blocks go on. The host memory either needs is the
blocks', whatever the checkpoint's size.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from pyinit.io import DirectReader, aligned_empty, crc32c, crc32c_combine

BLOCK_BYTES = 16 << 20  # one read or one write: 16 of the ring's 1 MiB pieces
BLOCKS = 8  # a load's being read into or copied out of; a save's being copied into or written
# A device load's reader threads: each reads and checksums one window at a time
# into a free block. A reader moves about 2.5 GB/s from memory on an H200
# host's core, so the pipeline's own ceiling (a page-cached file: what a node
# of many NVMe drives needs) grows with them: 5.4 GB/s with 2 readers, 10.1
# with 4, 13.0 with 6, 16.0 with 8 (bench/NOTES.md). Half the cores this
# process may run on, within these bounds.
MIN_READERS, MAX_READERS = 4, 8
ALIGN = 4096  # O_DIRECT's offset and length unit on the filesystems checkpoints live on


WRITER_DEPTH = 16  # the writer's own 1 MiB blocks in flight behind a device save's
HUGE_PAGE = 2 << 20  # a transparent huge page where the base page is 4 KiB (x86-64, arm64)
FAULT_THREADS = 8  # at most: they zero fresh pages in parallel, each at one core's memory speed


def device_problem(device: torch.device | None) -> str:
    """Why the blocks cannot copy to or from `device` (None: not one torch
    knows), "" when they can: they reach the CPU and CUDA devices only."""
    if device is None or device.type not in ("cpu", "cuda"):
        return "not a device checkpoints go to (cpu, cuda, cuda:N)"
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA GPU(s)"
    return ""


def staging_bytes() -> int:
    """The host memory a device load or save holds (the save's writer
    included): the bound the benchmark checks."""
    return BLOCK_BYTES * BLOCKS + WRITER_DEPTH * (1 << 20)


def load_readers() -> int:
    """Half the cores this process may run on, within MIN_READERS and MAX_READERS."""
    return min(MAX_READERS, max(MIN_READERS, len(os.sched_getaffinity(0)) // 2))


def block(pinned: bool, nbytes: int = 0) -> torch.Tensor:
    """Host memory for direct IO and copies: `nbytes` (a block by default),
    page-aligned, pinned where asked."""
    nbytes = nbytes or BLOCK_BYTES
    if pinned:
        # cudaHostAlloc's memory starts on a page: O_DIRECT reads go straight into it.
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return torch.from_numpy(aligned_empty(nbytes))


def registered_empty(nbytes: int) -> torch.Tensor:
    """`nbytes` of page-locked host memory, page-aligned, for a state's
    snapshot. torch's ``pin_memory`` (cudaHostAlloc) zeroes and locks the
    pages on one thread, 0.67-0.84 s for 2 GiB on an H200 host, and the
    first background save blocks for it. Anonymous memory in huge pages,
    faulted in by several threads and then registered with CUDA, took
    0.10 s there, and the copies into it run as fast (bench/NOTES.md).
    Where the registration fails, torch's allocation. Freed once no view
    of it is left: a save keeps it in `snapshots`."""
    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # a hint: without huge pages the threads still help
        area.madvise(mmap.MADV_HUGEPAGE)
    pages = np.frombuffer(area, dtype=np.uint8)
    address = pages.ctypes.data
    threads = max(1, min(FAULT_THREADS, len(os.sched_getaffinity(0)), size // HUGE_PAGE))
    share = -(-size // threads // HUGE_PAGE) * HUGE_PAGE

    def fault_in(at: int) -> None:
        # One written byte a page faults it in; numpy lets go of the GIL while it writes.
        pages[at : at + share : mmap.PAGESIZE].fill(0)

    with ThreadPoolExecutor(threads, thread_name_prefix="pyinit-pin") as pool:
        list(pool.map(fault_in, range(0, size, share)))
        # A failed CUDA call stays the calling thread's last error, which torch's next
        # kernel launch there would report as its own: a pool thread makes it.
        registered = pool.submit(torch.cuda.cudart().cudaHostRegister, address, size, 1).result()
    if int(registered) != 0:
        del pages
        area.close()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    weakref.finalize(pages, _unregister, area, address).atexit = False
    return torch.from_numpy(pages)[:nbytes]


def _unregister(area: mmap.mmap, address: int) -> None:
    """Unlocks `area` once no view of it is left; it is unmapped with the
    last reference to it, this call's. torch keeps its own pinned memory
    until the copies queued into it have run, but not registered memory:
    whoever drops a view must have waited for its copies."""
    torch.cuda.cudart().cudaHostUnregister(address)


class SnapshotPool:
    """Host memory a background save copies the state into, kept for the
    next one: pinning it costs time (`registered_empty`), so only the first
    background save pays it, and later ones block for the copy alone. One
    spare per kind, the largest, is kept."""

    def __init__(self) -> None:
        self._spare: dict[bool, torch.Tensor] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int, pinned: bool) -> torch.Tensor:
        with self._lock:
            spare = self._spare.get(pinned)
            if spare is not None and spare.numel() >= nbytes:
                return self._spare.pop(pinned)
        return registered_empty(nbytes) if pinned else block(False, max(nbytes, 1))

    def give(self, arena: torch.Tensor, pinned: bool) -> None:
        with self._lock:
            spare = self._spare.get(pinned)
            if spare is None or spare.numel() < arena.numel():
                self._spare[pinned] = arena


snapshots = SnapshotPool()


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a 1-D uint8 tensor on its device (a view when
    it is contiguous)."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return flat.view(torch.uint8)


class Copies:
    """Copies between host blocks and device memory on a side stream per
    device, so they overlap the disk and wait for the work that produced
    their sources (the caller's stream) but nothing else."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def stream(self, device: torch.device) -> torch.cuda.Stream | None:
        if device.type != "cuda":
            return None
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
        return stream

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> torch.cuda.Stream | None:
        cuda = destination if destination.is_cuda else source
        stream = self.stream(cuda.device)
        if stream is None:
            destination.copy_(source)
            return None
        with torch.cuda.stream(stream):
            destination.copy_(source, non_blocking=True)
        return stream

    def synchronize(self) -> None:
        for stream in self._streams.values():
            stream.synchronize()


@dataclass
class Held:
    """A block and the copies that still read from or write into it."""

    block: torch.Tensor
    events: list[torch.cuda.Event] = field(default_factory=list)

    def wait(self) -> None:
        for event in self.events:
            event.synchronize()
        self.events.clear()


def mark(held: Held, streams: set[torch.cuda.Stream]) -> None:
    for stream in streams:
        event = torch.cuda.Event()
        event.record(stream)
        held.events.append(event)


def _pinned(destinations: Sequence[torch.device]) -> bool:
    return any(d.type == "cuda" for d in destinations)


# ---------------------------------------------------------------------------
# Loads


@dataclass(frozen=True)
class Piece:
    """Bytes [begin, end) of file `file` that belong at `at` of `target`,
    the bytes of tensor number `key`."""

    file: int
    begin: int
    end: int
    target: torch.Tensor  # 1-D uint8
    at: int
    key: int


@dataclass(frozen=True)
class Window:
    """One aligned read: bytes [begin, begin + length) of file `file`."""

    file: int
    begin: int
    length: int
    pieces: tuple[Piece, ...]


def aligned_range(begin: int, end: int, size: int) -> tuple[int, int]:
    """The O_DIRECT-aligned bytes that cover [begin, end) of a file of
    `size` bytes: the end stops at the file's end, where a read may."""
    return begin - begin % ALIGN, min(whole_pages(end), size)


def whole_pages(length: int) -> int:
    """`length` rounded up to the alignment."""
    return -(-length // ALIGN) * ALIGN


def windows(pieces: Sequence[Piece], sizes: Sequence[int]) -> list[Window]:
    """Aligned reads of at most a block that cover every piece, in file order."""
    out: list[Window] = []
    by_file: dict[int, list[Piece]] = {}
    for piece in pieces:
        by_file.setdefault(piece.file, []).append(piece)
    for file in sorted(by_file):
        size = sizes[file]
        ordered = sorted(by_file[file], key=lambda p: p.begin)
        # Aligned ranges the pieces need, merged where they touch.
        ranges: list[list[int]] = []
        for piece in ordered:
            lo, hi = aligned_range(piece.begin, piece.end, size)
            if ranges and lo <= ranges[-1][1]:
                ranges[-1][1] = max(ranges[-1][1], hi)
            else:
                ranges.append([lo, hi])
        first = 0
        for lo, hi in ranges:
            for begin in range(lo, hi, BLOCK_BYTES):
                end = min(begin + BLOCK_BYTES, hi)
                while first < len(ordered) and ordered[first].end <= begin:
                    first += 1
                inside = []
                for piece in ordered[first:]:
                    if piece.begin >= end:
                        break
                    a, b = max(piece.begin, begin), min(piece.end, end)
                    inside.append(
                        Piece(file, a, b, piece.target, piece.at + a - piece.begin, piece.key)
                    )
                out.append(Window(file, begin, end - begin, tuple(inside)))
    return out


class Readers:
    """A DirectReader per thread and file: a ring serves the thread that made it."""

    def __init__(self, paths: Sequence[str], queue_depth: int):
        self._paths = paths
        self._queue_depth = queue_depth
        self._local = threading.local()
        self._all: list[DirectReader] = []
        self._lock = threading.Lock()

    def read(self, window: Window, block: torch.Tensor) -> int:
        length = whole_pages(window.length)
        return self.read_into(window.file, block.numpy()[:length], window.begin)

    def read_into(self, file: int, destination: np.ndarray, offset: int) -> int:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        reader = readers.get(file)
        if reader is None:
            reader = readers[file] = DirectReader(self._paths[file], queue_depth=self._queue_depth)
            with self._lock:
                self._all.append(reader)
        return reader.read_into(destination, offset)

    def close(self) -> None:
        for reader in self._all:
            reader.close()


def fill(paths: Sequence[str], sizes: Sequence[int], pieces: Sequence[Piece], checksums: bool,
         queue_depth: int) -> dict[int, int]:  # fmt: skip
    """Reads every piece into its target, each reader `queue_depth` IOs deep.
    With `checksums`, returns the CRC-32C of each key's bytes (its pieces,
    in order)."""
    plan = windows(pieces, sizes)
    devices = {piece.target.device for piece in pieces}
    pinned = _pinned(list(devices))
    free = [Held(block(pinned)) for _ in range(min(BLOCKS, max(1, len(plan))))]
    copies = Copies()
    readers = Readers(paths, queue_depth)

    def read_window(window: Window, held: Held) -> tuple[int, list[int]]:
        """Bytes read, and with `checksums` each piece's CRC, taken in this
        thread while the bytes just read are still in the cache (taken later,
        by another thread, they come from memory again, and the block waits)."""
        held.wait()  # the copies out of its last window have run
        got = readers.read(window, held.block)
        if not checksums or got < window.length:
            return got, []
        data = held.block.numpy()
        return got, [crc32c(data[p.begin - window.begin : p.end - window.begin])
                     for p in window.pieces]  # fmt: skip

    # Each key's pieces in file order: (length, CRC-32C).
    parts: dict[int, list[tuple[int, int]]] = {}
    reading: deque[tuple[Window, Held, Future[tuple[int, list[int]]]]] = deque()
    with ThreadPoolExecutor(load_readers(), thread_name_prefix="pyinit-checkpoint-read") as pool:
        try:
            upcoming = iter(plan)

            def start_reads() -> None:
                while free:
                    window = next(upcoming, None)
                    if window is None:
                        return
                    held = free.pop()
                    reading.append((window, held, pool.submit(read_window, window, held)))

            start_reads()
            while reading:
                window, held, future = reading.popleft()
                got, crcs = future.result()
                if got < window.length:
                    # As the reader says it of a batch: ENODATA with the path.
                    raise OSError(errno.ENODATA, f"read {got} of {window.length} bytes at "
                                  f"{window.begin} (the file shrank since it was opened)",
                                  paths[window.file])  # fmt: skip
                if checksums:
                    for piece, crc in zip(window.pieces, crcs, strict=True):
                        parts.setdefault(piece.key, []).append((piece.end - piece.begin, crc))
                streams = set()
                for piece in window.pieces:
                    offset = piece.begin - window.begin
                    source = held.block[offset : offset + piece.end - piece.begin]
                    target = piece.target[piece.at : piece.at + piece.end - piece.begin]
                    stream = copies.copy(target, source)
                    if stream is not None:
                        streams.add(stream)
                mark(held, streams)
                free.append(held)
                start_reads()
            copies.synchronize()
        finally:
            for _, _, future in reading:
                future.cancel()
            pool.shutdown(wait=True)
            readers.close()
    return {key: combined(pieces) for key, pieces in parts.items()}


def combined(pieces: Iterable[tuple[int, int]]) -> int:
    """The CRC-32C of consecutive pieces, from (length, CRC) of each in order."""
    crc = 0
    for length, piece in pieces:
        crc = crc32c_combine(crc, piece, length)
    return crc


# ---------------------------------------------------------------------------
# Saves


def drain(tensors: Sequence[torch.Tensor], write: Callable[[np.ndarray], int]) -> list[int]:
    """Hands the bytes of `tensors`, in order, to ``write`` (a DirectWriter's:
    it returns the CRC-32C of what it took) through the blocks: the copies
    into the next blocks run while a full one is written. Returns each
    tensor's CRC-32C."""
    flats = [flat_bytes(t) for t in tensors]
    pinned = _pinned([f.device for f in flats if f.numel()])
    copies = Copies()
    free = deque(Held(block(pinned)) for _ in range(BLOCKS))
    # Full blocks, oldest first, with the parts of tensors each holds: (tensor, begin, end).
    full: deque[tuple[Held, list[tuple[int, int, int]]]] = deque()
    crcs = [0] * len(flats)

    def write_oldest() -> None:
        held, parts = full.popleft()
        held.wait()
        data = held.block.numpy()
        for index, begin, end in parts:
            crcs[index] = crc32c_combine(crcs[index], write(data[begin:end]), end - begin)
        free.append(held)

    current: Held | None = None
    parts: list[tuple[int, int, int]] = []
    used = 0
    streams: set[torch.cuda.Stream] = set()
    for index, flat in enumerate(flats):
        at = 0
        while at < flat.numel():
            if current is None:
                if not free:
                    write_oldest()
                current, parts, used, streams = free.popleft(), [], 0, set()
            n = min(flat.numel() - at, BLOCK_BYTES - used)
            stream = copies.copy(current.block[used : used + n], flat[at : at + n])
            if stream is not None:
                streams.add(stream)
            parts.append((index, used, used + n))
            used += n
            at += n
            if used == BLOCK_BYTES:
                mark(current, streams)
                full.append((current, parts))
                current = None
    if current is not None and parts:
        mark(current, streams)
        full.append((current, parts))
    while full:
        write_oldest()
    return crcs


def pieces_of(entries: Iterable[tuple[int, int, int, torch.Tensor]]) -> list[Piece]:
    """Pieces from (file, begin, end, target tensor) of whole tensors, keyed
    by their place in `entries`."""
    return [Piece(file, begin, end, flat_bytes(target), 0, key)
            for key, (file, begin, end, target) in enumerate(entries) if end > begin]  # fmt: skip
