"""CPU loads straight into the tensors' memory: no staging block, no second
copy of any byte.

The wanted bytes of each file, in stretches with gaps of at most ``GAP``, are
read into one page-aligned allocation per stretch, and every tensor is a view
of its stretch (a copy only for a tensor whose offset does not suit its type,
which no file ``save`` or the safetensors library writes has). A stretch's
memory is freed with the last of its tensors.

Reads are windows of ``staging.BLOCK_BYTES``, ``READERS`` in flight, each its
reader's queue deep. A window's CRCs run in pool threads as soon as it has
arrived, while the next windows are read: the thread that waits for the
reads never checksums.

A file on a loop device that reads its backing file through the page cache
(the loop's own direct IO off: ``losetup`` without ``--direct-io=on``, a
container's image as most runtimes mount it) is not read with O_DIRECT: that
bypasses only the upper cache, and the loop's worker turns each request into
a buffered read of the backing file, one at a time, without readahead. Its
stretches are the page cache's own pages, mapped privately (a tensor written
to gets its own copy of that page; the file never changes) and faulted in by
the reader threads: the page cache holds a copy already, and reading it into
fresh memory would make a second one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from pyinit.checkpoint import staging
from pyinit.checkpoint.format import Entry
from pyinit.io import aligned_empty, crc32c, map_file, populate

GAP = 1 << 20  # unwanted bytes read rather than start another stretch
PAGE = os.sysconf("SC_PAGESIZE")  # a mapping's offset unit
# Reads in flight, each its reader's queue deep: the bytes land in the tensors,
# so more readers cost no host memory. From the page cache (the pipeline's own
# ceiling) an H200 host loaded 5.4 GB/s with 2, 11.0 with 4; from its disk the
# same 2.2-2.3 with either.
READERS = 4
# CRC-32C runs at 10-13 GB/s a core on data in memory: two stay ahead. Here, unlike a
# device load's (staging), the readers' own threads taking the CRCs was slower: on an
# H200 host from the page cache, 7.6 GB/s against 9.5 with the two pool threads.
CRC_THREADS = 2


@dataclass
class Stretch:
    """Aligned bytes [begin, end) of file `file`, read into `memory`, holding
    `entries` (numbered `keys` among the load's tensors)."""

    file: int
    begin: int
    end: int
    entries: list[Entry]
    keys: list[int]
    memory: np.ndarray | None = None


def stretches(chosen: Sequence[Sequence[Entry]], sizes: Sequence[int]) -> list[Stretch]:
    """The aligned stretches that cover every chosen entry, file by file."""
    found: list[Stretch] = []
    key = 0
    for file, entries in enumerate(chosen):
        numbered = sorted(
            zip(entries, range(key, key + len(entries)), strict=True), key=lambda e: e[0].begin
        )
        key += len(entries)
        current: Stretch | None = None
        for entry, number in numbered:
            if entry.end == entry.begin:
                continue
            low, high = staging.aligned_range(entry.begin, entry.end, sizes[file])
            if current is not None and low <= current.end + GAP:
                current.end = max(current.end, high)
                current.entries.append(entry)
                current.keys.append(number)
            else:
                current = Stretch(file, low, high, [entry], [number])
                found.append(current)
    return found


def page_cache_backed(path: str) -> bool:
    """Whether `path` lies on a loop device (or a partition of one) that
    reads its backing file through the page cache."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return False
    block = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    for loop in (f"{block}/loop", f"{block}/../loop"):
        try:
            with open(f"{loop}/dio") as text:
                return text.read().strip() == "0"
        except OSError:
            continue
    return False


def _map(paths: Sequence[str], stretch: Stretch) -> None:
    """`stretch.memory`: its bytes as a view of a private mapping of its file
    (from the page that holds its first byte)."""
    start = stretch.begin - stretch.begin % PAGE
    mapping = map_file(paths[stretch.file], start, stretch.end - start)
    stretch.memory = mapping[stretch.begin - start :]


def fill(
    paths: Sequence[str],
    sizes: Sequence[int],
    chosen: Sequence[Sequence[Entry]],
    checksums: bool,
    queue_depth: int,
) -> tuple[list[torch.Tensor], dict[int, int]]:
    """Every chosen entry as a CPU tensor (in the order of `chosen`, file by
    file), and with `checksums` the CRC-32C of each one's bytes by its number."""
    plan = stretches(chosen, sizes)
    cached = [page_cache_backed(path) for path in paths]
    direct = staging.Readers(paths, queue_depth)

    def read(stretch: Stretch, begin: int, end: int) -> int:
        assert stretch.memory is not None
        if cached[stretch.file]:  # mapped: its pages are faulted in, not read
            populate(stretch.memory[begin - stretch.begin : end - stretch.begin])
            return end - begin
        destination = stretch.memory[
            begin - stretch.begin : staging.whole_pages(end - stretch.begin)
        ]
        return direct.read_into(stretch.file, destination, begin)

    parts: dict[int, list[tuple[int, Future[int]]]] = {}
    try:
        windows = []
        for stretch in plan:
            if cached[stretch.file]:
                _map(paths, stretch)
            else:
                # Whole pages, so the last window's read goes straight in too.
                stretch.memory = aligned_empty(staging.whole_pages(stretch.end - stretch.begin))
            for at in range(stretch.begin, stretch.end, staging.BLOCK_BYTES):
                windows.append((stretch, at, min(at + staging.BLOCK_BYTES, stretch.end)))
        with (
            ThreadPoolExecutor(READERS, thread_name_prefix="pyinit-ckpt-read") as reads,
            ThreadPoolExecutor(CRC_THREADS, thread_name_prefix="pyinit-ckpt-crc") as crcs,
        ):
            pending = [(w, reads.submit(read, *w)) for w in windows]
            try:
                for (stretch, begin, end), future in pending:
                    got = future.result()
                    if got < end - begin:
                        raise OSError(errno.ENODATA, f"read {got} of {end - begin} bytes at "
                                      f"{begin} (the file shrank since it was opened)",
                                      paths[stretch.file])  # fmt: skip
                    if checksums:
                        _checksum_window(stretch, begin, end, crcs.submit, parts)
            except BaseException:
                for _, future in pending:  # the reads not yet started: none is wanted now
                    future.cancel()
                raise
    finally:
        direct.close()
    tensors = _views(plan, [entry for entries in chosen for entry in entries])
    return tensors, {key: staging.combined((length, crc.result()) for length, crc in pieces)
                     for key, pieces in parts.items()}  # fmt: skip


def _checksum_window(stretch: Stretch, begin: int, end: int,
                     submit: Callable[..., Future[int]],
                     parts: dict[int, list[tuple[int, Future[int]]]]) -> None:  # fmt: skip
    """Hands the CRC of each entry's bytes inside [begin, end) to the pool,
    in file order per entry."""
    assert stretch.memory is not None
    for entry, key in zip(stretch.entries, stretch.keys, strict=True):
        low, high = max(entry.begin, begin), min(entry.end, end)
        if low < high:
            data = stretch.memory[low - stretch.begin : high - stretch.begin]
            parts.setdefault(key, []).append((high - low, submit(crc32c, data)))


def _views(plan: list[Stretch], entries: list[Entry]) -> list[torch.Tensor]:
    """Each entry's tensor: a view of its stretch, or empty where it has no bytes."""
    tensors: list[torch.Tensor | None] = [None] * len(entries)
    for stretch in plan:
        assert stretch.memory is not None
        memory = torch.from_numpy(stretch.memory)
        for entry, key in zip(stretch.entries, stretch.keys, strict=True):
            raw = memory[entry.begin - stretch.begin : entry.end - stretch.begin]
            size = torch.empty((), dtype=entry.dtype).element_size()
            if (entry.begin - stretch.begin) % size == 0:
                tensors[key] = raw.view(entry.dtype).view(entry.shape)
            else:  # a type's view must start on its own size
                tensors[key] = raw.clone().view(entry.dtype).view(entry.shape)
        stretch.memory = None  # the tensors hold it now
    return [t if t is not None else torch.empty(e.shape, dtype=e.dtype)
            for t, e in zip(tensors, entries, strict=True)]  # fmt: skip
