"""What a forked worker shares with its agent: the worker group's "finished"
event (torch's ``MultiprocessContext``'s, a semaphore in shared memory). The
agent sets it when every worker has returned, and, before it signals them,
when it stops the group (``pyinit.run.agent``); a worker forked after
``started`` inherits it, so an interrupt it gets can be told apart from the
agent's stop.
"""

from __future__ import annotations

from typing import Any

_finished: Any = None


def started(finished: Any) -> None:
    """In the agent, as it forks a group: that group's event."""
    global _finished
    _finished = finished


def stopping() -> bool:
    """In a forked worker: whether its agent is ending the group."""
    return _finished is not None and _finished.is_set()
