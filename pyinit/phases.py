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
from typing import Any, Protocol


class Sink(Protocol):
    def ended(self, name: str, start: float, end: float, detail: dict[str, Any]) -> None: ...


_sink: Sink | None = None
_open = threading.local()  # per thread: the phases entered and not yet left


def install(sink: Sink | None) -> None:
    """Where `phase()` reports in this process (None: outside a run)."""
    global _sink
    _sink = sink


def boottime() -> float:
    """Seconds since the kernel started (CLOCK_BOOTTIME): the clock of the
    phases, the run's events and PID 1's timeline."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@contextlib.contextmanager
def phase(name: str) -> Iterator[dict[str, Any]]:
    """Times what runs inside, on CLOCK_BOOTTIME. A phase inside one of the
    same name (a script's around the DataLoader's own) counts once. Outside
    ``pyinit run`` it only runs the block. The block may fill the dict it
    gets (bytes moved, say): its items go into the phase's event."""
    detail: dict[str, Any] = {}
    sink = _sink
    entered = getattr(_open, "names", None)
    if entered is None:
        entered = _open.names = set()
    if sink is None or name in entered:
        yield detail
        return
    entered.add(name)
    start = boottime()
    try:
        yield detail
    finally:
        entered.discard(name)
        sink.ended(name, start, boottime(), detail)


def record(name: str, start: float, end: float, **detail: Any) -> None:
    """A phase timed by its caller: one that ends in another thread than it
    began (a background save's)."""
    sink = _sink
    if sink is not None:
        sink.ended(name, start, end, detail)
