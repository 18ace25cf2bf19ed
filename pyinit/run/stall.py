"""``pyinit run --stall-timeout SECONDS``: a rank whose process lives but whose
steps stopped is a named failure within the timeout, not 10-30 minutes of
every other rank waiting in NCCL's watchdog.

The watch runs in the supervisor's loop (four times a second) over the
workers' progress files (see ``pyinit.runlog.progress``), as a state machine
whose ticks never wait. When a live rank has made no step for the timeout
since its last one, it

1. asks every local worker for its Python stacks (faulthandler, on
   STACK_SIGNAL) and, with NCCL, PyTorch's flight recorder dump (through the
   pipe files torch watches when ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` is set,
   which ``pyinit run`` does for a watched run), into ``RUN_DIR/stall-N/``;
2. writes a ``stall`` event naming the stalled ranks, their node, the last
   step each reached and where each one is: a rank inside a collective is
   waiting for the others; one outside is the likely cause (with NCCL, whose
   calls return before the work is done, the flight recorder says instead:
   the ranks whose last collective is the lowest are the cause);
3. KILLs the local workers, so torchrun restarts the group (within
   ``--max-restarts``) or ends, and ``pyinit run`` exits with EXIT_STALLED (124).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pyinit.run.flight_recorder import FlightRecorder, Traced
from pyinit.runlog.events import EventLog, boottime, process_alive
from pyinit.runlog.progress import STACK_SIGNAL, Progress, read_progress, stack_path
from pyinit.say import say

STACK_WAIT_S = 2.0
FLIGHT_RECORDER_WAIT_S = 10.0
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


@dataclass(frozen=True)
class Where:
    """Where a rank's main thread is, from its faulthandler dump."""

    frame: str  # the innermost frame outside torch and pod-init: "train.py:12 in main"
    collective: str | None  # the torch.distributed call it waits in, if any


def locate(dump: str) -> Where | None:
    """The main thread's place in a faulthandler dump: the thread whose stack
    holds pyinit.run.wrapper (every worker's main thread runs through it)."""
    for block in re.split(r"\n\s*\n", dump):
        frames = [m.groupdict() for m in map(_FRAME.match, block.splitlines()) if m]
        if not any(f["file"].endswith("pyinit/run/wrapper.py") for f in frames):
            continue
        ours = [f for f in frames if "/torch/" not in f["file"] and "/pyinit/" not in f["file"]
                and not f["file"].startswith("<frozen")]  # fmt: skip
        inner = ours[0] if ours else frames[0]
        calls = [f["function"] for f in frames if f["file"].endswith("distributed_c10d.py")]
        frame = f"{Path(inner['file']).name}:{inner['line']} in {inner['function']}"
        return Where(frame, calls[0] if calls else None)
    return None


@dataclass
class _Gathering:
    """A stall being looked into: what was asked, and what has come back."""

    number: int
    folder: Path
    found: float  # CLOCK_BOOTTIME when the stall was found
    live: list[Progress]
    stalled: list[Progress]
    stack_sizes: dict[int, int]  # each rank's stack file before it was asked
    stacks_by: float  # time.monotonic() deadlines
    recorder_by: float
    recorder_before: dict[Path, tuple[int, int]]  # dumps there already: (mtime_ns, size)
    asked: int  # ranks whose flight recorder was asked for a dump
    dumps: dict[int, str] = field(default_factory=dict)
    growing: dict[int, int] = field(default_factory=dict)  # stack sizes seen last tick


