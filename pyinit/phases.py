"""Named phases of a worker's work, timed for ``pyinit run``'s report:
``phase("data")`` and ``phase("checkpoint")`` count against the step they
fall in, any other name becomes a phase event. The low layer the data path,
checkpoints and ``pyinit.worker`` time themselves through; ``pyinit run``'s
worker installs the sink (its step log) that receives each phase as it ends.

Imported by every worker before the training script: the standard library only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Protocol


class Sink(Protocol):
    def ended(self, name: str, start: float, end: float) -> None: ...


_sink: Sink | None = None
_open = threading.local()  # per thread: the phases entered and not yet left


def install(sink: Sink | None) -> None:
    """Where `phase()` reports in this process (None: outside a run)."""
    global _sink
    _sink = sink


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Times what runs inside, on CLOCK_BOOTTIME. A phase inside one of the
    same name (a script's around the DataLoader's own) counts once. Outside
    ``pyinit run`` it only runs the block."""
    sink = _sink
    entered = getattr(_open, "names", None)
    if entered is None:
        entered = _open.names = set()
    if sink is None or name in entered:
        yield
        return
    entered.add(name)
    start = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        yield
    finally:
        entered.discard(name)
        sink.ended(name, start, time.clock_gettime(time.CLOCK_BOOTTIME))
