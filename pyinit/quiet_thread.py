"""Threads that never take a signal sent to the process.

A signal sent to a process goes to any one of its threads that does not
block it. The commands that handle their signals themselves (``pyinit run``
blocks them and takes them with sigtimedwait; a warm interpreter's loop
wakes on them) must get every one, so a helper thread of theirs, and every
thread a library starts from it (the driver's own, in nvmlInit), runs with
them blocked: a thread inherits its creator's mask.
"""

from __future__ import annotations

import signal
import threading

# Signals a thread that faults must still receive.
SYNCHRONOUS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                         signal.SIGTRAP, signal.SIGSYS})  # fmt: skip


def start_quiet(thread: threading.Thread) -> None:
    """Starts `thread` with every asynchronous signal blocked; the caller's
    own mask is closed only while it starts, so a thread that hangs still
    leaves the caller interruptible."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - SYNCHRONOUS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
