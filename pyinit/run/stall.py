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
import glob
import os
import pickle
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

from pyinit.runlog.events import EventLog, boottime, process_alive
from pyinit.runlog.progress import STACK_SIGNAL, Progress, read_progress, stack_path

STACK_WAIT_S = 2.0
FLIGHT_RECORDER_WAIT_S = 10.0
PIPE_PREFIX = "flight-recorder-pipe-rank_"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


TEMP_FILE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
PIPE_FILE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"


def flight_recorder_env(run_dir: Path, status_dir: Path) -> dict[str, str]:
    """PyTorch's NCCL flight recorder on, dumped on request into RUN_DIR
    (unless the user's environment names other places, which the watch then uses)."""
    (run_dir / "flight-recorder").mkdir(parents=True, exist_ok=True)
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        TEMP_FILE_ENV: str(run_dir / "flight-recorder" / "rank_"),
        PIPE_FILE_ENV: str(status_dir / PIPE_PREFIX),
    }


@dataclass(frozen=True)
class Where:
    """Where a rank's main thread is, from its faulthandler dump."""

    frame: str  # the innermost frame outside torch and pod-init: "train.py:12 in main"
    collective: str | None  # the torch.distributed call it waits in, if any


@dataclass(frozen=True)
class Traced:
    """A rank's NCCL flight recorder, as far as a stall needs it."""

    last_seq: int  # the highest collective sequence number it reached
    pending: str | None  # the first collective not completed ("nccl:all_reduce #11")


class _PlainUnpickler(pickle.Unpickler):
    """torch's dump holds dicts, lists and scalars only: refuse anything else."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def read_flight_recorder(paths: list[Path], prefix: str = "rank_") -> dict[int, Traced]:
    """Each dump (PREFIX + rank, RUN_DIR/flight-recorder/rank_N by default)
    that reads as torch writes it."""
    traced = {}
    for path in paths:
        try:
            with path.open("rb") as f:
                entries = _PlainUnpickler(f).load()["entries"]
            rank = int(path.name.removeprefix(prefix))
        except (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError):
            continue
        seqs = [e["collective_seq_id"] for e in entries]
        pending = [e for e in entries if e.get("state") != "completed"]
        first = (
            f"{pending[0]['profiling_name']} #{pending[0]['collective_seq_id']}"
            if pending
            else None
        )
        traced[rank] = Traced(max(seqs, default=0), first)
    return traced


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
        # Where torch writes its dumps and watches its pipes: the run's own, or the user's.
        self._dump_prefix = Path(env.get(TEMP_FILE_ENV, run_dir / "flight-recorder" / "rank_"))
        self._pipe_prefix = Path(env.get(PIPE_FILE_ENV, status_dir / PIPE_PREFIX))
        self._announce = announce  # tells the other nodes this node's verdict
        self._ended: set[int] = set()  # pids already ended for a stall
        self._peer_verdicts: list[dict] = []  # appended by the peer watcher's thread
        self._gathering: _Gathering | None = None
        self.stalls = 0  # found here
        self.peer_stalls = 0  # found on other nodes, which ended this node's workers too

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
        self._log.write("peer_stall", peer=verdict)
        print(f"pyinit run: stall on node {verdict.get('node')}: "
              f"{causes or 'no cause found there'}", file=self._out)  # fmt: skip
        self._kill(self._live())

    def _start(self, live: list[Progress], stalled: list[Progress], now: float) -> None:
        """Asks for every local rank's stacks and, with NCCL, its flight
        recorder; the answers are collected on later ticks."""
        self.stalls += 1
        folder = self._run_dir / f"stall-{self.stalls}"
        folder.mkdir(parents=True, exist_ok=True)
        # Dumps already there (an earlier stall, a reused --run-dir, the user's
        # folder) are not this stall's: only new or rewritten ones count.
        before = {p: _stamp(p) for p in self._dumps()}
        asked = self._request_flight_recorder()
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
        recorder_done = len(self._new_dumps(g)) >= g.asked or now >= g.recorder_by
        if stacks_done and recorder_done:
            self._conclude(g)

    def _conclude(self, g: _Gathering) -> None:
        self._gathering = None
        for rank, text in g.dumps.items():
            (g.folder / f"stack-rank{rank}.txt").write_text(text)
        recorded = self._new_dumps(g)
        stalled, now = g.stalled, g.found
        where = {p.rank: locate(g.dumps.get(p.rank, "")) for p in stalled}
        causes = [p.rank for p in stalled if where[p.rank] is None or not where[p.rank].collective]
        traced = read_flight_recorder(recorded, self._dump_prefix.name)
        if traced and {p.rank for p in stalled} <= set(traced):
            # NCCL's calls return before the work is done, so the Python stack of a
            # rank that waits shows a synchronize, not the collective: the recorder
            # knows which collective each rank reached.
            behind = min(t.last_seq for t in traced.values())
            causes = [p.rank for p in stalled if traced[p.rank].last_seq == behind]
            for p in stalled:
                if p.rank not in causes and where[p.rank] is not None:
                    where[p.rank] = Where(where[p.rank].frame, traced[p.rank].pending)
        waiting = [p.rank for p in stalled if p.rank not in causes]
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
            print(f"pyinit run: stall: rank {p.rank} (node {self._node}) made no step for "
                  f"{idle:.1f} s after step {p.steps}, {doing}", file=self._out)  # fmt: skip
        print(f"pyinit run: stall: stacks in {g.folder}; ending the worker group", file=self._out)
        self._kill(g.live)

    def _dumps(self) -> list[Path]:
        folder, prefix = self._dump_prefix.parent, self._dump_prefix.name
        return sorted(folder.glob(f"{glob.escape(prefix)}*")) if folder.is_dir() else []

    def _new_dumps(self, g: _Gathering) -> list[Path]:
        """This stall's dumps: written since it was found, not empty."""
        return [p for p in self._dumps()
                if _stamp(p) != g.recorder_before.get(p) and _stamp(p)[1] > 0]  # fmt: skip

    def _request_flight_recorder(self) -> int:
        """A byte into each rank's pipe: torch dumps its NCCL trace (NCCL only).
        Returns how many ranks were asked."""
        asked = 0
        folder, prefix = self._pipe_prefix.parent, self._pipe_prefix.name
        for pipe in folder.glob(f"{glob.escape(prefix)}*.pipe") if folder.is_dir() else []:
            try:
                fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader: that rank's group is gone or not NCCL
                continue
            try:
                os.write(fd, b"1")
                asked += 1
            finally:
                os.close(fd)
        return asked


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)
