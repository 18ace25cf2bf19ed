"""torchrun for the ranks pod-init starts itself (the collective benchmarks,
NCCL tuning's measurements): ``python -m pyinit.torchrun ARGS`` is
``torchrun ARGS``, but stopped by a signal it ends its workers, as torchrun
does, and then exits 128+N without its traceback of the signal.

The command that started it stops it with TERM (pyinit.termination), and
torchrun's own answer, passing the signal on to workers it started in
sessions of their own, is how those workers end with it. torchrun does not
answer for workers it is still starting: a signal that comes while it
spawns them (between one worker's start and its handle's keeping) leaves
them running, out of reach of its session and ours, stuck in the
rendezvous until its timeout, and holding the command's output open. So
each worker also ends when this process does (:func:`worker_ends_with_it`).
"""

from __future__ import annotations

import os
import signal
import sys

AGENT_PID_ENV = "PYINIT_TORCHRUN_PID"  # this process, for the workers it starts


def main(argv: list[str]) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    workers_end_with_this_process()
    try:
        run.main(argv)
    except SignalException as stopped:  # its workers are stopped; torchrun has said so
        return 128 + int(stopped.sigval)
    return 0


def workers_end_with_this_process() -> None:
    """Names this process, a torchrun agent, to the workers it starts next
    (:func:`worker_ends_with_it`)."""
    os.environ[AGENT_PID_ENV] = str(os.getpid())


def worker_ends_with_it() -> None:
    """Called first by a worker of a torchrun agent: it is KILLed when that
    agent ends, however it ends (at once where it has ended already). The
    agent is the one that named itself, where one did: a worker that took a
    while to get here (a fresh interpreter's imports) would find the reaper
    of orphans as its parent once the agent is gone. Else its parent."""
    from pyinit import _native

    agent = os.environ.pop(AGENT_PID_ENV, "")
    _native.die_with_parent(signal.SIGKILL, int(agent) if agent.isdigit() else os.getppid())


def command(argv: list[str]) -> list[str]:
    """The command line that runs torchrun with `argv` as this module."""
    return [sys.executable, "-m", "pyinit.torchrun", *argv]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
