"""``torch.compile``'s work in a worker, as phases of the run's event log:
what a compiled script's first step (or a restarted one's) spends before it
computes anything.

torch tells whoever registers with ``torch._dynamo.callback`` when each
compile begins and ends: a frame that dynamo traces and hands to its backend
(inductor), and a backward graph compiled when it is first needed. Inside a
compile, torch's own timers (``compilation_time_metrics``) say how long the
backend took, and its counters how many graphs were made and how many of
inductor's and AOTAutograd's cache lookups hit. Each compile becomes:

- ``compile: dynamo``: tracing the frame's bytecode into a graph (the
  compile's time less its backend's; the backend runs at its end);
- ``compile: inductor``: the backend, which compiles the graph or loads it
  from the cache, with the graph and cache counts as fields, and the seconds
  AOTAutograd spent tracing and partitioning (what its cache would answer);
- ``compile: backward``: a backward graph compiled on first use.

Autotuning (picking kernel configurations by timing them) runs inside the
backend or at a kernel's first launch; its seconds, and the totals, go in one
``compile summary`` event per rank when the first step is done. Compiles after
that (a recompile at step 500) are counted in the summary at the worker's end,
not drawn as phases: the timeline is about the first step.

The callbacks are registered when the script first calls ``torch.compile``,
which imports dynamo itself: a worker that never compiles pays nothing.

Portable caches: inductor and AOTAutograd keep what they compile on the
node's disk, so a restarted group on the same node compiles nothing again.
A node that joins later (a replaced node, a restart on new nodes) has none of
it. Global rank 0 saves torch's portable caches
(``torch.compiler.save_cache_artifacts``) once its first step is done, into
the file pyinit run names (``--compile-cache``, a folder the nodes share, else
the run folder), unless one is there already; every worker loads that file
into its node's caches (``load_cache_artifacts``) before the script runs, so
its first compile finds every graph there. Those artifacts are compiled code:
a file another user owns, or that others may write, is refused.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinit.jsonfile import write_bytes
from pyinit.run.pattern_setup import setups_done
from pyinit.runlog.events import boottime
from pyinit.say import say

# Where a worker finds the portable caches' file (set by pyinit run), and its name.
COMPILE_CACHE_ENV, COMPILE_CACHE_FILE = "PYINIT_COMPILE_CACHE_FILE", "compile-cache.bin"
# torch's timer around the backend (inductor) of one compile.
BACKEND_METRIC = "OutputGraph.call_user_compiler"
# torch's timers of AOTAutograd's own work inside the backend: the metadata
# pass, tracing the joint graph, inductor's joint-graph passes and the
# partition. A hit in AOTAutograd's cache skips all four, so for a graph past
# that cache they are what every start pays again (0.77 s of a 1.35 s compile
# on an H100 node).
AOT_TRACE_METRICS = (
    "aot_collect_metadata",
    "aot_trace_joint_graph",
    "_recursive_joint_graph_passes",
    "min_cut_rematerialization_partition",
)
# Counters (category, key) of torch._dynamo.utils.counters, by the field name used here.
COUNTERS = {
    "graphs": ("stats", "unique_graphs"),
    "inductor_cache_hits": ("inductor", "fxgraph_cache_hit"),
    "inductor_cache_misses": ("inductor", "fxgraph_cache_miss"),
    "aot_cache_hits": ("aot_autograd", "autograd_cache_hit"),
    "aot_cache_misses": ("aot_autograd", "autograd_cache_miss"),
    # Graphs AOTAutograd would not cache, traced again at every start (DDP's
    # pieces of a compiled module where pyinit.run.ddp_pieces is off).
    "aot_cache_bypasses": ("aot_autograd", "autograd_cache_bypass"),
}


def _autotuning(name: str) -> bool:
    """torch's timers of autotuning: inductor's template autotuning and
    precompiling, and triton's benchmarking of kernel configurations."""
    return "autotun" in name or "benchmark_all_configs" in name or "template_precompiling" in name


def once_dynamo_is_imported(torch: Any, action: Callable[[], None]) -> None:
    """`action` now if dynamo is imported already (as in a worker forked with
    the preloads), else at the script's first torch.compile, before it runs."""
    if "torch._dynamo" in sys.modules:
        action()
        return
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile_then(*args: Any, **kwargs: Any) -> Any:
        torch.compile = compile_
        action()
        return compile_(*args, **kwargs)

    torch.compile = compile_then


