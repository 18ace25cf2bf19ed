"""IO benchmark in fio's terms: the DirectReader against fio on the same target.

Our reader is used the plain way a data loader would use it (``--api``):
``read`` (one ``reader.read(offset, bs)`` per IO, each returning a new
array), ``batch`` (one ``reader.read_batch(offsets, bs)`` of iodepth rows per
call, a new array each), ``async`` (``reader.read_batch_async`` of iodepth
rows, the next batch submitted before this one's ``result()``, as a loader
that knows its next batch does) or ``stream`` (a loop over
``reader.stream(offsets, bs, depth=iodepth)``). With no pattern given, six
(fio's names): ``randread`` 4 KiB at depth 1 with read, at depth 32 with
batch, async and stream, and ``read`` (sequential) 1 MiB at depth 4 and 16
with stream; with fio's knobs
(--rw, --bs, --iodepth, --numjobs, --runtime, --api), that one pattern. For
each, our reader and ``fio --ioengine=io_uring --direct=1`` run alternately,
round by round, with the page cache dropped before every run. Reported: IOPS,
GB/s and latency p50/p99/p99.9/p99.99. With read our latency is the whole
Python call, against fio's total latency (``lat_ns``, submission included);
otherwise both are completion latency (``clat_ns``, submit to completion of
each IO). Where the target is, or lies on, a block device with counters in
sysfs, two more columns split a gap by Little's law: ``dev us``, the mean
time a read spent in the block layer and the device (its ``read_ticks`` over
its ``read_ios``), and ``dev qd``, the reads there on average (IOPS times
that). At the same ``dev qd`` a slower run's reads took longer at the device;
at the same ``dev us`` it kept fewer of them there. The counters are the
whole device's: other IO on it counts too. The JSON keeps fio's field names
for the shared figures (``iops``, ``bw_bytes``, ``lat_ns``/``clat_ns``
percentiles keyed "99.990000", and ``disk_util`` from the device's counters).

    pyinit bench io --loop 512M                # a loop device over a file, made and removed here
    pyinit bench io /dev/nvme0n1 --runtime 10  # an existing device or file, read only
    pyinit bench io /dev/nvme0n1 --rw randread --bs 8k --iodepth 64 --numjobs 4
    pyinit bench io /dev/nvme0n1 --rw read --bs 1m --iodepth 8 --api batch
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import multiprocessing
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pyinit import _native, argtypes
from pyinit.bench.targets import print_targets, ratio_target
from pyinit.errors import InputError
from pyinit.extras import note_missing
from pyinit.io import DirectReader
from pyinit.jsonfile import open_input, write_json
from pyinit.plotting import human_bytes, pyplot, save_figure

APIS = ("read", "batch", "async", "stream", "stream-batch")


@dataclass(frozen=True)
class Pattern:
    rw: str  # fio's --rw
    block_size: int  # --bs
    depth: int  # --iodepth
    api: str  # how our reader is called: one of APIS
    jobs: int = 1  # --numjobs, reported as one group (fio's --group_reporting)

    @property
    def name(self) -> str:
        jobs = f"-j{self.jobs}" if self.jobs > 1 else ""
        return f"{fio_size(self.block_size)}-{self.rw}-qd{self.depth}{jobs}-{self.api}"

    @property
    def latency(self) -> str:
        """fio's name for the latency compared: the whole call ("lat_ns") when
        each call is one IO, else submit to completion ("clat_ns")."""
        return "lat_ns" if self.api == "read" else "clat_ns"


DEFAULT_PATTERNS = (
    Pattern("randread", 4096, 1, "read"),
    Pattern("randread", 4096, 32, "batch"),
    Pattern("randread", 4096, 32, "async"),
    Pattern("randread", 4096, 32, "stream"),
    Pattern("read", 1 << 20, 4, "stream"),
    Pattern("read", 1 << 20, 16, "stream"),
)
# fio's keys for the percentiles in the table ("99.990000": p99.99).
PERCENTILES = (50.0, 99.0, 99.9, 99.99)


def fio_key(percentile: float) -> str:
    return f"{percentile:.6f}"


@dataclass(frozen=True)
class Result:
    tool: str
    pattern: str
    iops: float
    bw_bytes: float
    latency: str  # fio's name: "lat_ns" (the whole call) or "clat_ns" (submit to completion)
    percentiles_ns: dict[str, float]  # fio's keys
    disk_util: dict[str, int] | None  # the device's counters over the run, fio's names

    def fio_json(self) -> dict:
        """This run as fio's JSON job would hold it."""
        return {
            "tool": self.tool, "jobname": self.pattern, "disk_util": self.disk_util,
            "read": {"iops": self.iops, "bw_bytes": self.bw_bytes,
                     self.latency: {"percentile": self.percentiles_ns}},
        }  # fmt: skip


