"""The timings ``pyinit nccl --tune`` chooses from, measured in each rank of
a torchrun job (``python -m pyinit.nccl.measure``).

Communicator bounds (CTAs) are per communicator in NCCL's config, so each
bound is its own process group in the same job; algorithm, protocol and
channels are per call, forced through pod-init's tuner plugin, which this
process loads before NCCL does (one copy of the library). Every candidate is
timed at every size in each round, rounds interleaved, so a slow minute of a
shared machine spreads over all candidates instead of condemning one.

Every rank takes the same decisions without talking about them: the times
they decide on are averaged over the ranks by an all-reduce, so each rank
holds the same numbers.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyinit import argtypes, torchrun
from pyinit.jsonfile import load_json, write_json
from pyinit.nccl.timing import MULTICAST_OFF, cuda_seconds, nccl_tests_sizes
from pyinit.nccl.tuning import (
    ALGORITHMS,
    DEFAULT,
    PROTOCOLS,
    TABLE_ENV,
    Candidate,
    Timings,
    choose_bound,
    measured_gain,
    plugin_path,
)
from pyinit.termination import run_child

# Per-call pairs worth timing on NVLink nodes (CollNet and NVLS need hardware
# these nodes do not expose with multicast off; PAT is for one GPU per node).
PAIRS = [(a, p) for a in ("ring", "tree") for p in ("simple", "ll128", "ll")]
# A candidate this much slower than the default at one size from 4 MiB up is
# not timed at larger ones (LL at gigabytes would take the whole budget);
# below that, one round's time is too noisy to judge by.
GIVE_UP = 1.5
GIVE_UP_FROM = 4 << 20


class Plugin:
    """The loaded tuner plugin's force switch."""

    def __init__(self, path: str) -> None:
        self._lib = ctypes.CDLL(path)
        self._force = self._lib.pod_init_tuner_force
        self._force.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._unavailable = self._lib.pod_init_tuner_unavailable
        self._unavailable.restype = ctypes.c_long
        self._use_table = self._lib.pod_init_tuner_use_table
        self._use_table.argtypes = [ctypes.c_int]

    def force(self, candidate: Candidate) -> None:
        algorithm = ALGORITHMS.index(candidate.algorithm) if candidate.algorithm else -1
        protocol = PROTOCOLS.index(candidate.protocol) if candidate.protocol else -1
        self._force(algorithm, protocol, candidate.channels)

    def unavailable(self) -> int:
        return int(self._unavailable())

    def use_table(self, enabled: bool) -> None:
        self._use_table(int(enabled))


