"""A process's end without the interpreter's teardown.

Python's own exit unwinds every module it loaded, one by one: 5-18 ms for a
``pyinit`` command on a 2-core VM, a seventh of a ``pyinit check`` that a
scheduler runs every few seconds. A process with nothing left to tear down
(its files closed, its threads done or daemons) ends here instead: atexit's
functions run and the streams are flushed, as Python would, then it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def flush_stdio() -> None:
    """stdout and stderr flushed; a reader that left is no error here."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def exit_now(code: int) -> NoReturn:
    """atexit's functions, the streams flushed, then the process's end with
    `code`, without unwinding the caller's frames or the modules."""
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    flush_stdio()
    os._exit(code)
