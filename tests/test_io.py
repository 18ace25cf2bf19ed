"""pyinit.io.DirectReader against plain reads: files on the root filesystem,
a loop block device opened raw, a filesystem without O_DIRECT, both backends,
forked and spawned DataLoader workers, and the error paths."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import resident
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyinit.bench.io import loop_device_over
from pyinit.io import DirectIOUnavailable, DirectReader

SIZE = (4 << 20) + 777  # not a multiple of any block size
BACKENDS = ["io_uring", "pread"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> tuple[Path, bytes]:
    # /var/tmp is on the root filesystem (ext4 here), where O_DIRECT works; /tmp may be tmpfs.
    folder = Path("/var/tmp") / f"pyinit-io-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    path = folder / "data.bin"
    content = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(content)
    yield path, content
    shutil.rmtree(folder)


@pytest.fixture(params=BACKENDS)
def reader(request, data_file):
    with DirectReader(data_file[0], queue_depth=16, backend=request.param) as r:
        yield r


def test_properties(reader, data_file):
    assert reader.direct and reader.size == SIZE
    assert reader.backend in BACKENDS and reader.block_size in (512, 1024, 2048, 4096)
    assert reader.path == str(data_file[0])


FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the reader fixture is reused on purpose


@settings(max_examples=1500, deadline=None, suppress_health_check=FIXTURE_OK)
@given(offset=st.integers(0, SIZE + 5000), length=st.integers(0, 70_000), skew=st.integers(0, 63))
def test_read_and_read_into_match_plain_reads(reader, data_file, offset, length, skew):
    content = data_file[1]
    expected = content[offset : offset + length]
    got = reader.read(offset, length)
    assert got.dtype == np.uint8 and got.base is not None  # owns its memory through its base
    assert got.tobytes() == expected
    # read_into a buffer that starts `skew` bytes into an allocation: misaligned on purpose
    backing = np.zeros(length + 64, dtype=np.uint8)
    target = backing[skew : skew + length]
    assert reader.read_into(target, offset) == len(expected)
    assert target[: len(expected)].tobytes() == expected


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    offsets=st.lists(st.integers(0, SIZE - 8192), min_size=0, max_size=80),
    length=st.sampled_from([1, 4096, 2049 * 2, 8192]),
)
def test_read_batch_rows(reader, data_file, offsets, length):
    rows = reader.read_batch(np.array(offsets, dtype=np.int64), length)
    assert rows.shape == (len(offsets), length)
    for row, offset in zip(rows, offsets, strict=True):
        assert row.tobytes() == data_file[1][offset : offset + length]


def test_async_batches_arrive_in_order_with_the_queue_shared(reader, data_file):
    content = data_file[1]
    rng = np.random.default_rng(3)
    # More rows in flight than the queue is deep (16), misaligned ones included.
    batches = [(rng.integers(0, SIZE - 9000, 40), int(length)) for length in (4096, 4097, 8192)]
    pending = [reader.read_batch_async(offsets, length) for offsets, length in batches]
    assert reader.batches_pending == 3
    with pytest.raises(ValueError, match="in the order they were submitted"):
        pending[1].result()
    for (offsets, length), batch in zip(batches, pending, strict=True):
        rows = batch.result()
        assert rows.shape == (len(offsets), length)
        for row, offset in zip(rows, offsets, strict=True):
            assert row.tobytes() == content[offset : offset + length]
    assert batch.result() is rows  # a second result() is the same array
    # Another call lets the batches in flight arrive first; they stay to be waited for.
    last = reader.read_batch_async([0, 4096], 4096)
    assert reader.read(10, 5).tobytes() == content[10:15]
    assert reader.batches_pending == 1 and last.result()[1].tobytes() == content[4096:8192]
    with pytest.raises(ValueError, match="no such batch in flight"):
        reader._wait_batch(10**6, 1, 1)


def test_an_async_batch_past_the_end_is_refused_and_a_closed_reader_drops_them(data_file):
    with DirectReader(data_file[0]) as r:
        with pytest.raises(ValueError):
            r.read_batch_async([SIZE - 10], 4096)
        pending = r.read_batch_async([0, 8192], 4096)
    with pytest.raises(ValueError, match="closed reader"):
        pending.result()
    # A forked child does not inherit the parent's reads in flight.
    with DirectReader(data_file[0]) as r:
        pending = r.read_batch_async([0, 8192], 4096)
        child = os.fork()
        if child == 0:
            try:
                pending.result()
                os._exit(1)
            except ValueError as e:
                os._exit(0 if "no such batch in flight" in str(e) else 2)
            finally:
                os._exit(3)
        assert os.waitpid(child, 0)[1] == 0
        assert pending.result()[1].tobytes() == data_file[1][8192 : 8192 + 4096]


def test_end_of_file_edges(reader, data_file):
    content = data_file[1]
    assert reader.read(SIZE - 10, 100).tobytes() == content[-10:]  # short tail
    assert reader.read(SIZE, 100).size == 0  # at EOF
    assert reader.read(SIZE + 4096, 1).size == 0  # past EOF
    assert reader.read(123, 0).size == 0
    assert reader.read_into(bytearray(0), 5) == 0
    whole = reader.read(0, SIZE + 1)
    assert whole.tobytes() == content
    with pytest.raises(ValueError, match="ends past the end of the file"):
        reader.read_batch([SIZE - 100], 101)


def test_bad_arguments(reader):
    with pytest.raises(ValueError, match="offset must be from 0 to"):
        reader.read(-1, 10)
    with pytest.raises(ValueError, match="length must be from 0 to"):
        reader.read(0, -10)
    with pytest.raises(ValueError, match="overflows"):
        reader.read(2**63 - 1, 2)
    assert reader.read(10, 2**50).size == SIZE - 10  # no more than the file holds
    with pytest.raises(BufferError):
        reader.read_into(b"read-only", 0)
    with pytest.raises(ValueError, match="one-dimensional"):
        reader.read_batch([[0, 1]], 10)
    with pytest.raises(ValueError, match="queue_depth"):
        DirectReader(reader.path, queue_depth=0)
    with pytest.raises(ValueError, match="backend must be"):
        DirectReader(reader.path, backend="aio")
    reader.close()
    assert reader.closed
    with pytest.raises(ValueError, match="closed"):
        reader.read(0, 1)
    reader.close()  # twice is fine


def test_os_errors_are_the_right_subclass(tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        DirectReader(tmp_path / "nope")
    assert missing.value.filename == str(tmp_path / "nope")
    with pytest.raises(IsADirectoryError):
        DirectReader(tmp_path)
    # Not a file one can read at offsets: bad input, named, never a wait for a writer.
    os.mkfifo(tmp_path / "fifo")
    for path, kind in ((tmp_path / "fifo", "a FIFO or pipe"), ("/dev/null", "a character device")):
        with pytest.raises(ValueError) as other:
            DirectReader(path, queue_depth=1)
        assert str(other.value) == f"{path}: {kind}, not a file or block device to read"


def test_permission_denied_unprivileged(data_file, tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to another user (CI runs as root)")
    secret = Path("/var/tmp") / f"pyinit-secret-{os.getpid()}"
    secret.write_bytes(b"x" * 4096)
    secret.chmod(0o600)
    code = (
        "from pyinit.io import DirectReader\n"
        "try:\n"
        f"    DirectReader({str(secret)!r})\n"
        "except PermissionError as e:\n"
        "    print('PermissionError', e.filename)\n"
    )
    try:
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-c", code],
            capture_output=True, text=True, cwd="/", timeout=60,
        )  # fmt: skip
    finally:
        secret.unlink()
    assert proc.stdout.strip() == f"PermissionError {secret}", proc.stderr


def test_no_descriptor_leak(data_file):
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(300):
        with DirectReader(data_file[0], queue_depth=4, backend=BACKENDS[i % 2]) as r:
            r.read(i * 100, 10)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_truncated_while_open_gives_short_reads(tmp_path_factory):
    path = Path("/var/tmp") / f"pyinit-trunc-{os.getpid()}.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    try:
        with DirectReader(path) as r:
            os.truncate(path, 100_000)
            assert r.read(500_000, 4096).size == 0
            assert r.read(99_000, 4096).size == 1000
            # Windows are checked against the size at open (no stat per batch); a
            # file that shrank since shows as a short read, with its path.
            with pytest.raises(OSError, match="shrank since it was opened") as shrank:
                r.read_batch([200_000], 10)
            assert shrank.value.filename.startswith(str(path))
            with pytest.raises(ValueError, match="ends past the end"):
                r.read_batch([2_000_000], 10)
    finally:
        path.unlink()


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_batch_across_files_and_from_the_page_cache(data_file, backend):
    path, content = data_file
    second = path.with_name("reversed.bin")
    second.write_bytes(content[::-1])
    sources = [content, content[::-1]]
    offsets = np.array([0, 4096, 777, SIZE - 2050, 12_345])
    files = np.array([1, 0, 1, 0, 1])
    try:
        with resident(path, second), DirectReader([path, second], backend=backend,
                                                  page_cache=True) as r:  # fmt: skip
            assert r.paths == [str(path), str(second)] and r.sizes == [SIZE, SIZE]
            rows = r.read_batch(offsets, 2050, files=files)
            stats = r.stats()
            clone = pickle.loads(pickle.dumps(r))
            with clone:
                assert clone.page_cache and np.array_equal(
                    clone.read_batch(offsets, 2050, files=files), rows
                )
            with pytest.raises(ValueError, match=r"holds 2 files: use \.paths"):
                _ = r.path
            with pytest.raises(ValueError, match="out of range: the reader holds 2 files"):
                r.read_batch([0], 10, files=[2])
            with pytest.raises(ValueError, match="one index per offset"):
                r.read_batch([0, 1], 10, files=[0])
        for row, offset, file in zip(rows, offsets, files, strict=True):
            assert row.tobytes() == sources[file][offset : offset + 2050]
        assert stats["page_cache_reads"] == len(offsets) and stats["ios"] == 0
        # The same rows without page_cache go to the device.
        with DirectReader([path, second], backend=backend) as r:
            assert np.array_equal(r.read_batch(offsets, 2050, files=files), rows)
            assert r.stats()["page_cache_reads"] == 0 and r.stats()["ios"] >= len(offsets)
    finally:
        second.unlink()


def test_stats_count_reads_bytes_and_latency(data_file):
    with DirectReader(data_file[0], backend="pread") as r:
        r.read(0, 10)
        r.read_batch([0, 8192, 16384], 4096)
        stats = r.stats()
    assert stats["reads"] == 4 and stats["bytes"] == 10 + 3 * 4096
    assert stats["ios"] == 4
    latency = stats["io_latency_us"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
    assert sum(count for _, count in stats["io_latency_histogram_ns"]) == 4


def test_threads_share_a_reader(data_file):
    # An io_uring ring serves one thread; a call from another builds it its own.
    import threading

    content = data_file[1]
    errors = []
    with DirectReader(data_file[0], queue_depth=8, backend="io_uring") as r:

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for offset in rng.integers(0, SIZE - 5000, 200).tolist():
                if r.read(offset, 5000).tobytes() != content[offset : offset + 5000]:
                    errors.append(offset)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert r.stats()["reads"] == 600
    assert errors == []


def test_fork_and_pickle(data_file):
    content = data_file[1]
    with DirectReader(data_file[0]) as r:
        assert r.read(0, 4).tobytes() == content[:4]
        pid = os.fork()
        if pid == 0:  # the child builds its own ring on first use
            ok = r.read(5000, 3000).tobytes() == content[5000:8000]
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert r.read(9, 3).tobytes() == content[9:12]
        clone = pickle.loads(pickle.dumps(r))
    with clone:
        assert clone.read(100, 50).tobytes() == content[100:150]
        assert clone.queue_depth == 32 and clone.backend == r.backend


# The plain calls: memory from the pool, registered with the ring.


@pytest.mark.parametrize("backend", BACKENDS)
def test_ten_thousand_random_ranges(data_file, backend):
    content = data_file[1]
    rng = np.random.default_rng(7)
    with DirectReader(data_file[0], backend=backend) as r:
        for offset, length in zip(
            rng.integers(0, SIZE, 10_000).tolist(),
            rng.integers(0, 20_000, 10_000).tolist(),
            strict=True,
        ):
            assert r.read(offset, length).tobytes() == content[offset : offset + length]
        if backend == "io_uring":  # every read went into a registered block
            assert r.stats()["fixed_ios"] == r.stats()["ios"] > 0


def test_the_pool_takes_arrays_back_and_resident_memory_stays_flat(data_file):
    from pyinit.io import memory_stats

    def resident_bytes() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    with DirectReader(data_file[0]) as r:
        first = r.read(0, 4096)
        address = first.ctypes.data
        in_use = memory_stats()["blocks_in_use"]
        del first  # back to the pool: the next read of that size gets the same block
        again = r.read(8192, 4096)
        assert again.ctypes.data == address
        assert memory_stats()["blocks_in_use"] == in_use
        del again
        rows = r.read_batch(np.arange(32) * 4096, 4096)
        assert rows.ctypes.data % 4096 == 0
        del rows
        rng = np.random.default_rng(3)
        offsets = (rng.integers(0, SIZE // 4096, 110_000) * 4096).tolist()
        for offset in offsets[:10_000]:
            r.read(offset, 4096)
        before = resident_bytes()
        for offset in offsets[10_000:]:
            r.read(offset, 4096)
        grown = resident_bytes() - before
    assert grown < 4 << 20, f"resident memory grew {grown} bytes over 100,000 reads"


def test_memory_the_reader_does_not_own_keeps_the_plain_path(data_file):
    content = data_file[1]
    with DirectReader(data_file[0], backend="io_uring") as r:
        import mmap

        foreign = mmap.mmap(-1, 8192)  # page-aligned, so read straight into, but not ours
        assert r.read_into(foreign, 4096) == 8192 and foreign[:] == content[4096 : 4096 + 8192]
        assert r.stats()["fixed_ios"] == 0  # pinned per read, as before
        from pyinit.io import aligned_empty

        ours = aligned_empty(8192)
        r.read_into(ours, 4096)
        assert r.stats()["fixed_ios"] == 1 and ours.tobytes() == content[4096 : 4096 + 8192]


def test_a_freed_buffer_is_never_read_into_through_its_old_registration(data_file):
    # A block of its own (over 4 MiB) is unmapped when its array dies; the next
    # one of that size lands at the same address. The ring registered the first:
    # were the registration found by address, the reads would go to its pinned
    # old pages and the new array would never see the data.
    from pyinit.io import aligned_empty, memory_stats

    content = data_file[1]
    size = 6 << 20
    with DirectReader(data_file[0], backend="io_uring") as r:
        first = aligned_empty(size)
        assert r.read_into(first, 0) == SIZE  # the second of its IOs registers it
        assert r.stats()["fixed_ios"] > 0 and first[:SIZE].tobytes() == content
        address = first.ctypes.data
        retired = memory_stats()["regions_retired"]
        del first
        assert memory_stats()["regions_retired"] == retired + 1
        second = aligned_empty(size)
        assert second.ctypes.data == address, "the kernel placed the new mapping elsewhere"
        second.fill(0)
        got = r.read_into(second[: 4 << 20], 8192)  # aligned: straight into the array
        assert got == SIZE - 8192 and second[:got].tobytes() == content[8192:]


def test_arrays_made_before_fork_work_in_the_child(data_file):
    from pyinit.io import aligned_empty

    content = data_file[1]
    with DirectReader(data_file[0]) as r:
        shared = aligned_empty(1 << 20)
        r.read_into(shared, 0)
        pid = os.fork()
        if pid == 0:  # the pool is not MADV_DONTFORK: the parent's arrays are here
            ok = shared.tobytes() == content[: 1 << 20]
            r.read_into(shared, 1 << 20)
            ok = ok and shared.tobytes() == content[1 << 20 : 2 << 20]
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert shared.tobytes() == content[: 1 << 20]  # the child's reads stayed there


# Streams: the queue kept full across iterations.


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_yields_every_row_once_in_order(data_file, backend):
    content = data_file[1]
    rng = np.random.default_rng(11)
    offsets = rng.integers(0, SIZE - 3000, 1000)
    with DirectReader(data_file[0], queue_depth=8, backend=backend) as r:
        rows = [row.tobytes() for row in r.stream(offsets, 3000, depth=16)]
        assert rows == [content[o : o + 3000] for o in offsets]
        # Batches: the last one holds the rest.
        batches = list(r.stream(offsets, 3000, batch=64))
        assert [len(b) for b in batches] == [64] * 15 + [40]
        assert np.concatenate(batches).tobytes() == b"".join(rows)
        # Aligned rows go straight into their blocks; one stream covers many files.
        aligned = np.arange(0, SIZE - (1 << 20), 1 << 20)
        big = [row.tobytes() for row in r.stream(aligned, 1 << 20, depth=4)]
        assert big == [content[o : o + (1 << 20)] for o in aligned]
        assert list(r.stream([], 10)) == []
        with pytest.raises(ValueError, match="ends past the end"):
            r.stream([SIZE - 5], 10)
        with pytest.raises(ValueError, match="depth must be from 1"):
            r.stream([0], 10, depth=0)
        with pytest.raises(ValueError, match="batch must be >= 1"):
            r.stream([0], 10, batch=0)


def test_stream_across_files_and_the_page_cache(data_file):
    path, content = data_file
    second = path.with_name("stream-reversed.bin")
    second.write_bytes(content[::-1])
    try:
        offsets, files = np.array([5, 9000, 70_000, 3]), np.array([1, 0, 1, 0])
        with resident(path, second), DirectReader([path, second], page_cache=True) as r:
            stream = r.stream(offsets, 2050, files=files)
            rows = list(stream)
            assert stream.stats()["page_cache_reads"] == 4
        sources = [content, content[::-1]]
        for row, offset, file in zip(rows, offsets, files, strict=True):
            assert row.tobytes() == sources[file][offset : offset + 2050]
    finally:
        second.unlink()


@pytest.mark.parametrize("batch", [None, 16])
def test_a_stream_of_cached_rows_copies_only_a_few_ahead(data_file, batch):
    # Rows from the page cache are copied as the stream plans them, and they
    # add no IO to the queue that bounds the planning: the whole stream (4 MiB
    # of rows here, 119 MB of the example's data set) was once copied before
    # its first row came back.
    path, content = data_file
    offsets = np.arange(0, SIZE - 64, 64)
    depth = 8
    with resident(path), DirectReader(path, page_cache=True) as r:
        stream = r.stream(offsets, 64, depth=depth, batch=batch)
        first = next(stream)
        # Twice the depth in reads ahead, up to eight times: a cached row counts as one.
        assert 0 < stream.stats()["page_cache_reads"] <= 8 * depth + (batch or 1)
        rest = list(stream)
        assert stream.stats()["page_cache_reads"] == len(offsets) and stream.stats()["ios"] == 0
    got = np.concatenate([np.asarray(first).reshape(-1, 64)]
                         + [np.asarray(row).reshape(-1, 64) for row in rest])  # fmt: skip
    assert got.tobytes() == content[: len(offsets) * 64]


def test_leaving_a_stream_early_leaves_nothing_in_flight(data_file):
    from pyinit.io import memory_stats

    fds = len(os.listdir("/proc/self/fd"))
    in_use = memory_stats()["blocks_in_use"]
    content = data_file[1]
    with DirectReader(data_file[0]) as r:
        stream = r.stream(np.arange(0, 3 << 20, 4096), 4096, depth=32)
        for i, row in enumerate(stream):
            assert row.tobytes() == content[i * 4096 : (i + 1) * 4096]
            if i == 2:
                break
        assert stream.remaining == (3 << 20) // 4096 - 3 and not stream.closed
        stream.close()  # waits for the 32 reads it had in flight, frees the rows ahead
        assert stream.closed and stream.stats()["reads"] == 3
        # The reader's stats take in its streams' once they close.
        assert r.stats()["reads"] == 3 and r.stats()["ios"] == stream.stats()["ios"] >= 3
        with pytest.raises(ValueError, match="closed stream"):
            next(stream)
        # A stream dropped mid-way without close() does the same when it dies.
        dropped = r.stream(np.arange(0, 3 << 20, 4096), 4096, depth=32)
        next(dropped)
        del dropped, row
    assert memory_stats()["blocks_in_use"] == in_use
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_stream_dropped_in_another_thread_leaves_its_reads_their_memory(data_file):
    # Its ring serves only the thread that made it, so another cannot wait for the
    # reads in flight: the rows ahead stay theirs (not back in the pool, to be
    # reused while the kernel may still write into them). When every read it
    # submitted had landed before the close (the disk answered within next()),
    # nothing is in flight and all of them go back; so close until one finds
    # reads in flight, which on this VM is most of the time.
    import threading

    from pyinit.io import memory_stats

    rows = np.arange(0, 4 << 20, 4096)
    with DirectReader(data_file[0], backend="io_uring") as r:
        for _ in range(40):
            before = memory_stats()["blocks_in_use"]
            stream = r.stream(rows, 4096, depth=32)
            next(stream)
            in_use = memory_stats()["blocks_in_use"]
            worker = threading.Thread(target=stream.close)
            worker.start()
            worker.join()
            assert stream.closed
            after = memory_stats()["blocks_in_use"]
            assert after in (in_use, before), (before, in_use, after)  # all kept, or all back
            if after == in_use:
                break
        else:
            pytest.fail("40 closes from another thread never found a read in flight")
        # From its own thread, the same close waits and gives every block back.
        again = r.stream(rows, 4096, depth=32)
        next(again)
        in_use = memory_stats()["blocks_in_use"]
        again.close()
        assert memory_stats()["blocks_in_use"] < in_use - 32


def test_a_stream_outlives_its_reader_and_stays_in_its_thread(data_file):
    import threading

    content = data_file[1]
    r = DirectReader(data_file[0], backend="io_uring")
    stream = r.stream([0, 4096, 8192], 100)
    r.close()  # the stream holds its own descriptors
    assert next(stream).tobytes() == content[:100]
    errors = []

    def elsewhere() -> None:
        try:
            next(stream)
        except ValueError as error:
            errors.append(str(error))

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert errors and "thread that made it" in errors[0]
    assert next(stream).tobytes() == content[4096:4196]


class Windows:
    """A map-style dataset of 4099-byte windows (module level: spawn pickles it)."""

    def __init__(self, reader: DirectReader):
        self.reader = reader

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import torch

        return torch.from_numpy(self.reader.read(i * 4099, 4099))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(data_file, context):
    torch = pytest.importorskip("torch", reason="torch is installed by the test command")
    from torch.utils.data import DataLoader

    reader = DirectReader(data_file[0])  # made before the workers start
    workers = {"num_workers": 2, "multiprocessing_context": context}
    loader = DataLoader(Windows(reader), batch_size=8, **workers)
    got = torch.cat(list(loader)).numpy().tobytes()
    assert got == b"".join(data_file[1][i * 4099 : (i + 1) * 4099] for i in range(64))
    reader.close()


# Needs root: a loop device, a ramfs mount, the io_uring sysctl.


def need_root(tool: str) -> None:
    if os.geteuid() != 0 or shutil.which(tool) is None:
        pytest.skip(f"needs root and {tool} (CI runs as root)")


@pytest.mark.root
def test_raw_loop_block_device(data_file):
    need_root("losetup")
    image = data_file[0].parent / "disk.img"
    content = data_file[1][: 4 << 20]
    image.write_bytes(content)
    try:
        with loop_device_over(image) as dev, DirectReader(dev) as r:
            assert r.size == 4 << 20 and r.direct
            assert r.block_size == int(
                Path(f"/sys/block/{Path(dev).name}/queue/logical_block_size").read_text()
            )
            assert r.read(1234, 5000).tobytes() == content[1234:6234]
            rows = r.read_batch([0, 4096, 1 << 20], 4096)
            assert rows[2].tobytes() == content[1 << 20 : (1 << 20) + 4096]
    finally:
        image.unlink()


@pytest.mark.root
def test_filesystem_without_o_direct_falls_back_and_says_so(tmp_path):
    need_root("mount")
    mount = tmp_path / "ramfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "none", str(mount)], check=True)
    try:
        (mount / "f.bin").write_bytes(b"abcdefgh" * 1000)
        with pytest.warns(DirectIOUnavailable, match="refuses O_DIRECT"):
            r = DirectReader(mount / "f.bin")
        with r:
            assert not r.direct
            assert r.read(3, 10).tobytes() == (b"abcdefgh" * 2)[3:13]
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# io_uring_setup refused with EPERM, as kernel.io_uring_disabled does to every
# process on the machine and a container's seccomp profile (Docker's since 25.0)
# does to the processes in it: a seccomp filter on this one process only.
REFUSE_IO_URING = """
import ctypes, errno
IO_URING_SETUP = 425  # the same number on x86_64 and aarch64
SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x00050000, 0x7FFF0000

