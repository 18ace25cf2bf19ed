"""One line of pyinit's own to a stream shared with other processes.

A run's ranks, its launcher and torch write to one terminal. With Python's
output unbuffered (PYTHONUNBUFFERED, set in many containers), print() writes
a line and its newline in two calls: a rank killed between them leaves its
line open and the next process's line is glued to it, and another process's
line may land between them. One write of the whole line, at most a pipe's
atomic size, lands whole or not at all.
"""

from __future__ import annotations

import sys
from typing import IO


def say(line: str, stream: IO[str] | None = None) -> None:
    """Writes `line` and its newline in one call to `stream` (the current
    sys.stderr when None) and flushes it."""
    out = sys.stderr if stream is None else stream
    out.write(line + "\n")
    out.flush()
