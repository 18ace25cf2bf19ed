"""All-reduce bandwidth the way nccl-tests reports it, through torch.distributed.

Run one worker per GPU under torchrun::

    torchrun --nproc-per-node 2 -m pyinit.bench.allreduce --sizes 1G,4G --out result.json

Each rank fills its buffer with rank + 1, so every element of the result must
equal n(n+1)/2; elements that do not are counted in ``wrong``. algbw is bytes
per second of the timed call (1e9 bytes per GB); busbw = algbw x 2(n-1)/n.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

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


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1G`` -> bytes."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in UNITS and not text[-1:].isdigit() else ""
    number = text[: len(text) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(number) * UNITS[unit]


def bus_factor(ranks: int) -> float:
    return 2 * (ranks - 1) / ranks if ranks > 1 else 1.0


def measure(sizes: list[int], iterations: int, warmup: int) -> list[AllreduceRow]:
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
        rows.append(
            AllreduceRow(
                count * 4, count, "float32", seconds * 1e6, algbw, algbw * bus_factor(ranks), wrong
            )
        )
        del work
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyinit.bench.allreduce")
    parser.add_argument("--sizes", default="1G", help="comma-separated: 8,64K,1G")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", help="rank 0 writes the rows here as JSON")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rows = measure(sizes, args.iterations, args.warmup)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        document = {"ranks": ranks, "rows": [asdict(r) for r in rows]}
        text = json.dumps(document, indent=2) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