class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]

class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

def refuse_io_uring():
    code = (Filter * 4)(
        Filter(0x20, 0, 0, 0),  # load the system call's number
        Filter(0x15, 0, 1, IO_URING_SETUP),  # io_uring_setup: the next, else the one after
        Filter(0x06, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        Filter(0x06, 0, 0, SECCOMP_RET_ALLOW))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    assert libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    program = Program(len(code), code)
    assert libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0, (
        ctypes.get_errno())
"""


def test_auto_falls_back_to_pread_when_io_uring_is_refused(data_file, tmp_path):
    path, data = data_file
    checks = f"""
import pytest
from pyinit.io import DirectReader, DirectWriter
early = DirectReader({str(path)!r})  # on io_uring, before it is refused
assert early.backend == "io_uring", early.backend
refuse_io_uring()
with DirectReader({str(path)!r}) as r:
    assert r.backend == "pread"
    assert "io_uring unavailable (EPERM)" in r.backend_note, r.backend_note
    assert r.read(0, 8).tobytes() == {data[:8]!r}
with pytest.raises(PermissionError):
    DirectReader({str(path)!r}, backend="io_uring")
# One choice for the reader, its streams and the writer: each falls back, saying so
# (a stream once raised, a writer fell back without a word).
stream = early.stream([0, 4096], 4096)
assert stream.backend == "pread" and "io_uring unavailable (EPERM)" in stream.backend_note
assert next(iter(stream)).tobytes() == {data[:4096]!r}
stream.close()
with DirectWriter({str(tmp_path / "w.bin")!r}) as w:
    w.write(b"x" * 10)
assert "io_uring unavailable (EPERM)" in w.note, w.note
early.close()
"""
    done = subprocess.run([sys.executable, "-c", REFUSE_IO_URING + checks], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.root
def test_io_benchmark_runs_beside_fio(tmp_path, pyinit_bin):
    need_root("losetup")
    out = tmp_path / "io.json"
    proc = subprocess.run(
        [pyinit_bin, "bench", "io", "--loop", "16M", "--loop-dir", "/var/tmp", "--runtime", "0.3",
         "--rounds", "1", "--out", tmp_path],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    table = json.loads(out.read_text())["table"]
    assert set(table) == {
        "4k-randread-qd1-read", "4k-randread-qd32-batch", "4k-randread-qd32-async",
        "4k-randread-qd32-stream", "1m-read-qd4-stream", "1m-read-qd16-stream",
    }  # fmt: skip
    tools = {"pyinit", "fio"} if shutil.which("fio") else {"pyinit"}
    for pattern in table.values():
        assert set(pattern) == tools
        assert all(v["iops"] > 0 and v["p50_us"] > 0 for v in pattern.values())
    assert ("ratio" in proc.stdout) == ("fio" in tools)
    assert "p99.99 us" in proc.stdout.splitlines()[0]
    # Each target beside fio's same pattern; a synchronous read_batch, which
    # drains the queue at every call, has none.
    said = json.loads(out.read_text())["targets"]
    expected = {
        "4k-randread-qd32-async IOPS / fio's", "4k-randread-qd32-async p50 / fio's",
        "4k-randread-qd32-stream IOPS / fio's", "4k-randread-qd32-stream p50 / fio's",
        "1m-read-qd4-stream GB/s / fio's",
    } if "fio" in tools else set()  # fmt: skip
    assert {row["target"] for row in said} == expected
    for row in said:
        verdict = "met" if row["met"] else "MISSED"
        sense = ">=" if row["at_least"] else "<="
        line = f"target {row['target']}: {row['ratio']:.2f}x ({sense} {row['need']}) {verdict}"
        assert proc.stdout.splitlines().count(line) == 1, proc.stdout


def test_io_targets_keep_each_rounds_ratio_range(capsys):
    """A target's verdict is the medians' ratio; beside it, the range of the
    rounds' own ratios (ours against fio's run of the same round), so a miss
    within a shared device's spread shows as one."""
    from pyinit.bench.io import PERCENTILES, Pattern, Result, fio_key, targets
    from pyinit.bench.targets import print_targets

    pattern = Pattern("randread", 4096, 32, "stream", 1)
    cuts = {fio_key(q): 100_000.0 for q in PERCENTILES}

    def run(tool: str, iops: float) -> Result:
        return Result(tool, pattern.name, iops, iops * 4096, "clat_ns", cuts, None)

    # Round by round, ours 0.90x, 1.05x and 0.98x of fio's.
    results = [run("pyinit", 90), run("fio", 100), run("fio", 100), run("pyinit", 105),
               run("pyinit", 49), run("fio", 50)]  # fmt: skip
    rows = {row["target"]: row for row in targets(results, [pattern])}
    iops = rows[f"{pattern.name} IOPS / fio's"]
    assert iops["ratio"] == 0.9 and not iops["met"]  # medians: 90 against 100
    assert iops["rounds"] == [0.9, 1.05]
    assert rows[f"{pattern.name} p50 / fio's"]["rounds"] == [1.0, 1.0]
    print_targets([iops])
    assert capsys.readouterr().out == (
        f"target {pattern.name} IOPS / fio's: 0.90x (>= 1.0) MISSED (rounds 0.90-1.05x)\n"
    )
    assert "rounds" not in targets(results[:2], [pattern])[0]  # one round: no range


