"""A script that reads a line of its input, notes its signals' handlers, its
multiprocessing (after choosing its start method), its own file's name and
the command lines ps shows for it and its parent, then leaves Python's exit
its usual work: a thread still running, an atexit function, a temporary
folder never cleaned up and a buffered log handler never flushed. It ends
as argv[2] says: return, exit3, raise or interrupt (an uncaught
KeyboardInterrupt)."""

import atexit
import logging
import logging.handlers
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time

out, how = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]


def note(word: str) -> None:
    with open(os.path.join(out, f"ended-{rank}"), "a") as f:
        f.write(word + "\n")


def late() -> None:
    time.sleep(0.5)
    note("thread")


note(f"pid {os.getpid()}")
note(f"read: {sys.stdin.readline().strip()}")


def handler(number: signal.Signals) -> str:
    now = signal.getsignal(number)
    return now.name if isinstance(now, signal.Handlers) else getattr(now, "__name__", repr(now))


kept = (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE)
note(" ".join(f"{number.name}={handler(number)}" for number in kept))
multiprocessing.set_start_method("spawn")  # as training scripts do, before anything else
process = multiprocessing.current_process()
note(f"{process.name} {multiprocessing.parent_process()} {multiprocessing.get_start_method()}")
note(f"file {__file__}")


def shown(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return repr(f.read().rstrip(b"\0").split(b"\0"))


note(f"shown {shown(os.getpid())}\t{shown(os.getppid())}\t{sys.orig_argv[1:]!r}")
threading.Thread(target=late).start()
atexit.register(note, "atexit")
left = tempfile.TemporaryDirectory(dir=out, prefix=f"left-{rank}-")
log = logging.getLogger("exit_work")
log.propagate = False
to_file = logging.FileHandler(os.path.join(out, f"log-{rank}"))
log.addHandler(logging.handlers.MemoryHandler(1000, logging.CRITICAL, to_file))
log.warning("buffered until logging shuts down")
if how == "exit3":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("the script failed")
if how == "interrupt":
    raise KeyboardInterrupt
