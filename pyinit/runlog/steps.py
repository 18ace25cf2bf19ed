"""Each rank's steps, for ``pyinit report``: one 40-byte record per optimizer
step in ``RUN_DIR/steps/rank-R.bin`` (the attempt, the step's number in it,
when it ended on CLOCK_BOOTTIME, and how long of it was spent waiting for
data and writing checkpoints), appended with one write on an O_APPEND
descriptor, so a killed run loses at most the record in progress and a
reader of a live run sees whole records only.

The waits come from ``pyinit.phases.phase`` (``pyinit.worker.phase``): the
worker wraps every DataLoader's ``__next__`` in ``phase("data")``,
``TokenShardDataset`` and ``pyinit.checkpoint.save`` do the same, and a
script may too; the worker installs its StepLog there.

Imported by every worker before the training script: the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import threading
from pathlib import Path
from typing import Any

from pyinit.runlog.appender import Appender
from pyinit.runlog.events import EventLog
from pyinit.say import say

RECORD = struct.Struct("<qqddd")  # attempt, step, end, data wait, checkpoint (seconds)
FOLDER = "steps"
# Phases whose time is accounted inside the step they fall in.
WAITS = ("data", "checkpoint")


def steps_path(run_dir: Path | str, rank: int) -> Path:
    return Path(run_dir) / FOLDER / f"rank-{rank}.bin"


LOST = ".lost-attempt-{attempt}-from-step-{step}"


def lost_marker(path: Path, attempt: int, step: int) -> Path:
    """rank-R.bin.lost-attempt-A-from-step-N: no records from step N of attempt A on."""
    return path.with_name(path.name + LOST.format(attempt=attempt, step=step))


class StepLog:
    """This rank's step records, and the waits of the step in progress."""

    def __init__(self, path: Path, attempt: int, events: EventLog | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = Appender(path)
        self._lost_from = 0  # the first step not recorded (0: none lost)
        self._attempt = attempt
        self._events = events
        self._steps = 0
        self._waits = dict.fromkeys(WAITS, 0.0)
        self._lock = threading.Lock()  # a background thread may end a phase

    def ended(self, name: str, start: float, end: float, detail: dict[str, Any]) -> None:
        """A phase ended: a wait counts against this step; every phase but
        data (which comes every step) is also an event."""
        if name in WAITS:
            with self._lock:
                self._waits[name] += end - start
        if name != "data" and self._events is not None:
            self._events.phase(name, start, end, **detail)

    def step(self, end: float) -> None:
        with self._lock:
            self._steps += 1
            record = RECORD.pack(self._attempt, self._steps, end, self._waits["data"],
                                 self._waits["checkpoint"])  # fmt: skip
            self._waits = dict.fromkeys(WAITS, 0.0)
            if self._lost_from:
                return
            try:
                written = self._file.write(record)
            except OSError as error:
                self._lose(error.strerror or str(error))
                return
            if written != len(record):
                # A full disk took part of it: cut it off, so the file keeps whole records.
                with contextlib.suppress(OSError):
                    self._file.truncate_by(written)
                self._lose(f"{os.strerror(errno.ENOSPC)} (a record cut at {written} bytes)")

    def _lose(self, reason: str) -> None:
        """Bookkeeping never takes training down: the records stop, once, with
        one line. The report learns from which step they are missing by an
        empty file whose name says it: a full disk still takes a name (no data
        block), where an event in the log would be lost too."""
        self._lost_from = self._steps
        say(f"pyinit run: step records of {self.path} stop at step {self._steps - 1}: "
            f"{reason}; training goes on")  # fmt: skip
        marker = lost_marker(self.path, self._attempt, self._steps)
        with contextlib.suppress(OSError):
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

    def close(self) -> None:
        self._file.close()
