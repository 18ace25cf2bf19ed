"""Collective bandwidth the way nccl-tests reports it, through torch.distributed
(NCCL on GPUs, gloo on CPU).

    pyinit bench allreduce -b 8 -e 4G -f 2 -g 2     # like all_reduce_perf -b 8 -e 4G -f 2 -g 2
    pyinit bench allgather | reducescatter | alltoall | broadcast  [the same flags]

runs the size sweep with one worker per GPU (two gloo workers without GPUs)
under torchrun, prints nccl-tests' table (out-of-place and in-place columns,
``# Avg bus bandwidth``) and writes NAME.json (nccl-tests' -J field names) and
NAME.png (busbw against size). The worker alone, as other tools use it::

    torchrun --nproc-per-node 2 -m pyinit.bench.collectives all_reduce --sizes 1G,4G --out rows.json

Sizes, counts, algbw and busbw follow nccl-tests: the size given is the
largest buffer a rank touches, rounded per collective as nccl-tests rounds it;
busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather,
reduce-scatter and all-to-all, x 1 for broadcast (1e9 bytes per GB). Each rank
fills its data with rank + 1, so every result element is known; those that
differ are counted in #wrong. torch.distributed has no out-of-place all-reduce
or broadcast and no in-place all-to-all: those columns read N/A.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinit import argtypes, torchrun
from pyinit.errors import InputError
from pyinit.extras import note_missing, require
from pyinit.jsonfile import write_json
from pyinit.nccl.timing import MULTICAST_OFF, cuda_seconds, nccl_tests_sizes
from pyinit.plotting import bytes_axis, human_bytes, pyplot, save_figure
from pyinit.termination import run_child

# nccl-tests' -d names and their element sizes; torch's dtype by the same name.
DATATYPES = {
    "int8": 1, "uint8": 1, "int32": 4, "int64": 8,
    "half": 2, "float": 4, "double": 8, "bfloat16": 2,
}  # fmt: skip
TORCH_DTYPES = {"half": "float16", "float": "float32", "double": "float64"}
# nccl-tests' -o names; "avg" is NCCL's alone (gloo has no average).
OPS = ("sum", "prod", "max", "min", "avg")


@dataclass(frozen=True)
class Collective:
    name: str  # nccl-tests' binary without _perf
    command: str  # the `pyinit bench` subcommand
    title: str
    bus_factor: Callable[[int], float]
    reduces: bool  # takes -o
    rooted: bool  # takes -r
    out_of_place: bool  # torch.distributed has a call for it
    in_place: bool
    per_rank_split: bool  # the size is split into one block per rank

    def counts(self, size: int, word: int, ranks: int) -> tuple[int, int, int]:
        """(send, receive, parameter) element counts for a `size`-byte step,
        rounded as nccl-tests rounds them (blocks of 16 bytes per rank)."""
        count = size // word
        if not self.per_rank_split:
            return count, count, count
        block = (count // ranks) & ~(16 // word - 1)
        if self.name == "all_gather":
            return block, block * ranks, block
        if self.name == "reduce_scatter":
            return block * ranks, block, block
        return block * ranks, block * ranks, block  # alltoall

    def algbw_bytes(self, count: int, word: int, ranks: int) -> int:
        """The bytes algbw divides by the time: the whole result for the split ones."""
        return count * word * (ranks if self.per_rank_split else 1)


COLLECTIVES = {
    c.command: c
    for c in (
        Collective("all_reduce", "allreduce", "all-reduce", lambda n: 2 * (n - 1) / n,
                   True, False, False, True, False),
        Collective("all_gather", "allgather", "all-gather", lambda n: (n - 1) / n,
                   False, False, True, True, True),
        Collective("reduce_scatter", "reducescatter", "reduce-scatter", lambda n: (n - 1) / n,
                   True, False, True, True, True),
        Collective("alltoall", "alltoall", "all-to-all", lambda n: (n - 1) / n,
                   False, False, True, False, True),
        Collective("broadcast", "broadcast", "broadcast", lambda n: 1.0,
                   False, True, False, True, False),
    )
}  # fmt: skip
BY_NAME = {c.name: c for c in COLLECTIVES.values()}


@dataclass(frozen=True)
class TunedSide:
    """The tuned side of a comparison: the group built with the table's
    communicator bound, and the plugin's switch for the table."""

    group: Any
    use_table: Callable[[bool], None]
    rounds: int