def drop_caches() -> bool:
    """Writes dirty pages back and drops the page cache; False without root."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def check_room(folder: Path, need: int) -> None:
    """OSError (ENOSPC) naming `folder` where its filesystem has less than
    `need` bytes free: said before a benchmark writes anything, not as some
    write's failure halfway through."""
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if free < need:
        raise OSError(errno.ENOSPC, f"the benchmark's files need {human_bytes(need)} here, "
                      f"and {human_bytes(free)} is free", str(folder))  # fmt: skip


def exited(tool: str, code: int, said: str, path: str | Path) -> OSError:
    """Another project's tool that exited with `code`, as an OSError naming
    `path`, with the last line it wrote to stderr (`said`): one line to say."""
    lines = said.strip().splitlines()
    return OSError(None, f"{tool} exited with {code}" + (f": {lines[-1]}" if lines else ""),
                   str(path))  # fmt: skip


@contextlib.contextmanager
def loop_device(size: int, folder: str | None) -> Iterator[str]:
    """A loop device (direct IO on) over a new file filled with random bytes,
    written before any read: reads of never-written blocks would time nothing."""
    folder = folder or tempfile.gettempdir()
    check_room(Path(folder), size)
    image = Path(tempfile.mkstemp(prefix="pyinit-bench-", suffix=".img", dir=folder)[1])
    try:
        rng = np.random.default_rng(0)
        try:
            with image.open("wb") as f:
                for _ in range(0, size, 64 << 20):
                    f.write(rng.integers(0, 256, min(64 << 20, size - f.tell()), dtype=np.uint8))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # a buffered write's error names no file
            raise OSError(e.errno, f"writing the loop device's file: {e.strerror}",
                          str(image)) from e  # fmt: skip
        with loop_device_over(image) as device:
            yield device
    finally:
        image.unlink()


@contextlib.contextmanager
def loop_device_over(image: Path) -> Iterator[str]:
    """/dev/loopN over ``image`` with direct IO on, detached on the way out."""
    attached = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        capture_output=True, text=True,
    )  # fmt: skip
    if attached.returncode:  # no loop device free, or none in this container
        raise exited("losetup", attached.returncode, attached.stderr, image)
    device = attached.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=True)


def target_size(target: str) -> int:
    """Bytes in a file or block device (``open_input``: InputError for
    anything else, a FIFO refused rather than waited on)."""
    with open_input(target, block_devices=True) as f:
        return f.seek(0, os.SEEK_END)