class Bench:
    """Buffers for the largest size, the calls over them, and the timing."""

    def __init__(self, largest: int, rounds: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.ranks, self.rank = dist.get_world_size(), dist.get_rank()
        self.device = torch.device("cuda", torch.cuda.current_device())
        words = largest // 4
        self.send = torch.empty(words, dtype=torch.float32, device=self.device)
        self.recv = torch.empty(words, dtype=torch.float32, device=self.device)
        self.rounds = rounds

    def call(self, collective: str, size: int, group: Any) -> Callable[[], None]:
        """One out-of-place call of `size` bytes as NCCL counts them (the
        larger buffer, as nccl-tests' size column)."""
        dist, words = self.dist, size // 4
        block = words // self.ranks
        if collective == "allreduce":
            send, recv = self.send[:words], self.recv[:words]
            return lambda: dist.all_reduce(send, group=group)
        if collective == "allgather":
            send, recv = self.send[:block], self.recv[: block * self.ranks]
            return lambda: dist.all_gather_into_tensor(recv, send, group=group)
        send, recv = self.send[: block * self.ranks], self.recv[:block]
        return lambda: dist.reduce_scatter_tensor(recv, send, group=group)

    def wrong(self, collective: str, size: int, group: Any) -> int:
        """Elements wrong after one call on fresh data (rank r contributes r + 1)."""
        torch, words = self.torch, size // 4
        block = words // self.ranks
        total = self.ranks * (self.ranks + 1) / 2
        self.send[:words].fill_(self.rank + 1)
        self.call(collective, size, group)()
        if collective == "allreduce":
            got, expected = self.send[:words], torch.full((words,), total, device=self.device)
        elif collective == "allgather":
            got = self.recv[: block * self.ranks]
            expected = torch.arange(1, self.ranks + 1, device=self.device).repeat_interleave(block)
        else:
            got, expected = self.recv[:block], torch.full((block,), total, device=self.device)
        return int((got != expected.float()).sum().item())

    def seconds(self, call: Callable[[], None], warm: bool) -> float:
        """Seconds per call, averaged over the ranks (so every rank decides alike)."""
        if not warm:
            call()  # NCCL connects an algorithm's channels on first use
        one = cuda_seconds(call, 1)
        # Enough calls for ~2 ms of work: launch jitter stays small against it.
        calls = max(1, min(50, int(0.002 / max(one, 1e-7))))
        mean = self.torch.tensor([cuda_seconds(call, calls)], dtype=self.torch.float64,
                                 device=self.device)  # fmt: skip
        self.dist.all_reduce(mean)
        return float(mean.item()) / self.ranks


def measure_stage(bench: Bench, plugin: Plugin, groups: dict[int, Any], timings: Timings,
                  candidates: list[Candidate], wrong: dict[str, int],
                  deadline: Callable[[], bool]) -> None:  # fmt: skip
    """Times NCCL's default and every candidate at every size of every
    collective, in turns: each round visits each size once and times all
    of them there, starting one further along each round, so neither order
    nor drift favours one. Each candidate's baseline is the default of this
    stage's rounds. A candidate NCCL cannot run (the plugin counts it)
    leaves no cells; one far slower than the default at a large size is not
    timed at larger ones, but keeps all its rounds at smaller ones."""
    turns = [DEFAULT, *(c for c in candidates if c != DEFAULT)]
    unavailable: set[tuple[str, str]] = set()
    gave_up: dict[tuple[str, str], int] = {}
    paired: dict[str, dict[int, list[float]]] = {}  # this stage's default
    for round_index in range(bench.rounds):
        for collective, sizes in timings.sizes.items():
            by_label = timings.samples.setdefault(collective, {})
            for size in sizes:
                if deadline():
                    break
                shift = round_index % len(turns)
                for candidate in turns[shift:] + turns[:shift]:
                    cell = (collective, candidate.label)
                    if cell in unavailable or size > gave_up.get(cell, size):
                        continue
                    group = groups[candidate.ctas]
                    plugin.force(candidate)
                    if candidate.label not in by_label:
                        wrong[" ".join(cell)] = bench.wrong(collective, size, group)
                    call = bench.call(collective, size, group)
                    seconds = bench.seconds(call, warm=round_index > 0)
                    if plugin.unavailable():
                        unavailable.add(cell)
                        by_label.pop(candidate.label, None)
                        continue
                    by_label.setdefault(candidate.label, {}).setdefault(size, []).append(seconds)
                    if candidate == DEFAULT:
                        paired.setdefault(collective, {}).setdefault(size, []).append(seconds)
                    base = timings.median(collective, DEFAULT, size)
                    judged = round_index == 0 and size >= GIVE_UP_FROM and base
                    judged = judged and candidate != DEFAULT  # the reference stays
                    if judged and seconds > GIVE_UP * base:
                        gave_up[cell] = size
    plugin.force(DEFAULT)
    for collective, per_size in paired.items():
        for candidate in turns[1:]:
            if (collective, candidate.label) not in unavailable:
                timings.baseline.setdefault(collective, {})[candidate.label] = per_size


def worker(argv: list[str] | None = None) -> int:
    torchrun.worker_ends_with_it()  # never outlives the torchrun that started it
    parser = argparse.ArgumentParser(prog="python -m pyinit.nccl.measure")
    parser.add_argument("--collectives", default="allreduce")
    parser.add_argument("--min-bytes", type=argtypes.size(), default=64 << 10)
    parser.add_argument("--max-bytes", type=argtypes.size(), default=8 << 30)
    parser.add_argument("--bounds", default="16,24,32", help="communicator CTA bounds to try")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=50.0, help="seconds of measuring")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    plugin = Plugin(os.environ["NCCL_TUNER_PLUGIN"])  # before torch loads NCCL
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    began = time.monotonic()
    groups: dict[int, Any] = {0: dist.group.WORLD}
    for bound in (int(b) for b in args.bounds.split(",") if b):
        options = dist.ProcessGroupNCCL.Options()
        options.config.min_ctas = bound
        options.config.max_ctas = bound
        groups[bound] = dist.new_group(backend="nccl", pg_options=options)
    free, _ = torch.cuda.mem_get_info()
    # Two buffers of the largest size, and room for NCCL's own.
    largest = min(args.max_bytes, 1 << (int(free * 0.4) // 2).bit_length() - 1)
    bench = Bench(largest, args.rounds)
    collectives = args.collectives.split(",")
    sizes = nccl_tests_sizes(args.min_bytes, largest, 2, 0)
    # One node: the tuning is the node's own (a multi-node job adds the network).
    timings = Timings(bench.ranks, 1, {c: sizes for c in collectives}, {})
    wrong: dict[str, int] = {}
    # The same decision on every rank: the deadline is checked on elapsed time
    # agreed by an all-reduce of rank 0's clock.
    clock = torch.zeros(1, dtype=torch.float64, device=bench.device)

    def deadline() -> bool:
        clock.fill_(time.monotonic() - began if bench.rank == 0 else 0.0)
        dist.all_reduce(clock)
        return float(clock.item()) > args.budget

    # Clocks and NCCL's connections come up under load, not at the first timing.
    warm = bench.call(collectives[0], largest, dist.group.WORLD)
    for _ in range(10):
        warm()
    torch.cuda.synchronize()
    stage1 = [DEFAULT, *(Candidate(bound) for bound in groups if bound)]
    measure_stage(bench, plugin, groups, timings, stage1, wrong, deadline)
    bound = choose_bound(timings)
    pairs = [Candidate(bound, a, p) for a, p in PAIRS]
    measure_stage(bench, plugin, groups, timings, pairs, wrong, deadline)
    channels = [c for c in (4, 8, 16, 24) if not bound or c < bound]
    best_pairs = {_best_pair(timings, c, bound) for c in collectives} - {None}
    variants = [Candidate(bound, p.algorithm, p.protocol, ch) for p in best_pairs
                for ch in channels]  # fmt: skip
    measure_stage(bench, plugin, groups, timings, variants, wrong, deadline)
    if bench.rank == 0:
        write_json(args.out, {
            "timings": timings.to_dict(),
            "wrong": wrong,
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            "seconds": time.monotonic() - began,
            "largest": largest,
        })  # fmt: skip
    dist.destroy_process_group()
    return 0


def _best_pair(timings: Timings, collective: str, bound: int) -> Candidate | None:
    """The forced pair under `bound` with the most sizes faster than NCCL's
    own choice under it, each measured against the default of its own rounds."""

    def gain(c: Candidate, size: int) -> float:
        return measured_gain(timings, collective, c, size)[0]

    scores: dict[Candidate, int] = {}
    for label in timings.samples.get(collective, {}):
        c = Candidate.parse(label)
        if c.ctas == bound and c.algorithm is not None and not c.channels:
            sizes = timings.sizes[collective]
            scores[c] = sum(gain(c, s) > gain(Candidate(bound), s) for s in sizes)
    return max(scores, key=lambda c: (scores[c], c.label), default=None)


class MeasurementFailed(RuntimeError):
    """The ranks failed, or NCCL gave wrong results: the node, not the input."""


@dataclass(frozen=True)
class Measurement:
    timings: Timings
    wrong: dict[str, int]  # "collective candidate" -> elements wrong on first use
    nccl_version: str  # what NCCL said in the ranks
    seconds: float  # from the first communicator to the last timing


def run(gpus: int, *, collectives: list[str], budget: float, min_bytes: int, max_bytes: int,
        bounds: list[int], rounds: int = 5) -> Measurement:  # fmt: skip
    """Times the candidates on this node's `gpus` GPUs, one rank each, under
    torchrun. MeasurementFailed (with torchrun's status) when the ranks fail."""
    env = {**MULTICAST_OFF, **os.environ, "NCCL_TUNER_PLUGIN": str(plugin_path())}
    env.pop(TABLE_ENV, None)  # the measurement forces; no table may interfere
    with tempfile.TemporaryDirectory(prefix="pyinit-tune-") as folder:
        out = os.path.join(folder, "timings.json")
        log = os.path.join(folder, "ranks.log")
        command = torchrun.command([
            # --log-dir: torchrun's default is a new /tmp folder that outlives it
            "--standalone",
            "--log-dir", os.path.join(folder, "torchrun"),
            "--nproc-per-node", str(gpus), "--no-python", sys.executable, "-P",
            "-m", "pyinit.nccl.measure", "--collectives", ",".join(collectives),
            "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes),
            "--bounds", ",".join(map(str, bounds)), "--rounds", str(rounds),
            "--budget", str(budget), "--out", out,
        ])  # fmt: skip
        with open(log, "wb") as output:
            ranks = run_child(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        if ranks.returncode != 0 or not os.path.exists(out):
            raise MeasurementFailed(f"the measuring ranks failed (torchrun exited with "
                                    f"{ranks.returncode}): {_first_error(log)}")  # fmt: skip
        with open(out, encoding="utf-8") as f:
            raw = load_json(f.read(), out)
    return Measurement(Timings.from_dict(raw["timings"], out), dict(raw["wrong"]),
                       str(raw["nccl_version"]), float(raw["seconds"]))  # fmt: skip


def _first_error(log: str) -> str:
    """The ranks' first error line (Python's or NCCL's), for a one-line message."""
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f]
    for line in lines:
        if re.match(r"(\[rank\d+\]: )?\w+(Error|Exception): ", line) or "NCCL WARN" in line:
            return line
    return next((line for line in reversed(lines) if line), "no output")


if __name__ == "__main__":
    sys.exit(worker())
