"""A command's end on SIGTERM or SIGHUP that still runs its cleanup.

Python's default for both is the process's death where it stands: a loop
device a benchmark attached stays attached, its files stay on the disk, and
the processes it started (DCP ranks, torchrun and its workers) go on without
it. Once :func:`end_on_signals` is called, the first of them raises
:class:`Terminated` in the main thread instead, so every ``finally`` and
``with`` block runs on the way out; a second one ends the process at once.
The command then ends by the same signal (:meth:`Terminated.end_by_it`), so
a shell, systemd or a scheduler sees what it sent, as before.

A command that starts processes of its own waits for them inside
:func:`stopped_on_error`: whatever ends the wait early (Terminated, Ctrl-C,
an error) sends each of them TERM, and KILL after a grace, before it goes
on (:func:`run_child` for a child that must stop what it started itself,
torchrun: ``pyinit.torchrun`` runs it so that it stops quietly).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # imported by the functions that start processes: every command imports this
    import subprocess

# The signals that ask a command to stop: a plain `kill`, a scheduler's
# cancel, systemd's stop; SIGHUP when its terminal goes away.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# How long a started process gets to end after TERM before it is KILLed.
GRACE_S = 10.0
# torchrun passes TERM on to its workers, and KILLs them 30 s later.
TORCHRUN_GRACE_S = 40.0


class Terminated(BaseException):
    """A stop signal, raised where the main thread was. A BaseException, as
    KeyboardInterrupt is: no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    def end_by_it(self) -> NoReturn:
        """Ends this process by the signal that stopped it, its cleanup done."""
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)
        raise SystemExit(128 + self.signum)  # not reached: the signal's action ends us


# A stop signal that came while a process was being started (held_back).
_held: list[int] = []
_holding = False


def _raise_once(signum: int, _frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    if _holding:
        _held.append(signum)
        return
    raise Terminated(signum)


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """A stop signal that comes while the block starts processes is raised
    when the block ends, not inside it: between its fork and Popen's return
    the caller has no handle on the child to stop it."""
    global _holding
    _holding = True
    try:
        yield
    finally:
        _holding = False
    if _held:
        raise Terminated(_held.pop())


def end_on_signals() -> None:
    """From now on the first stop signal raises Terminated in the main
    thread. A signal the process was started with ignored (``nohup``'s
    SIGHUP) stays ignored."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _raise_once)


@contextlib.contextmanager
def stopped_on_error(procs: Sequence[subprocess.Popen], grace: float = GRACE_S) -> Iterator[None]:
    """Runs the block (which starts `procs`, held_back, and waits for them);
    when it raises, each process started still running gets TERM, then KILL
    after `grace` seconds, and has been waited for before the exception goes
    on."""
    import subprocess

    try:
        yield
    except BaseException:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def run_child(command: Sequence[str], **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run(command) without capture, whose child ends as
    stopped_on_error says when the wait is cut short: TERM, then KILL after
    TORCHRUN_GRACE_S, as long as torchrun takes to stop its workers (it
    KILLs them after 30 s); subprocess.run would KILL it at once and leave
    its workers running."""
    import subprocess

    started: list[subprocess.Popen] = []
    with stopped_on_error(started, TORCHRUN_GRACE_S):
        with held_back():
            started.append(subprocess.Popen(command, **popen))
        # Not Popen's own `with`: on the way out it waits for the child, before
        # stopped_on_error could stop it.
        code = started[0].wait()
    return subprocess.CompletedProcess(command, code)