def judge(stalled: list[Progress], stacks: dict[int, str],
          traced: dict[int, Traced]) -> tuple[dict[int, Where | None], list[int]]:  # fmt: skip
    """Where each stalled rank is, and which are the cause: those outside a
    collective (the others wait for them) or, when every stalled rank's
    flight recorder was read, those behind the rest."""
    where = {p.rank: locate(stacks.get(p.rank, "")) for p in stalled}
    causes = [p.rank for p in stalled if where[p.rank] is None or not where[p.rank].collective]
    if traced and {p.rank for p in stalled} <= set(traced):
        # NCCL's calls return before the work is done, so the Python stack of a
        # rank that waits shows a synchronize, not the collective: the recorder
        # knows which collective each rank reached.
        behind = min(t.last_seq for t in traced.values())
        causes = [p.rank for p in stalled if traced[p.rank].last_seq == behind]
        for p in stalled:
            place = where[p.rank]
            if p.rank not in causes and place is not None:
                where[p.rank] = Where(place.frame, traced[p.rank].pending)
    return where, causes


class StallWatch:
    """The stall watch, as a state machine the supervisor's tick drives: a
    tick only reads the progress files, starts requests (stack signals,
    flight recorder pipes) and checks what has come back and the deadlines;
    it never sleeps, so a signal to pyinit run is acted on at once even
    while stacks and dumps are being gathered."""

    def __init__(self, status_dir: Path, run_dir: Path, timeout_s: float, node: int,
                 log: EventLog, out: IO[str], env: Mapping[str, str],
                 announce: Callable[[dict], None] | None = None):  # fmt: skip
        self._status_dir = status_dir
        self._run_dir = run_dir
        self._timeout = timeout_s
        self._node = node
        self._log = log
        self._out = out
        self._recorder = FlightRecorder.of_run(run_dir, status_dir, env)
        self._announce = announce  # tells the other nodes this node's verdict
        self._ended: set[int] = set()  # pids already ended for a stall
        self._peer_verdicts: list[dict] = []  # appended by the peer watcher's thread
        self._gathering: _Gathering | None = None
        self.stalls = 0  # found here
        self.peer_stalls = 0  # found on other nodes, which ended this node's workers too
        self.cause_known = False  # a rank found stalled outside a collective, here or elsewhere

    def peer_stall(self, verdict: dict) -> None:
        """Another node found a stall (called from the peer watcher's thread)."""
        self._peer_verdicts.append(verdict)

    def check(self) -> None:
        """One tick: never blocks."""
        if self._timeout <= 0:
            return
        while self._peer_verdicts:
            self._peer(self._peer_verdicts.pop(0))
        if self._gathering is not None:
            self._advance(self._gathering)
            return
        now = boottime()
        live = self._live()
        stalled = [p for p in live if p.steps > 0 and now - p.last_step >= self._timeout]
        if stalled:
            self._start(live, stalled, now)

    def cause_elsewhere(self) -> bool:
        """Whether this node found a stall whose ranks were all waiting in
        collectives, and no node has yet said which rank they wait for."""
        return self.stalls > 0 and not self.cause_known

    def finish(self) -> None:
        """The workers are gone (the run ended): a stall being looked into is
        concluded with what has come back, nothing more will."""
        if self._gathering is not None:
            self._conclude(self._gathering)

    def _live(self) -> list[Progress]:
        """The ranks whose process lives and was not ended for a stall already."""
        return [p for p in read_progress(self._status_dir)
                if p.pid not in self._ended and process_alive(p.pid)]  # fmt: skip

    def _kill(self, ranks: list[Progress]) -> None:
        for p in ranks:
            self._ended.add(p.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)

    def _peer(self, verdict: dict) -> None:
        """A peer's stall: logged here too, and this node's workers ended with it
        (they can only wait for the stalled rank)."""
        causes = ", ".join(f"rank {c.get('rank')} at {c.get('where')}"
                           for c in verdict.get("causes", []) if isinstance(c, dict))  # fmt: skip
        self.peer_stalls += 1
        self.cause_known |= bool(verdict.get("causes"))
        self._log.write("peer_stall", peer=verdict)
        say(f"pyinit run: stall on node {verdict.get('node')}: "
            f"{causes or 'no cause found there'}", self._out)  # fmt: skip
        self._kill(self._live())

    def _start(self, live: list[Progress], stalled: list[Progress], now: float) -> None:
        """Asks for every local rank's stacks and, with NCCL, its flight
        recorder; the answers are collected on later ticks."""
        self.stalls += 1
        folder = self._run_dir / f"stall-{self.stalls}"
        folder.mkdir(parents=True, exist_ok=True)
        # Dumps already there (an earlier stall, a reused --run-dir, the user's
        # folder) are not this stall's: only new or rewritten ones count.
        before = self._recorder.stamps()
        asked = self._recorder.request()
        sizes = {}
        for p in live:
            path = stack_path(self._status_dir, p.rank)
            sizes[p.rank] = path.stat().st_size if path.exists() else 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, STACK_SIGNAL)
        began = time.monotonic()
        self._gathering = _Gathering(
            self.stalls, folder, now, live, stalled, sizes, began + STACK_WAIT_S,
            began + (FLIGHT_RECORDER_WAIT_S if asked else 0), before, asked)  # fmt: skip

    def _advance(self, g: _Gathering) -> None:
        for p in g.live:
            if p.rank in g.dumps:
                continue
            path = stack_path(self._status_dir, p.rank)
            size = path.stat().st_size if path.exists() else 0
            # A dump is whole once it has grown and then stayed the same for a tick.
            if size > g.stack_sizes[p.rank] and g.growing.get(p.rank) == size:
                with path.open(errors="replace") as f:
                    f.seek(g.stack_sizes[p.rank])
                    g.dumps[p.rank] = f.read()
            g.growing[p.rank] = size
        now = time.monotonic()
        stacks_done = len(g.dumps) == len(g.live) or now >= g.stacks_by
        recorder_done = len(self._recorder.new_dumps(g.recorder_before)) >= g.asked \
            or now >= g.recorder_by  # fmt: skip
        if stacks_done and recorder_done:
            self._conclude(g)

    def _conclude(self, g: _Gathering) -> None:
        self._gathering = None
        for rank, text in g.dumps.items():
            (g.folder / f"stack-rank{rank}.txt").write_text(text)
        recorded = self._recorder.new_dumps(g.recorder_before)
        stalled, now = g.stalled, g.found
        where, causes = judge(stalled, g.dumps, self._recorder.read(recorded))
        waiting = [p.rank for p in stalled if p.rank not in causes]
        self.cause_known |= bool(causes)
        ranks = [
            {"rank": p.rank, "node": self._node, "pid": p.pid, "last_step": p.steps,
             "seconds_since_step": round(now - p.last_step, 3),
             # A fresh heartbeat: the interpreter still runs (the main thread waits
             # with the GIL released); a stale one: C code holds it, or the process is stopped.
             "seconds_since_beat": round(now - p.beat, 3),
             "where": where[p.rank].frame if where[p.rank] else None,
             "collective": where[p.rank].collective if where[p.rank] else None}
            for p in stalled
        ]  # fmt: skip
        self._log.write("stall", timeout_s=self._timeout, ranks=ranks, causes=causes,
                        waiting=waiting, folder=str(g.folder),
                        flight_recorder=[str(p) for p in recorded])  # fmt: skip
        if self._announce is not None:
            self._announce({"count": g.number, "node": self._node,
                            "causes": [r for r in ranks if r["rank"] in causes]})  # fmt: skip
        for p in stalled:
            place = where[p.rank]
            doing = (f"waiting in {place.collective} at {place.frame}" if place and place.collective
                     else f"at {place.frame}" if place else "stack unavailable")  # fmt: skip
            idle = now - p.last_step
            say(f"pyinit run: stall: rank {p.rank} (node {self._node}) made no step for "
                f"{idle:.1f} s after step {p.steps}, {doing}", self._out)  # fmt: skip
        say(f"pyinit run: stall: stacks in {g.folder}; ending the worker group", self._out)
        self._kill(g.live)
