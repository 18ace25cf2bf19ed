"""IO benchmark in fio's terms: the DirectReader against fio on the same target.

Patterns (fio's names): ``randread`` 4 KiB at queue depth 1 and 32, ``read``
(sequential) 1 MiB at depth 16. For each, our reader and ``fio --ioengine=io_uring
--direct=1`` run alternately, round by round, with the page cache dropped
before every run. Reported: IOPS, GB/s and latency p50/p99/p99.9. At depth 1
our latency is the whole Python call (``reader.read``), against fio's total
latency (``lat_ns``, submission included); deeper, both are completion
latency (submit to completion of each IO).

    pyinit bench io --loop 512M                # a loop device over a file, made and removed here
    pyinit bench io /dev/nvme0n1 --runtime 10  # an existing device or file, read only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pyinit import argtypes
from pyinit.bench.plotting import pyplot
from pyinit.errors import InputError
from pyinit.extras import note_missing
from pyinit.io import DirectReader, aligned_empty
from pyinit.jsonfile import write_json


@dataclass(frozen=True)
class Pattern:
    name: str
    rw: str  # fio's --rw
    block_size: int
    depth: int


PATTERNS = (
    Pattern("4k-randread-qd1", "randread", 4096, 1),
    Pattern("4k-randread-qd32", "randread", 4096, 32),
    Pattern("1m-read-qd16", "read", 1 << 20, 16),
)


@dataclass(frozen=True)
class Result:
    tool: str
    pattern: str
    iops: float
    gbps: float  # 1e9 bytes per second
    p50_us: float
    p99_us: float
    p999_us: float


def drop_caches() -> bool:
    """Writes dirty pages back and drops the page cache; False without root."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def loop_device(size: int, folder: str | None) -> Iterator[str]:
    """A loop device (direct IO on) over a new file filled with random bytes,
    written before any read: reads of never-written blocks would time nothing."""
    image = Path(tempfile.mkstemp(prefix="pyinit-bench-", suffix=".img", dir=folder)[1])
    try:
        rng = np.random.default_rng(0)
        with image.open("wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(rng.integers(0, 256, min(64 << 20, size - f.tell()), dtype=np.uint8))
            f.flush()
            os.fsync(f.fileno())
        with loop_device_over(image) as device:
            yield device
    finally:
        image.unlink()


@contextlib.contextmanager
def loop_device_over(image: Path) -> Iterator[str]:
    """/dev/loopN over ``image`` with direct IO on, detached on the way out."""
    device = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=True)


def target_size(target: str) -> int:
    """Bytes in a file or block device (OSError naming it when it cannot be opened)."""
    with open(target, "rb") as f:
        return f.seek(0, os.SEEK_END)


