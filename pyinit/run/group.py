"""What a forked worker shares with its agent, from torch's
``MultiprocessContext``:

- the worker group's "finished" event (a semaphore in shared memory). The
  agent sets it when every worker has returned, and, before it signals them,
  when it stops the group (``pyinit.run.agent``); a worker forked after
  ``started`` inherits it, so an interrupt it gets can be told apart from the
  agent's stop;
- the pipes each worker hands its return value back on. A script may close
  the descriptors it did not open (``os.closerange(3, ...)``) and open its
  own on the freed numbers: the worker then checks that its pipe is still
  the one it was forked with before torch writes to it.
"""

from __future__ import annotations

from typing import Any

from pyinit.runlog.appender import identity

# How long the agent waits for the finished event's lock, which only a worker
# inside Event.wait holds, and that for microseconds.
LOCK_WAIT_S = 1.0
_finished: Any = None
_returns: dict[int, Any] = {}  # local rank: torch's SimpleQueue for its return value


def started(finished: Any, returns: dict[int, Any]) -> None:
    """In the agent, as it forks a group: that group's event and return queues."""
    global _finished, _returns
    _finished, _returns = finished, returns


def release(finished: Any) -> None:
    """In the agent: `finished` (a multiprocessing Event) set without waiting
    for its waiters. ``Event.set()`` wakes each waiting worker and then waits
    for it to say it woke; a worker killed while it waited never does (torch
    terminates the others when one rank dies, a rank that had returned among
    them), and the agent then waited for good. Here each waiter is woken
    and not waited for; and where a worker died holding the event's lock
    (a narrow window inside ``Event.wait``), the flag is set without it."""
    cond = finished._cond
    held = cond.acquire(timeout=LOCK_WAIT_S)
    try:
        finished._flag.acquire(False)
        finished._flag.release()
        while cond._sleeping_count.acquire(False):
            cond._wait_semaphore.release()
    finally:
        if held:
            cond.release()


def stopping() -> bool:
    """In a forked worker: whether its agent is ending the group."""
    return _finished is not None and _finished.is_set()


def return_pipe(local_rank: int) -> tuple[int, tuple[int, int] | None] | None:
    """In a forked worker, before the script runs: the descriptor its return
    value goes back on, with that pipe's device and inode; None where the
    agent forked no group (a worker of plain torchrun)."""
    queue = _returns.get(local_rank)
    if queue is None:
        return None
    fd = queue._writer.fileno()
    return fd, identity(fd)


def return_pipe_kept(pipe: tuple[int, tuple[int, int] | None] | None) -> bool:
    """Whether the descriptor still is that pipe (the script did not close it)."""
    if pipe is None:
        return True
    fd, named = pipe
    return identity(fd) == named
