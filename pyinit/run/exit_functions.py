"""A forked worker's end as a fresh interpreter's: the script's atexit
functions run.

torchrun starts a script in a fresh interpreter, and Python's exit joins the
script's threads and then runs what it registered with ``atexit`` (an
experiment tracker's last upload, a profiler's trace, a logging handler's
buffer) and its ``weakref.finalize`` objects (a ``TemporaryDirectory`` never
cleaned up). A worker forked from pyinit's agent ends through
multiprocessing's ``os._exit`` instead, which skips them all.

The agent's own functions are dropped at the fork rather than run: they act on
the agent's objects, which the worker holds copies of (its compile workers,
its file locks, its temporary folders), and running them in the worker would
shut down or remove what the agent still uses.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref


def drop_inherited() -> None:
    """At the worker's start: the agent's atexit functions and finalizers no
    longer run at this process's exit; logging's shutdown and the worker's
    own finalizers do, as in any interpreter."""
    atexit._clear()
    atexit.register(logging.shutdown)
    # weakref.finalize registers its one atexit function with the first finalizer
    # made, which the agent made: it is registered again, for this process's own.
    for info in weakref.finalize._registry.values():  # type: ignore[attr-defined]
        info.atexit = False
    if weakref.finalize._registered_with_atexit:  # type: ignore[attr-defined]
        atexit.register(weakref.finalize._exitfunc)  # type: ignore[attr-defined]


def run_at_exit() -> None:
    """What Python's exit runs before its teardown, in its order: the
    script's non-daemon threads joined, then the atexit functions (last
    registered first; one that raises is reported and the rest still run)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