class _Sweep:
    """One process's side of a sweep: the buffers, calls and checks of each
    cell, in an initialised process group."""

    def __init__(self, collective: Collective, datatype: str, op: str, root: int,
                 iterations: int, warmup: int) -> None:  # fmt: skip
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.collective, self.datatype, self.op, self.root = collective, datatype, op, root
        self.iterations, self.warmup = iterations, warmup
        self.ranks, self.rank = dist.get_world_size(), dist.get_rank()
        self.cuda = torch.cuda.is_available()
        self.device = (torch.device("cuda", torch.cuda.current_device()) if self.cuda
                       else torch.device("cpu"))  # fmt: skip
        self.dtype = getattr(torch, TORCH_DTYPES.get(datatype, datatype))
        self.word = DATATYPES[datatype]
        self.reduce_op = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                          "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
                          "avg": dist.ReduceOp.AVG}[op]  # fmt: skip
        values = list(range(1, self.ranks + 1))
        reduced = {"sum": sum(values), "prod": math.prod(values), "max": self.ranks, "min": 1,
                   "avg": sum(values) / self.ranks}[op]  # fmt: skip
        # NCCL's integer average truncates.
        integer = datatype not in ("half", "float", "double", "bfloat16")
        self.reduced = int(reduced) if integer else reduced

    def full(self, count: int, value: float) -> Any:
        return self.torch.full((count,), value, dtype=self.dtype, device=self.device)

    def blocks(self, per_block: int) -> Any:
        """Block i holds i + 1: what an all-gather or all-to-all must deliver."""
        ranks = self.torch.arange(1, self.ranks + 1, device=self.device)
        return ranks.repeat_interleave(per_block).to(self.dtype)

    def setup(self, in_place: bool, send_n: int, recv_n: int, block: int, group: Any = None):
        """(the call, the buffer to check, the expected values) for one mode."""
        dist, full, name, root = self.dist, self.full, self.collective.name, self.root
        mine = float(self.rank + 1)
        if name == "all_reduce":
            work = full(send_n, mine)
            call = lambda: dist.all_reduce(work, op=self.reduce_op, group=group)  # noqa: E731
            return call, work, full(send_n, self.reduced)
        if name == "broadcast":
            work = full(send_n, float(root + 1) if self.rank == root else 0.0)
            call = lambda: dist.broadcast(work, src=root, group=group)  # noqa: E731
            return call, work, full(send_n, float(root + 1))
        mine_block = slice(self.rank * block, (self.rank + 1) * block)
        if name == "all_gather":
            out = full(recv_n, mine if in_place else 0.0)
            send = out[mine_block] if in_place else full(send_n, mine)
            call = lambda: dist.all_gather_into_tensor(out, send, group=group)  # noqa: E731
            return call, out, self.blocks(block)
        if name == "reduce_scatter":
            send = full(send_n, mine)
            out = send[mine_block] if in_place else full(recv_n, 0.0)
            call = lambda: dist.reduce_scatter_tensor(out, send, op=self.reduce_op,  # noqa: E731
                                                      group=group)  # fmt: skip
            return call, out, full(recv_n, self.reduced)
        send, out = full(send_n, mine), full(recv_n, 0.0)
        return lambda: dist.all_to_all_single(out, send, group=group), out, self.blocks(block)

    def timed(self, call: Callable[[], None]) -> float:
        """Mean seconds per call, back to back like nccl-tests, averaged over the ranks."""
        for _ in range(self.warmup):
            call()
        if self.cuda:
            seconds = cuda_seconds(call, self.iterations)
        else:
            began = time.perf_counter()
            for _ in range(self.iterations):
                call()
            seconds = (time.perf_counter() - began) / self.iterations
        mean = self.torch.tensor([seconds], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(mean)
        return float(mean.item()) / self.ranks

    def cell(self, count: int, seconds: float, wrong: int) -> dict[str, Any]:
        moved = self.collective.algbw_bytes(count, self.word, self.ranks)
        algbw = moved / seconds / 1e9 if seconds else 0.0
        busbw = algbw * self.collective.bus_factor(self.ranks)
        return {"time": seconds * 1e6, "alg_bw": algbw, "bus_bw": busbw, "nwrong": wrong}

    def checked(self, counts: tuple[int, int, int], in_place: bool, group: Any = None):
        """The call, and the elements it got wrong once on fresh data (the
        timed calls after it reuse the buffers; their values no longer matter)."""
        call, result, expected = self.setup(in_place, *counts, group)
        call()
        return call, int((result != expected).sum().item())

    def compared(self, counts: tuple[int, int, int], in_place: bool,
                 side: TunedSide) -> dict[str, Any]:  # fmt: skip
        """NCCL's default and the table in turns, round after round, so a
        noisy minute falls on both sides alike."""
        side.use_table(False)
        default_call, default_wrong = self.checked(counts, in_place)
        side.use_table(True)
        tuned_call, tuned_wrong = self.checked(counts, in_place, side.group)
        default_times, tuned_times = [], []
        for _ in range(side.rounds):
            side.use_table(False)
            default_times.append(self.timed(default_call))
            side.use_table(True)
            tuned_times.append(self.timed(tuned_call))
        result = self.cell(counts[2], statistics.median(default_times), default_wrong)
        result["tuned"] = self.cell(counts[2], statistics.median(tuned_times), tuned_wrong)
        # Times, not bandwidths: one rank moves no bus bytes, yet takes time.
        tuned_time = result["tuned"]["time"]
        result["gain"] = result["time"] / tuned_time if tuned_time else 0.0
        return result

    def row(self, size: int, tuned: TunedSide | None) -> dict[str, Any]:
        """nccl-tests' row for one size: each mode the collective has, timed and checked."""
        collective = self.collective
        counts = collective.counts(size, self.word, self.ranks)
        send_n, recv_n, count = counts
        row: dict[str, Any] = {
            "size": max(send_n, recv_n) * self.word, "count": count, "type": self.datatype,
            "redop": self.op if collective.reduces else "none",
            "root": self.root if collective.rooted else -1,
        }  # fmt: skip
        for mode, supported in (("out_of_place", collective.out_of_place),
                                ("in_place", collective.in_place)):  # fmt: skip
            if not supported:
                row[mode] = None
            elif tuned is None:
                call, wrong = self.checked(counts, mode == "in_place")
                row[mode] = self.cell(count, self.timed(call), wrong)
                del call
            else:
                row[mode] = self.compared(counts, mode == "in_place", tuned)
        return row


def measure(
    collective: Collective,
    sizes: list[int],
    datatype: str,
    op: str,
    root: int,
    iterations: int,
    warmup: int,
    progress: Callable[[dict[str, Any]], None] | None = None,
    tuned: TunedSide | None = None,
) -> list[dict[str, Any]]:
    """Inside an initialised process group: one nccl-tests row per size.
    ``tuned``: each cell is NCCL's default (the world group, table off) and,
    under ``tuned``, the table's choices, timed in turns."""
    sweep = _Sweep(collective, datatype, op, root, iterations, warmup)
    rows = []
    for size in sizes:
        rows.append(sweep.row(size, tuned))
        if progress is not None:
            progress(rows[-1])
    return rows


def worker(argv: list[str] | None = None) -> int:
    torchrun.worker_ends_with_it()  # never outlives the torchrun that started it
    parser = argparse.ArgumentParser(prog="python -m pyinit.bench.collectives")
    parser.add_argument("collective", choices=sorted(BY_NAME))
    parser.add_argument("--sizes", default="1G", help="comma-separated: 8,64K,1G")
    parser.add_argument("-d", "--datatype", choices=list(DATATYPES), default="float")
    parser.add_argument("-o", "--op", choices=OPS, default="sum")
    parser.add_argument("-r", "--root", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", help="rank 0 writes the rows here as JSON")
    parser.add_argument("--progress", action="store_true", help="rank 0: a line per size")
    parser.add_argument("--tuning-bound", type=int, help="compare with the tuning: its CTA bound")
    parser.add_argument("--rounds", type=int, default=5, help="turns of default and tuned")
    args = parser.parse_args(argv)
    collective = BY_NAME[args.collective]
    sizes = [argtypes.size()(s) for s in args.sizes.split(",")]
    lead = int(os.environ.get("RANK", "0")) == 0
    done: list[dict] = []

    def progress(row: dict) -> None:
        done.append(row)
        if args.progress and lead:
            best = max(row[m]["bus_bw"] for m in ("out_of_place", "in_place") if row[m])
            print(f"{collective.command} [{len(done)}/{len(sizes)}] {human_bytes(row['size'])}: "
                  f"busbw {best:.2f} GB/s", file=sys.stderr, flush=True)  # fmt: skip

    plugin = None
    if args.tuning_bound is not None:
        from pyinit.nccl.measure import Plugin

        plugin = Plugin(os.environ["NCCL_TUNER_PLUGIN"])  # before torch loads NCCL
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    tuned = None
    if plugin is not None:
        group = dist.group.WORLD
        if args.tuning_bound:
            options = dist.ProcessGroupNCCL.Options()
            options.config.min_ctas = options.config.max_ctas = args.tuning_bound
            group = dist.new_group(backend="nccl", pg_options=options)
        tuned = TunedSide(group, plugin.use_table, args.rounds)
    try:
        rows = measure(collective, sizes, args.datatype, args.op, args.root, args.iterations,
                       args.warmup, progress, tuned)  # fmt: skip
    finally:
        dist.destroy_process_group()
    if lead:
        backend = dist.Backend.NCCL if cuda else dist.Backend.GLOO
        document = {"collective": collective.name, "ranks": int(os.environ.get("WORLD_SIZE", "1")),
                    "backend": str(backend), "results": rows}  # fmt: skip
        text = json.dumps(document, indent=2) + "\n"
        if args.out:
            Path(args.out).write_text(text)
        else:
            sys.stdout.write(text)
    return 0


def average_busbw(rows: list[dict]) -> float:
    """nccl-tests' `# Avg bus bandwidth`: the mean over every measured cell."""
    cells = [row[m]["bus_bw"] for row in rows for m in ("out_of_place", "in_place") if row[m]]
    return sum(cells) / len(cells) if cells else 0.0


def wrong_total(rows: list[dict]) -> int:
    cells = [row[m] for row in rows for m in ("out_of_place", "in_place") if row[m]]
    return sum(c["nwrong"] + (c["tuned"]["nwrong"] if "tuned" in c else 0) for c in cells)


def _float_cell(value: float, width: int) -> str:
    """nccl-tests' number cells: two decimals, fewer when the value is wide."""
    for text in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}"


def tuned_table(document: dict) -> str:
    """NCCL's default beside the tuning, size by size, with the gain."""
    tuning = document["tuning"]
    lines = [
        f"# {document['collective']}, {document['ranks']} ranks over NCCL: NCCL's default "
        f"against the tuning in {tuning['table']}",
        f"# (key {tuning['key']}, CTA bound {tuning['bound'] or 'NCCL'}'s, "
        f"{tuning['rounds']} rounds in turns, medians)",
        f"# {'size':>10}  {'mode':>12}  {'default':>8}  {'tuned':>8}  {'gain':>6}  {'#wrong':>6}",
        f"# {'(B)':>10}  {'':>12}  {'(GB/s)':>8}  {'(GB/s)':>8}  {'':>6}  {'':>6}",
    ]
    for row in document["results"]:
        for mode in ("out_of_place", "in_place"):
            cell = row[mode]
            if cell is None:
                continue
            wrong = cell["nwrong"] + cell["tuned"]["nwrong"]
            lines.append(f"{row['size']:>12}  {mode.replace('_', '-'):>12}  "
                         f"{_float_cell(cell['bus_bw'], 8)}  "
                         f"{_float_cell(cell['tuned']['bus_bw'], 8)}  {cell['gain']:6.3f}  "
                         f"{wrong:>6}")  # fmt: skip
    gains = [row[m]["gain"] for row in document["results"] for m in ("out_of_place", "in_place")
             if row[m]]  # fmt: skip
    lines += _footer(document["results"], f"{'Gain, lowest':<20} : {min(gains):.3f}")
    return "\n".join(lines) + "\n"


def _footer(rows: list[dict], summary: str) -> list[str]:
    """nccl-tests' closing lines: the wrong values, then one summary line."""
    wrong = wrong_total(rows)
    return [f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
            f"# {summary}", "#"]  # fmt: skip


def table(document: dict) -> str:
    """The sweep as nccl-tests prints it, header, rows and footer."""
    lines = [
        f"# {document['collective']} through torch.distributed ({document['backend']}), "
        f"{document['ranks']} ranks, one process per rank",
        "#",
        f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place"
        f"                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  "
        f"{'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  "
        f"{'#wrong':>6}",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  "
        f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}",
    ]
    for row in document["results"]:
        line = (f"{row['size']:>12}  {row['count']:>12}  {row['type']:>8}  {row['redop']:>6}  "
                f"{row['root']:>6}")  # fmt: skip
        for mode in ("out_of_place", "in_place"):
            cell = row[mode]
            if cell is None:
                line += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
            else:
                line += (f"  {_float_cell(cell['time'], 7)}  {_float_cell(cell['alg_bw'], 6)}  "
                         f"{_float_cell(cell['bus_bw'], 6)}  {cell['nwrong']:>6}")  # fmt: skip
        lines.append(line)
    average = average_busbw(document["results"])
    lines += _footer(document["results"], f"{'Avg bus bandwidth':<20} : {average:g} ")
    return "\n".join(lines) + "\n"


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = document["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, label in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
        points = [(r["size"], r[mode]["bus_bw"]) for r in rows if r[mode] and r["size"]]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
        tuned = [(r["size"], r[mode]["tuned"]["bus_bw"]) for r in rows
                 if r[mode] and r["size"] and "tuned" in r[mode]]  # fmt: skip
        if tuned:
            ax.plot(*zip(*tuned, strict=True), marker="s", linestyle="--", label=f"{label}, tuned")
    bytes_axis(ax)
    ax.set_xlabel("message size (largest buffer per rank)")
    ax.set_ylabel("bus bandwidth, GB/s")
    collective = BY_NAME[document["collective"]]
    backend = document["backend"].upper()
    ax.set_title(f"{collective.title} bus bandwidth, {document['ranks']} ranks over {backend}\n"
                 f"{document['machine']}, {document['date']}")  # fmt: skip
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' flags (and long names) for the collective the parser's
    ``kind`` default names: -o only where it reduces, -r where it has a root.
    Nothing here imports torch, so --help is instant and needs no torch."""
    command = parser.get_default("kind")
    collective = COLLECTIVES[command]
    parser.description = (f"{collective.title} size sweep in nccl-tests' flags and columns "
                          f"(like {collective.name}_perf)")  # fmt: skip
    size = argtypes.size(1)
    parser.add_argument("-b", "--minbytes", "--min", type=size, default=8, metavar="SIZE",
                        help="smallest size")  # fmt: skip
    parser.add_argument("-e", "--maxbytes", "--max", type=size, metavar="SIZE",
                        help="largest size (default: 4G with GPUs, 64M without)")  # fmt: skip
    parser.add_argument("-f", "--stepfactor", "--factor", type=argtypes.whole(1, 1 << 20),
                        default=2, help="multiply the size by this; 1: add -i instead")  # fmt: skip
    parser.add_argument("-i", "--stepbytes", type=size, default=1 << 20, metavar="SIZE",
                        help="what to add when -f is 1")  # fmt: skip
    parser.add_argument("-g", "--ngpus", "--nproc", type=argtypes.whole(1, 1024),
                        help="ranks (default: every GPU, or 2 on CPU)")  # fmt: skip
    parser.add_argument("-n", "--iters", "--iterations", type=argtypes.whole(1, 1_000_000),
                        default=20, help="timed calls per size and mode")  # fmt: skip
    parser.add_argument("-w", "--warmup_iters", "--warmup", type=argtypes.whole(0, 1_000_000),
                        default=5, help="untimed calls before them")  # fmt: skip
    parser.add_argument("-d", "--datatype", choices=list(DATATYPES), default="float")
    if collective.reduces:
        parser.add_argument("-o", "--op", choices=OPS, default="sum")
    if collective.rooted:
        parser.add_argument("-r", "--root", type=argtypes.whole(0, 1023), default=0)
    parser.add_argument("--machine", default=os.uname().nodename, help="named in the plot")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help=f"folder for {command}.json and {command}.png")  # fmt: skip
    parser.add_argument("--tuning", metavar="TABLE",
                        help="time NCCL's default and this tuning table (pyinit nccl --tune's "
                        "nccl-tuning.json) in turns, size by size")  # fmt: skip
    parser.add_argument("--rounds", type=argtypes.whole(1, 1000), default=5,
                        help="with --tuning: turns of each side per size (medians)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    """`pyinit bench KIND`: the sweep under torchrun, then the table and files."""
    command = args.kind
    require("torch", f"pyinit bench {command}")
    import torch

    gpus = torch.cuda.device_count()
    args.maxbytes = args.maxbytes or ((4 << 30) if gpus else (64 << 20))
    args.ngpus = args.ngpus or gpus or 2
    if gpus and args.ngpus > gpus:
        raise InputError(f"-g {args.ngpus}: this node has {gpus} GPU{'s' if gpus > 1 else ''}")
    collective = COLLECTIVES[command]
    op, root = getattr(args, "op", "sum"), getattr(args, "root", 0)
    if op == "avg" and not gpus:
        raise InputError("-o avg needs NCCL: gloo has no average (run it on GPUs)")
    if root >= args.ngpus:
        raise InputError(f"-r {root} is not a rank of {args.ngpus}")
    if args.minbytes > args.maxbytes:
        raise InputError(f"-b {args.minbytes} is above -e {args.maxbytes}")
    note_missing("matplotlib", "the PNG", f"pyinit bench {command}")
    sizes = nccl_tests_sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)
    tuning = _tuning_options(args.tuning, gpus, env) if args.tuning else []
    rows_file = out / f".{command}-rows.json"
    # torchrun's log folder, which it would otherwise leave in /tmp
    with tempfile.TemporaryDirectory(prefix="pyinit-bench-") as logs:
        worker_command = torchrun.command([
            "--standalone", "--log-dir", logs,
            "--nproc-per-node", str(args.ngpus), "--no-python", sys.executable, "-P",
            "-m", "pyinit.bench.collectives", collective.name,
            "--sizes", ",".join(map(str, sizes)), "-d", args.datatype, "-o", op, "-r", str(root),
            "--iterations", str(args.iters), "--warmup", str(args.warmup_iters),
            "--out", str(rows_file), "--progress", "--rounds", str(args.rounds), *tuning,
        ])  # fmt: skip
        workers = run_child(worker_command, env=env)
    if workers.returncode != 0:
        print(f"pyinit bench {command}: the workers failed (torchrun exited with "
              f"{workers.returncode}); see the lines above", file=sys.stderr)  # fmt: skip
        return 1
    document = json.loads(rows_file.read_text())
    rows_file.unlink()
    document.update(machine=args.machine, date=time.strftime("%Y-%m-%d"),
                    iterations=args.iters, warmup=args.warmup_iters,
                    env={k: env[k] for k in sorted(env) if k.startswith("NCCL_")})  # fmt: skip
    if args.tuning:
        from pyinit.nccl.tuning import read_table

        table_of = read_table(args.tuning)
        document["tuning"] = {"table": args.tuning, "key": table_of.key.id,
                              "bound": table_of.bound, "rounds": args.rounds}  # fmt: skip
    sys.stdout.write(tuned_table(document) if args.tuning else table(document))
    write_json(out / f"{command}.json", document)
    plot(document, out / f"{command}.png")
    return 1 if wrong_total(document["results"]) else 0


def _tuning_options(path: str, gpus: int, env: dict[str, str]) -> list[str]:
    """The workers' options (and the plugin in their env) for comparing a
    tuning table with NCCL's default; InputError for a table that does not
    fit this NCCL."""
    from pyinit.nccl.tuning import TABLE_ENV, installed_nccl_version, plugin_path, read_table

    if not gpus:
        raise InputError("--tuning compares NCCL's choices: it needs GPUs")
    tuning = read_table(path)
    version = installed_nccl_version()
    if version is not None and version != tuning.key.nccl_version:
        raise InputError(f"measured with NCCL {tuning.key.nccl_version}, this is NCCL {version}",
                         file=path)  # fmt: skip
    env.update(NCCL_TUNER_PLUGIN=str(plugin_path()), **{TABLE_ENV: str(Path(path).resolve())})
    return ["--tuning-bound", str(tuning.bound)]


if __name__ == "__main__":
    sys.exit(worker())