class CompileMarks:
    """The compiles of one worker, written through `phase(name, start, end,
    **fields)` and `event(kind, **fields)`."""

    def __init__(self, phase: Callable[..., None], event: Callable[..., None],
                 on_first_compile: Callable[[], None] = lambda: None,
                 save_to: Path | None = None):  # fmt: skip
        self.phase = phase
        self.event = event
        self.save_to = save_to  # the portable caches' file, when this rank saves them
        self.on_first_compile = on_first_compile  # told at the first compile's start
        self.installed = False
        self.first_step_done = False
        self.compiles = 0  # every compile since the callbacks were registered
        self.began = 0.0
        self.at_start: dict[str, float] = {}
        self.at_install: dict[str, float] = {}

    def install(self) -> None:
        if self.installed:
            return
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # a torch without compile callbacks: no compile phases
            return
        self.installed = True
        self.at_install = self.snapshot()
        callback_handler.register_start_callback(self._started)
        callback_handler.register_end_callback(self._ended)

    @staticmethod
    def snapshot() -> dict[str, float]:
        from torch._dynamo.utils import compilation_time_metrics, counters

        figures: dict[str, float] = {
            field: float(counters[group][key]) for field, (group, key) in COUNTERS.items()
        }
        figures["backend_s"] = sum(compilation_time_metrics.get(BACKEND_METRIC, ()))
        figures["aot_trace_s"] = sum(sum(compilation_time_metrics.get(name, ()))
                                     for name in AOT_TRACE_METRICS)  # fmt: skip
        metrics = compilation_time_metrics.items()
        tuned = [sum(times) for name, times in metrics if _autotuning(name)]
        figures["autotune_s"] = sum(tuned)
        return figures

    def _started(self, *_args: Any) -> None:
        self.began = boottime()
        self.at_start = self.snapshot()
        if not self.compiles:
            self.on_first_compile()

    def _ended(self, *args: Any) -> None:
        ended = boottime()
        self.compiles += 1
        if self.first_step_done or not self.at_start:
            return
        now = self.snapshot()
        grew = {field: round(now[field] - self.at_start[field], 6) for field in now}
        trigger = getattr(getattr(args[0], "callback_trigger", None), "name", "") if args else ""
        counts = {field: int(grew[field]) for field in COUNTERS}
        if trigger == "LAZY_BACKWARD":
            self.phase("compile: backward", self.began, ended, **counts)
            return
        backend_at = max(self.began, ended - grew["backend_s"])
        self.phase("compile: dynamo", self.began, backend_at)
        if backend_at < ended or any(counts.values()):  # a frame traced into no graph: none
            self.phase("compile: inductor", backend_at, ended, autotune_s=grew["autotune_s"],
                       aot_trace_s=grew["aot_trace_s"], **counts)  # fmt: skip

    def summary(self, when: str) -> dict[str, float]:
        """The compiles' totals so far (`when`: "first step" or "end"), logged
        and returned (empty where torch has no compile callbacks)."""
        if not self.installed:
            return {}
        if when == "first step":
            self.first_step_done = True
            if self.save_to is not None and self.compiles:
                save_portable(self.save_to, self.event)
        now = self.snapshot()
        totals = {field: round(now[field] - self.at_install[field], 6) for field in now}
        for field in COUNTERS:
            totals[field] = int(totals[field])
        setups = setups_done()  # 1 where the compile found pyinit.run.pattern_setup's
        if setups is not None:
            totals["pattern_setups"] = setups
        self.event("compile summary", at=when, compiles=self.compiles, **totals)
        return totals


def _refusal(path: Path) -> str:
    """Why a portable cache file must not be loaded ("" when it may): it is
    code this user did not write, or others could have changed."""
    info = path.stat()
    folder = path.parent.stat()
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others may write it"
    if folder.st_mode & stat.S_IWOTH and not folder.st_mode & stat.S_ISVTX:
        return "its folder lets anyone replace it"
    return ""


def load_portable(path: Path, event: Callable[..., None]) -> None:
    """The portable caches at `path`, if any, into this node's compile caches
    (before the script runs: its compiles then find them)."""
    try:
        why = _refusal(path)
        data = b"" if why else path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as error:
        event("compile cache", path=str(path), loaded=False, error=error.strerror or str(error))
        return
    if why:
        say(f"pyinit run: not loading {path}: {why}")
        event("compile cache", path=str(path), loaded=False, error=why)
        return
    import torch

    began = time.monotonic()
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as error:  # torn, or from another torch: compile as if it were absent
        event("compile cache", path=str(path), loaded=False,
              error=f"{type(error).__name__}: {error!s:.200}")  # fmt: skip
        return
    if info is None:  # torch says what was wrong with it in a warning of its own
        event("compile cache", path=str(path), loaded=False, error="not torch's portable caches")
        return
    event("compile cache", path=str(path), loaded=True, bytes=len(data),
          artifacts=_artifact_counts(info), seconds=round(time.monotonic() - began, 6))  # fmt: skip


def save_portable(path: Path, event: Callable[..., None]) -> None:
    """What this process compiled, as torch's portable caches, to `path`
    unless a file is there already (written whole or not at all)."""
    if path.exists():
        return
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return
    data, info = saved
    try:
        write_bytes(path, data, mode=0o600)  # others may not write it (see _refusal)
    except OSError as error:  # a full disk: the run goes on, a later node compiles
        event("compile cache", path=str(path), saved=False, error=error.strerror or str(error))
        return
    event("compile cache", path=str(path), saved=True, bytes=len(data),
          artifacts=_artifact_counts(info))  # fmt: skip


def _artifact_counts(info: Any) -> dict[str, int]:
    """torch's CacheInfo as a count of artifacts by kind (inductor, aot_autograd...)."""
    return {kind: len(keys) for kind, keys in info.artifacts.items()}