def offsets_for(pattern: Pattern, size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    blocks = size // pattern.block_size
    if pattern.rw == "randread":
        return rng.integers(0, blocks, count, dtype=np.int64) * pattern.block_size
    return (np.arange(count, dtype=np.int64) % blocks) * pattern.block_size


def histogram_percentiles(buckets: list[tuple[int, int]], largest_ns: float) -> dict[str, float]:
    """PERCENTILES from the reader's latency buckets ((floor, count), merged
    over jobs), valued as the reader's own stats value them: the middle of the
    bucket (8 per power of two), at most the largest sample."""
    counts: dict[int, int] = {}
    for floor, count in buckets:
        counts[floor] = counts.get(floor, 0) + count
    total = sum(counts.values())
    result = {}
    for q in PERCENTILES:
        rank, seen = int(q / 100 * (total - 1)), 0
        for floor in sorted(counts):
            seen += counts[floor]
            if seen > rank:
                width = 1 if floor < 8 else 1 << (floor.bit_length() - 4)
                result[fio_key(q)] = min(floor + width / 2, largest_ns)
                break
    return result


def run_job(
    reader: DirectReader, pattern: Pattern, runtime: float
) -> tuple[int, list[int], list[dict]]:
    """One job's reads for about `runtime` seconds, called the plain way:
    (reads done, per-call latencies in ns for the read API, where each call is
    one IO, and the stats that hold the IO latency otherwise)."""
    rng = np.random.default_rng()
    size = reader.size
    blocks = size // pattern.block_size
    position = 0  # sequential from the start, as fio's jobs read

    def offsets(count: int) -> np.ndarray:
        nonlocal position
        if pattern.rw == "randread":
            return offsets_for(pattern, size, count, rng)
        start, position = position, position + count
        return ((np.arange(count) + start) % blocks) * pattern.block_size

    clock = time.perf_counter_ns
    deadline = clock() + int(runtime * 1e9)
    if pattern.api == "read":
        latencies = []
        read = reader.read
        for offset in offsets(1 << 20).tolist():
            t0 = clock()
            read(offset, pattern.block_size)
            t1 = clock()
            latencies.append(t1 - t0)
            if t1 > deadline:
                break
        return len(latencies), latencies, []
    count = 0
    if pattern.api == "batch":
        while clock() < deadline:
            reader.read_batch(offsets(pattern.depth), pattern.block_size)
            count += pattern.depth
        return count, [], [reader.stats()]
    if pattern.api == "async":
        # The reader's depth bounds the reads in flight across both batches.
        pending = reader.read_batch_async(offsets(pattern.depth), pattern.block_size)
        while clock() < deadline:
            following = reader.read_batch_async(offsets(pattern.depth), pattern.block_size)
            pending.result()
            count += pattern.depth
            pending = following
        pending.result()
        return count + pattern.depth, [], [reader.stats()]
    stream_stats = []
    # "stream-batch": `depth` rows an item, one Python object a batch instead of a row.
    batch = pattern.depth if pattern.api == "stream-batch" else None
    while clock() < deadline:
        # Long streams: the queue drains only at the end of each.
        with reader.stream(offsets(1 << 16), pattern.block_size, depth=pattern.depth,
                           batch=batch) as items:  # fmt: skip
            for item in items:
                count += len(item) if batch else 1
                if count % 64 == 0 and clock() > deadline:
                    break
            stream_stats.append(items.stats())
    return count, [], stream_stats


def run_reader_job(target: str, pattern: Pattern, runtime: float,
                   backend: str) -> tuple[float, list[int], list[dict]]:  # fmt: skip
    """One job with a reader of its own (a data-loader worker's): its reads
    per second over its own time reading (as fio counts a job's), the
    latencies and the stats."""
    with DirectReader(target, queue_depth=pattern.depth, backend=backend) as reader:
        started = time.perf_counter()
        count, latencies, stats = run_job(reader, pattern, runtime)
        return count / (time.perf_counter() - started), latencies, stats


def run_reader(target: str, pattern: Pattern, runtime: float, backend: str) -> Result:
    """`pattern.jobs` readers, each in a process of its own (as a DataLoader's
    workers are: no GIL between them), as one group."""
    before = disk_counters(target)
    if pattern.jobs == 1:
        jobs = [run_reader_job(target, pattern, runtime, backend)]
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(pattern.jobs, mp_context=context) as pool:
            futures = [pool.submit(run_reader_job, target, pattern, runtime, backend)
                       for _ in range(pattern.jobs)]  # fmt: skip
            jobs = [future.result() for future in futures]
    disk = disk_delta(before, disk_counters(target))
    if pattern.api == "read":
        latencies = np.concatenate([np.array(calls, dtype=np.float64) for _, calls, _ in jobs])
        cuts = np.percentile(latencies, PERCENTILES)
        percentiles = {fio_key(q): float(v) for q, v in zip(PERCENTILES, cuts, strict=True)}
    else:
        stats = [one for _, _, kept in jobs for one in kept]
        buckets = [tuple(b) for s in stats for b in s["io_latency_histogram_ns"]]
        largest = max(s["io_latency_us"]["max"] for s in stats) * 1e3
        percentiles = histogram_percentiles(buckets, largest)
    iops = sum(rate for rate, _, _ in jobs)  # fio's group: the jobs' rates added
    return Result("pyinit", pattern.name, iops, iops * pattern.block_size, pattern.latency,
                  percentiles, disk)  # fmt: skip


# /sys/class/block/NAME/stat: the fields fio's disk_util reports for reads.
DISK_FIELDS = ("read_ios", "read_merges", "read_sectors", "read_ticks")


def disk_counters(target: str) -> dict[str, int] | None:
    """The read counters of the block device `target` is, or of the one its
    filesystem lies on (a partition's own); None where that has none in
    sysfs (tmpfs, overlay, a network filesystem)."""
    try:
        status = os.stat(target)
        device = status.st_rdev if stat.S_ISBLK(status.st_mode) else status.st_dev
        fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
        values = [int(v) for v in fields.read_text().split()[: len(DISK_FIELDS)]]
    except (OSError, ValueError):
        return None
    return dict(zip(DISK_FIELDS, values, strict=True))


def disk_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict | None:
    if before is None or after is None:
        return None
    return {key: after[key] - before[key] for key in DISK_FIELDS}


def fio_job(command: list[str], rw: str) -> dict[str, Any]:
    """The `rw` ("read" or "write") figures of the one job (or group) that
    `command`, a fio run with JSON output, reports. fio's JSON holds a file's
    name as its bytes: one that is not UTF-8 is read as Python names files.
    CalledProcessError when fio fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          errors="surrogateescape")  # fmt: skip
    return json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0][rw]


def run_fio(target: str, pattern: Pattern, runtime: float) -> Result:
    command = [
        "fio", "--name=bench", f"--filename={target}", "--ioengine=io_uring", "--direct=1",
        f"--rw={pattern.rw}", f"--bs={pattern.block_size}", f"--iodepth={pattern.depth}",
        f"--numjobs={pattern.jobs}", "--group_reporting", f"--runtime={runtime}", "--time_based",
        "--lat_percentiles=1", "--percentile_list=" + ":".join(f"{q:g}" for q in PERCENTILES),
        "--output-format=json", "--readonly",
    ]  # fmt: skip
    before = disk_counters(target)
    read = fio_job(command, "read")
    disk = disk_delta(before, disk_counters(target))
    # With lat_percentiles, lat_ns holds the percentiles of the total latency.
    cuts = read[pattern.latency].get("percentile", {})
    percentiles = {fio_key(q): float(cuts.get(fio_key(q), 0)) for q in PERCENTILES}
    return Result("fio", pattern.name, read["iops"], read["bw_bytes"], pattern.latency,
                  percentiles, disk)  # fmt: skip


# fio's sequential direct reads worth trying on a device: its ceiling is not one
# setting (an H200 node's disk: 0.95 GB/s at 1 MiB depth 16, 1.80 at 128 KiB
# depth 64). (block size, depth, jobs); jobs split the file between them.
SEQUENTIAL_SWEEP = ((128 << 10, 64, 1), (1 << 20, 16, 1), (1 << 20, 64, 1), (4 << 20, 32, 1),
                    (1 << 20, 16, 4), (4 << 20, 32, 4))  # fmt: skip


def fio_size(size: int) -> str:
    """A byte count as fio writes it: 4k, 1m."""
    for unit, factor in (("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def setting_name(block_size: int, depth: int, jobs: int) -> str:
    return f"bs={fio_size(block_size)} iodepth={depth} numjobs={jobs}"


def best_sequential_read(path: str, size: int, runtime: float = 2.0) -> tuple[str, float, dict]:
    """fio's fastest sequential direct read of `path` (its first `size`
    bytes) over SEQUENTIAL_SWEEP, each from a cold page cache, at most
    `runtime` seconds each: (the setting's name, bytes/s, every setting's)."""
    rates = {}
    for block_size, depth, jobs in SEQUENTIAL_SWEEP:
        share = size // jobs // block_size * block_size
        if share == 0:
            continue
        drop_caches()
        command = [
            "fio", "--name=sweep", f"--filename={path}", "--ioengine=io_uring", "--direct=1",
            "--rw=read", f"--bs={block_size}", f"--iodepth={depth}", f"--numjobs={jobs}",
            f"--size={share}", f"--offset_increment={share}", "--group_reporting",
            f"--runtime={runtime}", "--output-format=json", "--readonly",
        ]  # fmt: skip
        read = fio_job(command, "read")
        rates[setting_name(block_size, depth, jobs)] = float(read["bw_bytes"])
    best = max(rates, key=rates.__getitem__)
    return best, rates[best], rates


def fio_version() -> str:
    return subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()


LATENCY_COLUMNS = tuple((f"p{q:g}_us", f"p{q:g} us", 9, 1) for q in PERCENTILES)
COLUMNS = (  # (table key, header, width, decimals)
    ("iops", "IOPS", 10, 0),
    ("gb_s", "GB/s", 7, 3),
    *LATENCY_COLUMNS,
    ("dev_us", "dev us", 8, 1),  # a read's mean time in the block layer and the device
    ("dev_qd", "dev qd", 7, 1),  # the reads there on average
)


def column_values(result: Result) -> dict[str, float]:
    """One run's value of each column of the table; the device's two only
    where its counters are known."""
    latencies = {f"p{q:g}_us": result.percentiles_ns[fio_key(q)] / 1e3 for q in PERCENTILES}
    values = {"iops": result.iops, "gb_s": result.bw_bytes / 1e9, **latencies}
    disk = result.disk_util
    if disk and disk["read_ios"]:
        device_s = disk["read_ticks"] / 1e3 / disk["read_ios"]
        values["dev_us"] = device_s * 1e6
        # Little's law: reads completed per second times the time each spent there.
        values["dev_qd"] = result.iops * device_s
    return values


def summarize(results: list[Result]) -> dict[str, dict[str, dict[str, float]]]:
    """Per pattern and tool, the median over rounds of each column."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for r in results:
        table.setdefault(r.pattern, {}).setdefault(r.tool, {})
    for pattern, tools in table.items():
        for tool in tools:
            runs = [column_values(r) for r in results if r.pattern == pattern and r.tool == tool]
            tools[tool] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    return table


