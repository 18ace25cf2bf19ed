"""All-reduce bandwidth the way nccl-tests reports it, through torch.distributed
(NCCL on GPUs, gloo on CPU).

    pyinit bench allreduce [--nproc N] [--min 8] [--max 4G] [--factor 2] [--out DIR]

runs a size sweep with one worker per GPU (two gloo workers without GPUs)
under torchrun, prints nccl-tests' columns and writes allreduce.json and
allreduce.png (busbw against size). The worker alone, as other tools use it::

    torchrun --nproc-per-node 2 -m pyinit.bench.allreduce --sizes 1G,4G --out result.json

Each rank fills its buffer with rank + 1, so every element of the result must
equal n(n+1)/2; elements that do not are counted in ``wrong``. algbw is bytes
per second of the timed call (1e9 bytes per GB); busbw = algbw x 2(n-1)/n.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pyinit import argtypes
from pyinit.bench.plotting import pyplot
from pyinit.extras import note_missing
from pyinit.jsonfile import write_json

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class AllreduceRow:
    size: int  # bytes per rank
    count: int  # elements
    dtype: str
    time_us: float  # mean per call, out-of-place
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int  # elements that did not sum to n(n+1)/2


def bus_factor(ranks: int) -> float:
    return 2 * (ranks - 1) / ranks if ranks > 1 else 1.0


def measure(
    sizes: list[int],
    iterations: int,
    warmup: int,
    progress: Callable[[AllreduceRow], None] | None = None,
) -> list[AllreduceRow]:
    """Inside an initialised process group: one row per size (float32, sum)."""
    import torch
    import torch.distributed as dist

    ranks, rank = dist.get_world_size(), dist.get_rank()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    expected = ranks * (ranks + 1) / 2
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        work = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
        # Checked once on fresh data; the timed calls below reduce in place,
        # back to back like nccl-tests, and their values do not matter.
        dist.all_reduce(work)
        wrong = int((work != expected).sum().item())
        for _ in range(warmup):
            dist.all_reduce(work)
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                dist.all_reduce(work)
            stop.record()
            stop.synchronize()
            seconds = start.elapsed_time(stop) / 1e3 / iterations
        else:
            began = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(work)
            seconds = (time.perf_counter() - began) / iterations
        algbw = count * 4 / seconds / 1e9
        row = AllreduceRow(
            count * 4, count, "float32", seconds * 1e6, algbw, algbw * bus_factor(ranks), wrong
        )
        rows.append(row)
        if progress is not None:
            progress(row)
        del work
    return rows


def worker(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyinit.bench.allreduce")
    parser.add_argument("--sizes", default="1G", help="comma-separated: 8,64K,1G")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", help="rank 0 writes the rows here as JSON")
    parser.add_argument("--progress", action="store_true", help="rank 0: a line per size")
    args = parser.parse_args(argv)
    sizes = [argtypes.size()(s) for s in args.sizes.split(",")]
    done: list[AllreduceRow] = []

    def progress(row: AllreduceRow) -> None:
        done.append(row)
        if args.progress and int(os.environ.get("RANK", "0")) == 0:
            print(f"allreduce [{len(done)}/{len(sizes)}] {human_size(row.size)}: busbw "
                  f"{row.busbw:.2f} GB/s", file=sys.stderr, flush=True)  # fmt: skip

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rows = measure(sizes, args.iterations, args.warmup, progress)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        backend = dist.Backend.NCCL if cuda else dist.Backend.GLOO
        document = {"ranks": ranks, "backend": str(backend), "rows": [asdict(r) for r in rows]}
        text = json.dumps(document, indent=2) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
    return 0


def human_size(size: int) -> str:
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def sweep(smallest: int, largest: int, factor: int) -> list[int]:
    """Sizes from smallest to largest, each `factor` times the last (whole float32 counts)."""
    sizes, size = [], max(4, smallest)
    while size <= largest:
        sizes.append(size // 4 * 4)
        size *= factor
    return sizes


NCCL_TESTS_HEADER = (
    f"{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time (us)':>10} "
    f"{'algbw (GB/s)':>13} {'busbw (GB/s)':>13} {'#wrong':>7}"
)


def table(rows: list[dict]) -> str:
    lines = [NCCL_TESTS_HEADER]
    for r in rows:
        lines.append(
            f"{r['size']:>12} {r['count']:>12} {'float':>6} {'sum':>6} {r['time_us']:>10.1f} "
            f"{r['algbw']:>13.2f} {r['busbw']:>13.2f} {r['wrong']:>7}"
        )
    return "\n".join(lines) + "\n"


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = document["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw, GB/s")
    ax.set_title(f"all-reduce, {document['ranks']} ranks ({document['backend']}), "
                 f"{document['machine']}, {document['date']}")  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    """`pyinit bench allreduce`: the sweep under torchrun, then the table and files."""
    import torch

    parser = argparse.ArgumentParser(
        prog="pyinit bench allreduce", description=__doc__.split("\n\n")[0]
    )
    gpus = torch.cuda.device_count()
    parser.add_argument(
        "--nproc",
        type=argtypes.whole(1, 1024),
        default=gpus or 2,
        help="workers (default: GPUs, else 2)",
    )
    parser.add_argument("--min", type=argtypes.size(4), default=8, metavar="SIZE")
    parser.add_argument("--max", type=argtypes.size(4), default=(4 << 30) if gpus else (64 << 20),
                        metavar="SIZE", help="default 4G on GPUs, 64M on CPU")  # fmt: skip
    parser.add_argument("--factor", type=int, choices=(2, 4), default=2)
    parser.add_argument("--iterations", type=argtypes.whole(1, 1_000_000), default=20)
    parser.add_argument("--warmup", type=argtypes.whole(0, 1_000_000), default=5)
    parser.add_argument("--machine", default=os.uname().nodename)
    parser.add_argument("--out", default=".", help="folder for allreduce.json and allreduce.png")
    args = parser.parse_args(argv)
    note_missing("matplotlib", "the PNG", "pyinit bench allreduce")
    sizes = sweep(args.min, args.max, args.factor)
    if not sizes:
        raise ValueError(f"--min {args.min} is above --max {args.max}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)
    rows_file = out / ".allreduce-rows.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(args.nproc), "--no-python", sys.executable, "-P",
        "-m", "pyinit.bench.allreduce", "--sizes", ",".join(map(str, sizes)),
        "--iterations", str(args.iterations), "--warmup", str(args.warmup),
        "--out", str(rows_file), "--progress",
    ]  # fmt: skip
    workers = subprocess.run(command, env=env)
    if workers.returncode != 0:
        print(f"pyinit bench allreduce: the workers failed (torchrun exited with "
              f"{workers.returncode}); see the lines above", file=sys.stderr)  # fmt: skip
        return 1
    document = json.loads(rows_file.read_text())
    rows_file.unlink()
    document.update(machine=args.machine, date=time.strftime("%Y-%m-%d"),
                    iterations=args.iterations, warmup=args.warmup,
                    env={k: env[k] for k in sorted(env) if k.startswith("NCCL_")})  # fmt: skip
    sys.stdout.write(table(document["rows"]))
    write_json(out / "allreduce.json", document)
    plot(document, out / "allreduce.png")
    return 1 if any(r["wrong"] for r in document["rows"]) else 0


# What the lent machines need set in everything started there (NVLink multicast off).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


if __name__ == "__main__":
    sys.exit(worker())