@pytest.mark.root
def test_io_benchmark_counts_the_device_under_a_file_and_splits_by_littles_law(folder):
    """A file's reads are counted on the block device its filesystem lies on
    (here a loop device), none where there is no such device (procfs); a
    run's device columns are its mean time per read there and, by Little's
    law, its IOPS times that: the reads there on average."""
    from conftest import loop_filesystem

    from pyinit.bench.io import PERCENTILES, Result, column_values, disk_counters, fio_key

    with loop_filesystem(folder, 32) as mount:
        target = mount / "data.bin"
        target.write_bytes(os.urandom(1 << 20))
        os.sync()
        before = disk_counters(str(target))
        with DirectReader(str(target)) as reader:
            reader.read_batch(np.arange(0, 1 << 20, 64 << 10), 4096)  # 16 reads, apart
        after = disk_counters(str(target))
    assert after["read_ios"] - before["read_ios"] >= 16, (before, after)
    assert disk_counters("/proc/self/status") is None
    cuts = {fio_key(q): 1000.0 for q in PERCENTILES}
    # 2,000 reads that spent 64 s at the device in all: 32 ms each, at 1,000 a second.
    disk = {"read_ios": 2000, "read_merges": 0, "read_sectors": 16000, "read_ticks": 64_000}
    values = column_values(Result("fio", "p", 1000.0, 4096e3, "clat_ns", cuts, disk))
    assert values["dev_us"] == pytest.approx(32_000) and values["dev_qd"] == pytest.approx(32)
    assert "dev_qd" not in column_values(Result("fio", "p", 1000.0, 4096e3, "clat_ns", cuts, None))