def print_table(table: dict[str, dict[str, dict[str, float]]]) -> None:
    titles = " ".join(f"{header:>{width}}" for _, header, width, _ in COLUMNS)
    print(f"{'pattern':24} {'tool':7} {titles}")
    for pattern, tools in table.items():
        rows = [(tool, [v.get(key) for key, *_ in COLUMNS]) for tool, v in tools.items()]
        if "fio" in tools:
            ours, fio = tools["pyinit"], tools["fio"]
            ratios = [ours[key] / fio[key] if ours.get(key) is not None and fio.get(key) else None
                      for key, *_ in COLUMNS]  # fmt: skip
            rows.append(("ratio", ratios))
        for tool, values in rows:
            cells = " ".join(
                f"{v:{width}.{3 if tool == 'ratio' else digits}f}" if v is not None
                else f"{'-':>{width}}"
                for v, (_, _, width, digits) in zip(values, COLUMNS, strict=True)
            )  # fmt: skip
            print(f"{pattern if tool != 'ratio' else '':24} {tool:7} {cells}")


def targets(results: list[Result], patterns: list[Pattern]) -> list[dict]:
    """The issue's targets that this run answers, each the median of ours
    against fio's median for the same pattern, with the range of the
    rounds' own ratios. A synchronous `read_batch` has none: it returns
    when its slowest read does, so the queue drains at every call; back to
    back, a loader keeps it full with `read_batch_async` (the "async" rows)."""
    table = summarize(results)
    found = []
    for pattern in patterns:
        tools = table.get(pattern.name, {})
        if "fio" not in tools or "pyinit" not in tools:
            continue
        ours, fio = tools["pyinit"], tools["fio"]
        wanted = []  # (what, column, need, at least)
        random_4k = pattern.rw == "randread" and pattern.block_size == 4096
        if random_4k and pattern.depth >= 32 and pattern.api != "batch":
            wanted.append(("IOPS", "iops", 1.0, True))
            if pattern.jobs == 1 and pattern.api in ("async", "stream"):
                wanted.append(("p50", "p50_us", 1.1, False))
        elif pattern.rw == "read" and pattern.block_size == 1 << 20 and pattern.depth == 4:
            wanted.append(("GB/s", "gb_s", 1.0, True))
        runs = {tool: [column_values(r) for r in results
                       if r.pattern == pattern.name and r.tool == tool]
                for tool in ("pyinit", "fio")}  # fmt: skip
        for what, key, need, higher in wanted:
            if fio[key] <= 0:
                continue
            pairs = zip(runs["pyinit"], runs["fio"], strict=False)
            rounds = [mine[key] / theirs[key] for mine, theirs in pairs if theirs[key] > 0]
            found.append(ratio_target(f"{pattern.name} {what} / fio's", ours[key], fio[key],
                                      need, higher, rounds=rounds))  # fmt: skip
    return found


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    table = document["table"]
    keys = [key for key, *_ in LATENCY_COLUMNS]
    fig, axes = plt.subplots(1, len(table), figsize=(4.5 * len(table), 4), squeeze=False)
    for ax, (pattern, tools) in zip(axes[0], table.items(), strict=True):
        width = 0.8 / len(tools)
        for i, (tool, v) in enumerate(tools.items()):
            xs = [x + i * width for x in range(len(keys))]
            ax.bar(xs, [v[k] for k in keys], width, label=f"{tool}: {v['iops']:,.0f} IOPS")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))])
        ax.set_xticklabels([header.split()[0] for _, header, *_ in LATENCY_COLUMNS])
        ax.set_yscale("log")
        ax.set_title(pattern)
        ax.set_ylabel("read latency, µs (log scale)")
        ax.legend(fontsize="small")
    beside = " beside fio" if document["fio"] else ""
    fig.suptitle(f"O_DIRECT reads, pod-init's reader{beside}: {document['target_kind']}\n"
                 f"{document['machine']}, {document['date']}")  # fmt: skip
    return save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", help="a file or block device that holds data")
    parser.add_argument(
        "--loop", type=argtypes.size(1 << 20), metavar="SIZE", help="make a loop device"
    )
    parser.add_argument("--loop-dir", help="where the loop device's file goes (default /var/tmp)")
    parser.add_argument(
        "--runtime", type=argtypes.seconds(0.1, 3600), default=5.0, help="seconds per run"
    )
    fio_knobs = parser.add_argument_group(
        "one pattern in fio's knobs (any of them replaces the six default patterns)"
    )
    fio_knobs.add_argument("--rw", choices=("randread", "read"),
                           help="random or sequential reads (the reader only reads)")  # fmt: skip
    fio_knobs.add_argument("--bs", type=argtypes.size(512, 1 << 30), metavar="SIZE",
                           help="block size, a multiple of 512 (default 4k)")  # fmt: skip
    fio_knobs.add_argument("--iodepth", type=argtypes.whole(1, _native.MAX_QUEUE_DEPTH),
                           help="reads in flight per job (default 1)")  # fmt: skip
    fio_knobs.add_argument("--numjobs", type=argtypes.whole(1, 256), default=1,
                           help="readers running at once, each in a process of its own, "
                           "reported as one group")  # fmt: skip
    fio_knobs.add_argument("--api", choices=APIS, help="how our reader is called (default: read "
                           "at iodepth 1, else stream)")  # fmt: skip
    parser.add_argument("--rounds", type=argtypes.whole(1, 1000), default=2)
    parser.add_argument("--backend", default="io_uring", choices=("io_uring", "pread"))
    parser.add_argument("--no-fio", action="store_true", help="only our reader")
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for io.json and io.png")
    parser.add_argument("--machine", default=os.uname().nodename, help="named in the plot")


