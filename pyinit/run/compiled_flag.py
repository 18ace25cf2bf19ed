"""Whether a worker has compiled, as one byte of memory that a warm
interpreter shares with every process it forks.

The warm interpreter a first ``pyinit run`` leaves behind imports the compile
set (``pyinit.run.preload.COMPILE_PRELOAD_STEPS``) only once a worker forked
from it has started a compile: on a node that runs eager scripts alone those
imports would only take the CPU from the launches that come meanwhile (on a
2-core VM the second launch of the day 0.37 s against 0.30 s). The byte is a
shared anonymous mapping made before the first fork, so every keeper, agent
and worker forked from that interpreter writes the same byte, with no file
and no message; a worker not forked from one has no mapping and notes nothing.
"""

from __future__ import annotations

import mmap

_shared: mmap.mmap | None = None


def share() -> None:
    """The byte, made in this process (the warm interpreter, before its first fork)."""
    global _shared
    _shared = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: one page every fork shares


def note() -> None:
    """A worker's first compile: said to the warm interpreter it was forked from."""
    if _shared is not None:
        _shared[0] = 1


def seen() -> bool:
    """Whether a worker forked from here has compiled."""
    return _shared is not None and _shared[0] == 1