def test_io_benchmark_of_a_file_whose_name_is_not_utf8(folder, pyinit_bin):
    """fio's JSON, the plot's title and the last line name the file: a name in
    another encoding is read back, drawn as \\xNN and printed as its bytes,
    also where the locale's handler is strict, where each was a bug's traceback."""
    named = Path(os.fsdecode(bytes(folder) + b"/caf\xe9"))
    named.mkdir()
    target = named / "data.bin"
    target.write_bytes(os.urandom(4 << 20))
    proc = subprocess.run(
        [pyinit_bin, "bench", "io", target, "--rw", "read", "--bs", "64k", "--iodepth", "2",
         "--runtime", "0.3", "--rounds", "1", "--out", named],
        capture_output=True, timeout=300, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    document = json.loads((named / "io.json").read_text())
    assert set(document["table"]["64k-read-qd2-stream"]) == (
        {"pyinit", "fio"} if shutil.which("fio") else {"pyinit"})  # fmt: skip
    assert proc.stdout.endswith(b"wrote " + bytes(named) + b"/io.json and " + bytes(named)
                                + b"/io.png\n"), proc.stdout[-300:]  # fmt: skip


@pytest.mark.root
@pytest.mark.parametrize(
    "knobs, name",
    [
        (
            ["--rw", "randread", "--bs", "8k", "--iodepth", "4", "--numjobs", "2"],
            "8k-randread-qd4-j2-stream",
        ),
        (["--rw", "read", "--bs", "64k", "--iodepth", "2", "--api", "batch"], "64k-read-qd2-batch"),
        (
            [
                "--rw",
                "randread",
                "--bs",
                "4k",
                "--iodepth",
                "8",
                "--numjobs",
                "2",
                "--api",
                "stream-batch",
            ],
            "4k-randread-qd8-j2-stream-batch",
        ),
    ],
)
def test_io_benchmark_fio_knobs_match_fios_own_job(tmp_path, pyinit_bin, knobs, name):
    """The same knobs give the same IO on the device for our reader and for
    fio: the loop device's own counters show reads of the block size each."""
    need_root("losetup")
    if not shutil.which("fio"):
        pytest.skip("fio is not installed: nothing to check the pattern against")
    out = tmp_path / "io.json"
    proc = subprocess.run(
        [pyinit_bin, "bench", "io", "--loop", "16M", "--loop-dir", "/var/tmp", "--runtime", "0.5",
         "--rounds", "1", *knobs, "--out", tmp_path],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert set(document["table"]) == {name}
    block = int(knobs[3].rstrip("k")) * 1024
    latency = "clat_ns"  # depth above 1: completion latency, fio's name
    for run in document["results"]:
        assert run["jobname"] == name
        read = run["read"]
        assert read["iops"] > 0 and read["bw_bytes"] == pytest.approx(read["iops"] * block)
        cuts = read[latency]["percentile"]
        assert list(cuts) == ["50.000000", "99.000000", "99.900000", "99.990000"]
        assert 0 < cuts["50.000000"] <= cuts["99.990000"]
        disk = run["disk_util"]
        # Every read reached the device as one request of the block size
        # (a few sequential neighbours may merge; random ones never do).
        assert disk["read_ios"] > 0
        assert disk["read_sectors"] * 512 == pytest.approx(
            (disk["read_ios"] + disk["read_merges"]) * block, rel=0.01
        )
        if knobs[1] == "randread":
            assert disk["read_merges"] <= disk["read_ios"] // 100
    for tool in document["table"][name].values():
        assert tool["dev_us"] > 0 and tool["dev_qd"] > 0


def test_map_file_refuses_bad_ranges_and_paths_by_name(tmp_path):
    from pyinit.io import map_file, populate

    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes: two pages and a half
    mapped = map_file(str(path), 4096, 6144)
    populate(mapped[100:])
    assert mapped[:3].tolist() == [0, 1, 2] and mapped.flags.writeable
    mapped[0] = 99  # private: the file keeps its byte
    assert path.read_bytes()[4096] == 0
    for offset, length in ((100, 10), (0, 0)):
        with pytest.raises(ValueError, match="multiple of the page size"):
            map_file(str(path), offset, length)
    with pytest.raises(ValueError, match="offset must be from 0"):
        map_file(str(path), -4096, 10)
    with pytest.raises(OSError, match=r"map bytes 8192 to 12288 \(past the file's end\)") as past:
        map_file(str(path), 8192, 4096)
    assert past.value.errno == errno.ENODATA and past.value.filename == str(path)
    with pytest.raises(FileNotFoundError) as missing:
        map_file(str(tmp_path / "gone"), 0, 1)
    assert missing.value.filename == str(tmp_path / "gone")
    with pytest.raises(OSError, match="map: No such device") as folder:  # not a file to map
        map_file(str(tmp_path), 0, 1)
    assert folder.value.errno == errno.ENODEV and folder.value.filename == str(tmp_path)
    with pytest.raises(ValueError, match="NUL"):
        map_file(str(path) + "\0x", 0, 1)
