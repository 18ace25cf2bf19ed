"""The compile set imported beside the loop of a warm interpreter that a
run started, so that no launch waits for it.

Those imports come after the first launch, in steps
(``pyinit.run.preload.COMPILE_PRELOAD_STEPS``). In the loop itself, a launch
that came meanwhile waited for the step under way: 0.17-0.22 s of a second
launch's handoff on a 2-core VM, against 8-13 ms for a launch to a ready
interpreter. Each step now runs in a thread while the loop serves, and a
spare keeper forked before the thread started (so it was forked with no
thread running: the fork-safety rule of ``pyinit.run.preload``) takes the
launch at once. The loop forks nothing else while the thread runs: a launch
that finds no spare, and the end of the loop, first wait for the step
(:meth:`Warm.settle_import`, :meth:`Warm.end_import`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from pyinit.quiet_thread import start_quiet

if TYPE_CHECKING:
    from pyinit.run.warm.interpreter import Warm


class StepImport:
    """The next deferred preload being imported in a thread of its own;
    ``done_fd`` becomes readable when it has ended."""

    def __init__(self, warm: Warm) -> None:
        self._warm = warm
        self.done_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        self._seen: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="pyinit-warm-import", daemon=True)
        start_quiet(self._thread)  # the loop's own thread takes every signal (protocol.Wakeup)

    def _run(self) -> None:
        try:
            self._seen = self._warm.import_next_deferred()
        finally:
            with contextlib.suppress(OSError):
                os.write(self._write_fd, b"\0")

    def finish(self) -> set[str]:
        """Waits for the step; the environment names it read."""
        self._thread.join()
        os.close(self.done_fd)
        os.close(self._write_fd)
        return self._seen