def main(args: argparse.Namespace) -> int:
    if (args.target is None) == (args.loop is None):
        raise InputError("give a TARGET or --loop SIZE")
    patterns = chosen_patterns(args)
    largest = max(p.block_size for p in patterns)
    size = target_size(args.target) if args.target else args.loop
    if size < largest:
        raise InputError(
            f"{args.target or '--loop'} holds {size} bytes, less than one {largest}-byte block: "
            "give a file or device with more data (or --loop SIZE)"
        )
    note_missing("matplotlib", "the PNG", "pyinit bench io")  # once the arguments are good
    fio = shutil.which("fio") if not args.no_fio else None
    if not args.no_fio and fio is None:
        print("pyinit bench io: fio is not installed; measuring our reader alone", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        folder = args.loop_dir or "/var/tmp"
        target = args.target or stack.enter_context(loop_device(args.loop, folder))
        results, dropped = measure(target, patterns, args, fio)
    if not dropped:
        print("pyinit bench io: page cache not dropped (needs root)", file=sys.stderr)
    table = summarize(results)
    print_table(table)
    met = targets(results, patterns)
    print_targets(met)
    kind = f"loop device over a {human_bytes(args.loop)} file" if args.loop else target
    document = {"machine": args.machine, "date": time.strftime("%Y-%m-%d"), "target_kind": kind,
                "runtime_s": args.runtime, "rounds": args.rounds, "backend": args.backend,
                "page_cache_dropped": dropped, "fio": fio_version() if fio else None,
                "results": [r.fio_json() for r in results], "table": table,
                "targets": met}  # fmt: skip
    out = write_json(Path(args.out) / "io.json", document, indent=2)
    png = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {png}" if plot(document, png) else ""))
    return 0


def chosen_patterns(args: argparse.Namespace) -> list[Pattern]:
    """The one pattern fio's knobs describe, or the six default ones."""
    if args.bs is not None and args.bs % 512:
        raise InputError(f"--bs {args.bs} is not a multiple of 512 (O_DIRECT reads whole sectors)")
    depth = args.iodepth or 1
    if args.api == "read" and depth != 1:
        raise InputError("--api read makes one IO per call: it takes --iodepth 1")
    if args.rw or args.bs or args.iodepth or args.api:
        api = args.api or ("read" if depth == 1 else "stream")
        return [Pattern(args.rw or "randread", args.bs or 4096, depth, api, args.numjobs)]
    return [replace(p, jobs=args.numjobs) for p in DEFAULT_PATTERNS]


def measure(
    target: str, patterns: list[Pattern], args: argparse.Namespace, fio: str | None
) -> tuple[list[Result], bool]:
    """Every pattern, our reader and fio in turns (which goes first alternates
    by round), each from a cold page cache; and whether it could be dropped."""
    results: list[Result] = []
    dropped = True
    for round_no in range(args.rounds):
        for pattern in patterns:
            tools = ["pyinit", "fio"] if fio else ["pyinit"]
            for tool in tools if round_no % 2 == 0 else tools[::-1]:
                dropped &= drop_caches()
                if tool == "fio":
                    results.append(run_fio(target, pattern, args.runtime))
                else:
                    results.append(run_reader(target, pattern, args.runtime, args.backend))
                print(f"round {round_no} {pattern.name} {tool} done", file=sys.stderr)
    return results, dropped
