"""The run's event log, ``RUN_DIR/events.jsonl``: one JSON object per line,
appended by every process of the run (``pyinit run``, the torchrun agent, each
worker) and flushed as written, so a crash loses at most the line in progress.

Every event has ``time`` (wall clock, for people) and ``boottime`` (seconds on
CLOCK_BOOTTIME, the clock PID 1 stamps the boot with, so the boot and the run
line up on one axis). A ``phase`` event is a step with a ``name``, ``start``
and ``end`` on CLOCK_BOOTTIME; ``pyinit timeline`` draws them.

This module is imported by every worker before the training script: it imports
nothing beyond the standard library.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from pyinit.phases import boottime
from pyinit.runlog.appender import Appender
from pyinit.say import say

FILE_NAME = "events.jsonl"
# Where a run without --run-dir writes, one folder per node: DEFAULT_ROOT/node0, ...
DEFAULT_ROOT = Path("pyinit-run")
NODE_FOLDER = re.compile(r"node(\d+)")
# Where pyinit run tells its agent and workers to write (the run's folder).
RUN_DIR_ENV = "PYINIT_RUN_DIR"


def default_folder(node: int) -> Path:
    return DEFAULT_ROOT / f"node{node}"


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat from field 3 (state) on: the command name (field 2) may
    hold spaces and parentheses, so count after its end."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def process_start(pid: int | str = "self") -> float:
    """When the process began (fork, not exec), on CLOCK_BOOTTIME, to the
    kernel's clock tick (10 ms at the usual 100 Hz)."""
    return int(_stat_fields(pid)[19]) / os.sysconf("SC_CLK_TCK")


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, not yet reaped)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


class EventLog:
    """Appends events to a run's log; several processes may share the file
    (each line is one write on an O_APPEND descriptor)."""

    def __init__(self, path: Path | str, **common: Any):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._common = common  # fields every event of this writer carries (rank, node)
        # One os.write per line on O_APPEND: lines of several processes never
        # interleave, and a failed write leaves no buffered rest behind.
        self._file = Appender(path)
        self._lock = threading.Lock()
        self._lost = False  # a write failed (a full disk): the log stops, training goes on

    @classmethod
    def for_run(cls, **common: Any) -> EventLog | None:
        """The log of the run this process belongs to, or None outside one."""
        folder = os.environ.get(RUN_DIR_ENV)
        return cls(Path(folder) / FILE_NAME, **common) if folder else None

    def write(self, event: str, **fields: Any) -> None:
        record = {"time": time.time(), "boottime": boottime(), "event": event}
        line = json.dumps({**record, **self._common, **fields}, default=str) + "\n"
        with self._lock:
            if self._lost:
                return
            data = line.encode("utf-8", errors="surrogateescape")
            try:
                if self._file.write(data) != len(data):
                    raise OSError(errno.ENOSPC, "part of a line written")
            except OSError as error:
                # The one line that says so; `pyinit report` names a log that ends early.
                self._lost = True
                say(f"pyinit run: {self.path}: events stop here: {error.strerror or error}; "
                    "training goes on")  # fmt: skip

    def phase(self, name: str, start: float, end: float, **fields: Any) -> None:
        """A step of the run, from `start` to `end` on CLOCK_BOOTTIME."""
        self.write("phase", name=name, start=round(start, 6), end=round(end, 6), **fields)

    def close(self) -> None:
        self._file.close()