def offsets_for(pattern: Pattern, size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    blocks = size // pattern.block_size
    if pattern.rw == "randread":
        return rng.integers(0, blocks, count, dtype=np.int64) * pattern.block_size
    return (np.arange(count, dtype=np.int64) % blocks) * pattern.block_size


def run_reader(target: str, pattern: Pattern, runtime: float, backend: str) -> Result:
    rng = np.random.default_rng()
    with DirectReader(target, queue_depth=pattern.depth, backend=backend) as reader:
        size = reader.size
        if pattern.depth == 1:
            # One Python call per IO: what a data loader doing single reads pays.
            offsets = offsets_for(pattern, size, 1 << 20, rng).tolist()
            latencies = []
            clock = time.perf_counter_ns
            read = reader.read
            started = clock()
            deadline = started + int(runtime * 1e9)
            for offset in offsets:
                t0 = clock()
                read(offset, pattern.block_size)
                t1 = clock()
                latencies.append(t1 - t0)
                if t1 > deadline:
                    break
            elapsed = (clock() - started) / 1e9
            count = len(latencies)
            p50, p99, p999 = np.percentile(np.array(latencies) / 1e3, [50, 99, 99.9])
        else:
            # Many IOs per call, the queue kept full: what read_batch gives a data loader.
            # read_batch returns when its last read does, so the queue drains at the
            # end of every call: give each call 64 reads per queue slot, and for
            # large blocks 256 MiB, so the drain is a percent of the time, not ten.
            per_call = 64 * pattern.depth
            if pattern.block_size > 64 << 10:
                per_call = (256 << 20) // pattern.block_size
            # One reused output, as a loader filling a pinned buffer does; a new
            # array per call would also time faulting in its pages.
            out = aligned_empty((per_call, pattern.block_size))
            out.fill(0)  # fault its pages in now, not during the first timed call
            count = 0
            started = time.perf_counter()
            position = 0
            while time.perf_counter() - started < runtime:
                if pattern.rw == "randread":
                    offsets = offsets_for(pattern, size, per_call, rng)
                else:
                    blocks = size // pattern.block_size
                    offsets = ((np.arange(per_call) + position) % blocks) * pattern.block_size
                    position += per_call
                reader.read_batch(offsets, pattern.block_size, out=out)
                count += per_call
            elapsed = time.perf_counter() - started
            latency = reader.stats()["io_latency_us"]
            p50, p99, p999 = latency["p50"], latency["p99"], latency["p99.9"]
    iops = count / elapsed
    return Result("pyinit", pattern.name, iops, iops * pattern.block_size / 1e9, p50, p99, p999)


def run_fio(target: str, pattern: Pattern, runtime: float) -> Result:
    command = [
        "fio", "--name=bench", f"--filename={target}", "--ioengine=io_uring", "--direct=1",
        f"--rw={pattern.rw}", f"--bs={pattern.block_size}", f"--iodepth={pattern.depth}",
        f"--runtime={runtime}", "--time_based", "--lat_percentiles=1", "--output-format=json",
        "--readonly",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    read = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["read"]
    # With lat_percentiles, lat_ns holds the percentiles of the total latency.
    source = read["lat_ns"] if pattern.depth == 1 else read["clat_ns"]
    cuts = source.get("percentile", {})
    us = [cuts.get(k, 0) / 1e3 for k in ("50.000000", "99.000000", "99.900000")]
    return Result("fio", pattern.name, read["iops"], read["bw_bytes"] / 1e9, *us)


def fio_version() -> str:
    return subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()


def summarize(results: list[Result]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for r in results:
        table.setdefault(r.pattern, {}).setdefault(r.tool, {})
    for pattern, tools in table.items():
        for tool in tools:
            mine = [r for r in results if r.pattern == pattern and r.tool == tool]
            tools[tool] = {
                key: statistics.median(getattr(r, key) for r in mine)
                for key in ("iops", "gbps", "p50_us", "p99_us", "p999_us")
            }
    return table


def print_table(table: dict[str, dict[str, dict[str, float]]]) -> None:
    keys = ("iops", "gbps", "p50_us", "p99_us", "p999_us")
    widths = (10, 7, 8, 8, 9)
    header = ("IOPS", "GB/s", "p50 us", "p99 us", "p99.9 us")
    titles = " ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True))
    print(f"{'pattern':18} {'tool':7} {titles}")
    for pattern, tools in table.items():
        rows = [(tool, [v[k] for k in keys]) for tool, v in tools.items()]
        if "fio" in tools:
            ours, fio = tools["pyinit"], tools["fio"]
            rows.append(("ratio", [ours[k] / fio[k] if fio[k] else float("nan") for k in keys]))
        for tool, values in rows:
            digits = [3] * 5 if tool == "ratio" else [0, 3, 1, 1, 1]
            formats = zip(values, widths, digits, strict=True)
            cells = " ".join(f"{v:{w}.{d}f}" for v, w, d in formats)
            print(f"{pattern if tool != 'ratio' else '':18} {tool:7} {cells}")


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    table = document["table"]
    fig, axes = plt.subplots(1, len(table), figsize=(4 * len(table), 4))
    for ax, (pattern, tools) in zip(np.atleast_1d(axes), table.items(), strict=True):
        keys = ("p50_us", "p99_us", "p999_us")
        for i, (tool, v) in enumerate(tools.items()):
            ax.bar([x + i * 0.4 for x in range(3)], [v[k] for k in keys], 0.4, label=tool)
        ax.set_xticks([x + 0.2 for x in range(3)])
        ax.set_xticklabels(["p50", "p99", "p99.9"])
        ax.set_title(pattern)
        ax.set_ylabel("latency, µs")
        ax.legend()
    fig.suptitle(f"{document['target_kind']} on {document['machine']} ({document['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyinit bench io", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", help="a file or block device that holds data")
    parser.add_argument(
        "--loop", type=argtypes.size(1 << 20), metavar="SIZE", help="make a loop device"
    )
    parser.add_argument("--loop-dir", help="where the loop device's file goes (default /var/tmp)")
    parser.add_argument(
        "--runtime", type=argtypes.seconds(0.1, 3600), default=5.0, help="seconds per run"
    )
    parser.add_argument("--rounds", type=argtypes.whole(1, 1000), default=2)
    parser.add_argument("--backend", default="io_uring", choices=("io_uring", "pread"))
    parser.add_argument("--no-fio", action="store_true", help="only our reader")
    parser.add_argument("--out", help="write JSON here (and a PNG beside it)")
    parser.add_argument("--machine", default=os.uname().nodename)
    args = parser.parse_args(argv)
    note_missing("matplotlib", "the PNG", "pyinit bench io")
    if (args.target is None) == (args.loop is None):
        parser.error("give a TARGET or --loop SIZE")
    largest = max(p.block_size for p in PATTERNS)
    size = target_size(args.target) if args.target else args.loop
    if size < largest:
        raise InputError(
            f"{args.target or '--loop'} holds {size} bytes, less than one {largest}-byte block of "
            "the sequential pattern: give a file or device with more data (or --loop SIZE)"
        )
    fio = shutil.which("fio") if not args.no_fio else None
    if not args.no_fio and fio is None:
        print("pyinit bench io: fio is not installed; measuring our reader alone", file=sys.stderr)

    with contextlib.ExitStack() as stack:
        folder = args.loop_dir or "/var/tmp"
        target = args.target or stack.enter_context(loop_device(args.loop, folder))
        results: list[Result] = []
        dropped = True
        for round_no in range(args.rounds):
            for pattern in PATTERNS:
                tools = ["pyinit", "fio"] if fio else ["pyinit"]
                for tool in tools if round_no % 2 == 0 else tools[::-1]:
                    dropped &= drop_caches()
                    if tool == "fio":
                        results.append(run_fio(target, pattern, args.runtime))
                    else:
                        results.append(run_reader(target, pattern, args.runtime, args.backend))
                    print(f"round {round_no} {pattern.name} {tool} done", file=sys.stderr)
    if not dropped:
        print("pyinit bench io: page cache not dropped (needs root)", file=sys.stderr)
    table = summarize(results)
    print_table(table)
    if args.out:
        document = {
            "machine": args.machine,
            "date": time.strftime("%Y-%m-%d"),
            "target_kind": f"loop device over a {args.loop}-byte file" if args.loop else target,
            "runtime_s": args.runtime,
            "rounds": args.rounds,
            "backend": args.backend,
            "page_cache_dropped": dropped,
            "fio": fio_version() if fio else None,
            "results": [asdict(r) for r in results],
            "table": table,
        }
        out = write_json(args.out, document, indent=2)
        print("wrote", out, "plot:", plot(document, out.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
