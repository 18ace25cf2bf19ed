"""Copy bandwidth in nvbandwidth's terms, through torch's copies (the copy
engines): GPU to GPU for every pair, one way and both ways at once, as a
matrix; pinned host memory to and from each GPU.

    pyinit bench p2p [--size 1G] [--iterations 10] [--out DIR]
    pyinit bench h2d [--size 1G] [--iterations 10] [--out DIR]

Timed with CUDA events; GB/s are 1e9 bytes per second. Both write JSON
(p2p.json, h2d.json) and print a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyinit import argtypes
from pyinit.extras import require
from pyinit.jsonfile import write_json


def _timed(torch: Any, copies: list[tuple[Any, Any, Any]], iterations: int) -> float:
    """Seconds for `iterations` rounds of the (dst, src, stream) copies, all
    streams running at once; the slowest stream's time."""
    events = []
    for dst, src, stream in copies:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)  # warm-up: peer mappings, pinned registration
    torch.cuda.synchronize()
    for dst, src, stream in copies:
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(iterations):
                dst.copy_(src, non_blocking=True)
            stop.record(stream)
        events.append((start, stop))
    torch.cuda.synchronize()
    return max(start.elapsed_time(stop) for start, stop in events) / 1e3


def p2p_matrix(size: int, iterations: int) -> dict[str, Any]:
    import torch

    gpus = torch.cuda.device_count()
    buffers = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)]
    received = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)]
    streams = [torch.cuda.Stream(device=g) for g in range(gpus)]
    one_way = [[None] * gpus for _ in range(gpus)]
    both_ways = [[None] * gpus for _ in range(gpus)]
    for a in range(gpus):
        for b in range(gpus):
            if a == b:
                continue
            seconds = _timed(torch, [(received[b], buffers[a], streams[a])], iterations)
            one_way[a][b] = size * iterations / seconds / 1e9
            pair = [(received[b], buffers[a], streams[a]), (received[a], buffers[b], streams[b])]
            seconds = _timed(torch, pair, iterations)
            both_ways[a][b] = 2 * size * iterations / seconds / 1e9
    peer = [[a != b and torch.cuda.can_device_access_peer(a, b) for b in range(gpus)]
            for a in range(gpus)]  # fmt: skip
    return {"gpus": gpus, "size": size, "iterations": iterations, "peer_access": peer,
            "unidirectional_gbs": one_way, "bidirectional_gbs": both_ways}  # fmt: skip


def host_copies(size: int, iterations: int) -> dict[str, Any]:
    import torch

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    rows = []
    for g in range(torch.cuda.device_count()):
        device = torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}")
        stream = torch.cuda.Stream(device=g)
        with torch.cuda.device(g):
            h2d = _timed(torch, [(device, host, stream)], iterations)
            d2h = _timed(torch, [(host, device, stream)], iterations)
        rows.append({"gpu": g, "h2d_gbs": size * iterations / h2d / 1e9,
                     "d2h_gbs": size * iterations / d2h / 1e9})  # fmt: skip
        del device
    return {"size": size, "iterations": iterations, "pinned": True, "rows": rows}


def _matrix_text(title: str, matrix: list[list[float | None]]) -> str:
    gpus = len(matrix)
    lines = [title, "       " + "".join(f"{'GPU' + str(b):>10}" for b in range(gpus))]
    for a in range(gpus):
        cells = "".join(f"{'-' if v is None else f'{v:.1f}':>10}" for v in matrix[a])
        lines.append(f"GPU{a:<4}" + cells)
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kind = parser.get_default("kind")
    parser.add_argument("--size", type=argtypes.size(), default=1 << 30, metavar="SIZE")
    parser.add_argument("--iterations", type=argtypes.whole(1, 1_000_000), default=10)
    parser.add_argument("--out", default=".", metavar="DIR", help=f"folder for {kind}.json")


def main(args: argparse.Namespace) -> int:
    kind = args.kind
    require("torch", f"pyinit bench {kind}")
    import torch

    needed = 2 if kind == "p2p" else 1
    if torch.cuda.device_count() < needed:
        print(f"pyinit bench {kind}: needs {needed} CUDA GPU{'s' if needed > 1 else ''}, "
              f"found {torch.cuda.device_count()}", file=sys.stderr)  # fmt: skip
        return 1
    stamp = {"machine": os.uname().nodename, "date": time.strftime("%Y-%m-%d")}
    if kind == "p2p":
        document = {**stamp, **p2p_matrix(args.size, args.iterations)}
        sys.stdout.write(_matrix_text("one way, GB/s (row copies to column)",
                                      document["unidirectional_gbs"]))  # fmt: skip
        sys.stdout.write(_matrix_text("both ways at once, GB/s (sum)",
                                      document["bidirectional_gbs"]))  # fmt: skip
    else:
        document = {**stamp, **host_copies(args.size, args.iterations)}
        print(f"{'GPU':>4} {'h2d (GB/s)':>11} {'d2h (GB/s)':>11}   pinned host memory")
        for row in document["rows"]:
            print(f"{row['gpu']:>4} {row['h2d_gbs']:>11.1f} {row['d2h_gbs']:>11.1f}")
    write_json(Path(args.out) / f"{kind}.json", document)
    return 0
