"""Each worker's progress, shared with ``pyinit run`` without a system call per
step: a 32-byte file per rank in the run's status folder, mapped by the worker
(``pyinit.run.wrapper``) and read by the supervisor's stall watch.

    pid, steps, last step (CLOCK_BOOTTIME s), heartbeat (CLOCK_BOOTTIME s)

The worker counts a step at every optimizer step (a global hook) and at every
``pyinit.worker.step()``; a thread beats once a second. The supervisor calls a
rank stalled when its process lives but its step count has not moved for
``--stall-timeout`` seconds since its last step (the clock starts at its first
step: before it, rendezvous and compilation have their own timeouts).

A worker also registers ``faulthandler`` on STACK_SIGNAL, writing every
thread's Python stack to ``stack-rankR.txt`` beside its progress file, so the
supervisor can see where a stalled rank is, even inside C code. A worker
whose script failed gets ``TEARDOWN_S`` to end (``pyinit.run.wrapper``);
past that its stacks go to ``teardown-rankR.txt`` and it exits.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyinit.runlog.events import boottime
from pyinit.say import say

LAYOUT = struct.Struct("<qqdd")
# A real-time signal: scripts rarely use them, unlike USR1/USR2.
STACK_SIGNAL = signal.SIGRTMIN + 4
BEAT_SECONDS = 1.0
# How long a failed worker's interpreter may take to end. Its peers learn of
# the failure when its sockets close: until it exits they wait in their
# collectives (gloo's timeout is 30 minutes).
TEARDOWN_S = 10.0


def progress_path(status_dir: Path, rank: int) -> Path:
    return status_dir / f"progress-rank{rank}.bin"


def stack_path(status_dir: Path, rank: int) -> Path:
    return status_dir / f"stack-rank{rank}.txt"


def traceback_path(status_dir: Path, rank: int) -> Path:
    """Where a worker whose collective failed because another rank went away
    wrote its traceback (the terminal has one line)."""
    return status_dir / f"traceback-rank{rank}.txt"


def teardown_path(status_dir: Path, rank: int) -> Path:
    """Where a failed worker whose interpreter would not end wrote its stacks."""
    return status_dir / f"teardown-rank{rank}.txt"


@dataclass(frozen=True)
class Progress:
    rank: int
    pid: int
    steps: int
    last_step: float  # CLOCK_BOOTTIME seconds; 0 before the first step
    beat: float


class ProgressWriter:
    """The worker's side: a mapped file, updated in place."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Written, not just sized: the block is the filesystem's now, so a
            # store into the mapping cannot fault (SIGBUS) on a disk that fills later.
            os.write(fd, bytes(LAYOUT.size))
            self._map = mmap.mmap(fd, LAYOUT.size)
        except OSError as error:
            # Bookkeeping never stops training: the counts stay in this process.
            say(f"pyinit run: {path}: {error.strerror or error}; the stall watch cannot see "
                "this rank")  # fmt: skip
            self._map = mmap.mmap(-1, LAYOUT.size)
        finally:
            os.close(fd)
        self._pid = os.getpid()
        self.steps = 0
        self.last_step = 0.0  # CLOCK_BOOTTIME seconds of the last step; 0 before the first
        self._lock = threading.Lock()
        self._write(boottime())

    def _write(self, beat: float) -> None:
        LAYOUT.pack_into(self._map, 0, self._pid, self.steps, self.last_step, beat)

    def step(self) -> None:
        now = boottime()
        with self._lock:
            self.steps += 1
            self.last_step = now
            self._write(now)

    def beat(self) -> None:
        with self._lock:
            self._write(boottime())

    def start_heartbeat(self, every_beat: Callable[[], None] | None = None) -> None:
        """The beat, every BEAT_SECONDS, and `every_beat` after it."""

        def beat_forever() -> None:
            while True:
                time.sleep(BEAT_SECONDS)
                self.beat()
                if every_beat is not None:
                    every_beat()

        threading.Thread(target=beat_forever, name="pyinit-heartbeat", daemon=True).start()


def read_progress(status_dir: Path) -> list[Progress]:
    """Every rank's progress file in the folder (a torn or short file is skipped)."""
    found = []
    for path in sorted(status_dir.glob("progress-rank*.bin")):
        try:
            data = path.read_bytes()
            rank = int(path.stem.removeprefix("progress-rank"))
        except (OSError, ValueError):
            continue
        if len(data) == LAYOUT.size:
            pid, steps, last_step, beat = LAYOUT.unpack(data)
            found.append(Progress(rank, pid, steps, last_step, beat))
    return found


_current: ProgressWriter | None = None


def install(writer: ProgressWriter) -> None:
    """The writer `pyinit.worker.step()` reaches in this process."""
    global _current
    _current = writer


def current() -> ProgressWriter | None:
    return _current
