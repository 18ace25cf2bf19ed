"""A worker made what a fresh interpreter is to the script.

torchrun starts a script in a fresh interpreter; pyinit run forks it from
its agent, through multiprocessing, which prepares a child for a function
call rather than for a program:

- it keeps the agent's signal handlers, where exec would have made each
  the default action: torchrun's, which raise its ``SignalException`` with
  a traceback on TERM, INT, HUP and QUIT (a worker sent HUP or QUIT is to
  end by that signal, and QUIT is to leave a core dump);
- it leaves the child in the agent's process group, with pyinit run and
  the terminal's foreground job: Ctrl-C reached the worker twice (from the
  terminal, then forwarded by the agent), the second time inside the
  script's KeyboardInterrupt handler, and a script's ``os.killpg(0, ...)``
  would end pyinit run itself;
- it makes the child a process of its own (``ForkProcess-1``, with a
  parent) with its start method set to fork, so a script's
  ``set_start_method("spawn")``, common at the top of training scripts,
  failed with "context has already been set";
- it points ``sys.stdin`` at /dev/null (the worker's fd 0 is still the
  user's terminal or pipe), so ``breakpoint()`` quit at once and a script
  reading its input read nothing;
- it leaves the agent's command line (or, forked from a warm interpreter,
  that interpreter's) as what ps, top and ``pkill -f`` read for the worker;
- it starts the child from the agent's random state: torch's default
  generator and numpy's, which a fresh interpreter seeds from the system's
  entropy, gave every rank of a node the same numbers, and every launch
  from a warm interpreter the same as the last;
- it ends the child with ``os._exit``, so Python's exit never ran the
  script's ``atexit`` functions (an experiment tracker's last upload, a
  profiler's trace), its ``weakref.finalize`` objects (a
  ``TemporaryDirectory`` never cleaned up) or logging's shutdown (a buffered
  handler's records).

The agent's own exit functions are dropped at the fork rather than run: they
act on the agent's objects, which the worker holds copies of (its compile
workers, its file locks, its temporary folders), and running them in the
worker would shut down or remove what the agent still uses.

Forked or spawned, the wrapper runs the script itself (``run_script``),
which names and loads it as ``python SCRIPT`` does.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import logging
import os
import runpy
import signal
import sys
import threading
import types
import weakref
import zipfile

from pyinit import _native


def run_script(path: str) -> None:
    """The script at `path` run as ``python PATH`` runs it: as the process's
    ``__main__`` module (multiprocessing's spawned children import it from
    there), its ``__file__`` the working directory joined to `path` with links
    and dots kept (a script may chdir, then look beside its own file: Hydra
    does), ``sys.argv[0]`` as given, compiled without the wrapper's future
    imports. A folder or zip archive with a ``__main__.py``, or compiled
    bytecode, goes through runpy."""
    full = os.path.join(os.getcwd(), path)
    if not os.path.isdir(full) and not zipfile.is_zipfile(full):
        with open(full, "rb") as f:
            source = f.read()
        if source[:4] != importlib.util.MAGIC_NUMBER:
            code = compile(source, full, "exec", dont_inherit=True)
            main = types.ModuleType("__main__")
            loader = importlib.machinery.SourceFileLoader("__main__", full)
            main.__dict__.update(__file__=full, __cached__=None, __builtins__=builtins,
                                 __loader__=loader)  # fmt: skip
            sys.modules["__main__"] = main
            exec(code, main.__dict__)
            return
    runpy.run_path(full, run_name="__main__")


def from_the_script(frames: types.TracebackType | None) -> types.TracebackType | None:
    """A traceback from the script's first frame on, as Python prints one: the
    frames of this wrapper and of runpy, which ran it, left out (all of them
    for a script that does not compile, which Python shows as its file, line
    and caret alone)."""
    ours = {__file__, os.path.join(os.path.dirname(__file__), "wrapper.py"), "<frozen runpy>"}
    while frames is not None and frames.tb_frame.f_code.co_filename in ours:
        frames = frames.tb_next
    return frames


def show_arguments(words: list[str]) -> None:
    """`words` after the program's name in what ps and ``pkill -f`` read for
    this process, cut where the command line it inherited ends. A /proc that
    refuses it leaves the line as it was."""
    with contextlib.suppress(OSError):
        _native.set_arguments_shown([os.fsencode(word) for word in words])


def arguments_shown(kind: str, name: str, args: list[str]) -> None:
    """This worker shown as ``python SCRIPT ARGS`` (``python -m MODULE ARGS``),
    as a worker torchrun starts is, forked or spawned through the wrapper;
    ``sys.orig_argv`` (which a script that restarts itself may exec) is
    torchrun's command for it, ``python -u SCRIPT ARGS``, not the agent's or
    the wrapper's."""
    words = ["-m", name, *args] if kind == "module" else [name, *args]
    show_arguments(words)
    sys.orig_argv = [sys.orig_argv[0], "-u", *words]


def signals_as_started() -> None:
    """Each signal as exec and Python's start leave it: a handler becomes the
    default action and an ignored signal stays ignored; then INT raises
    KeyboardInterrupt (unless ignored) and PIPE and XFSZ are ignored."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):  # KILL, STOP, a real-time one of libc's
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_IGN)


def own_session() -> None:
    """The worker in a session and process group of its own, as torchrun starts
    each worker: a terminal's Ctrl-C then reaches it once, forwarded by the
    agent, not a second time from the terminal in the middle of the script's
    KeyboardInterrupt handler; and a script that signals its own process
    group (to end its children) signals only its own processes."""
    os.setsid()


def multiprocessing_as_started() -> None:
    """multiprocessing as in a process started on its own: this is the main
    process (its name, no parent), and no start method is chosen yet."""
    from multiprocessing import context, process

    # Named and numbered as the main process (its children "SpawnProcess-1", not
    # "ForkProcess-1:1"); the object stays multiprocessing's, which ends this child.
    this = process.current_process()
    this._name, this._identity = "MainProcess", ()  # type: ignore[attr-defined]
    process._parent_process = None  # type: ignore[attr-defined]
    context._default_context._actual_context = None  # type: ignore[attr-defined]


def random_state_as_started() -> None:
    """The generators a fresh interpreter seeds from the system's entropy,
    seeded so again: torch's default CPU generator, and numpy's global one
    where the agent imported numpy. A forked worker otherwise starts from its
    agent's state, as every rank of the node does, and, forked from a warm
    interpreter, as every launch after it does: the same initial weights,
    dropout masks and shuffles in each. (Python's ``random`` seeds itself
    again at a fork. torch's CUDA generators start from torch's fixed default
    seed in a fresh interpreter too, and are left so.)"""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def take_stdin() -> None:
    """``sys.stdin`` on fd 0 again, as Python makes it (buffered, not closing
    the descriptor, stdout's encoding and errors, line-buffered on a
    terminal); left as it is where fd 0 is not open."""
    try:
        os.fstat(0)
    except OSError:
        return
    raw = open(0, "rb", closefd=False)  # noqa: SIM115 (it is the process's stdin)
    stdout = sys.__stdout__  # None where fd 1 was closed: the locale's encoding then
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        raw, encoding=getattr(stdout, "encoding", None), errors=getattr(stdout, "errors", None),
        line_buffering=raw.isatty())  # fmt: skip


def drop_inherited_exit_functions() -> None:
    """The agent's atexit functions and finalizers no longer run at this
    process's exit; logging's shutdown and the worker's own finalizers do,
    as in any interpreter."""
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
