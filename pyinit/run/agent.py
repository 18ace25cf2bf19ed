"""torchrun's own elastic agent, started by ``pyinit run`` with two marks in
the run's event log: the interpreter's start and ``import torch``, the largest
single cost before the first step. Everything after is torchrun's ``main``
with the arguments given (rendezvous, restarts, signals, log options)::

    python -P -m pyinit.run.agent [--preload=MOD,...] [torchrun options] --run-path WORKER ARGS...

Importing torch here, once, with what a training step imports lazily and the
script's own ``--preload`` modules (``pyinit.run.preload``), is what lets the
workers be forked with all of it loaded (see ``pyinit.run.wrapper``), restarted
groups included. A warm interpreter (``pyinit.run.warm``) runs this same
``main`` in a fork of itself, with the imports already done. The rendezvous is the ``pyinit``
backend (``pyinit.run.store``), on the socket pyinit run bound. What the agent
itself says (torchrun's log lines, its tracebacks, its logging errors while a
job is cancelled) goes to ``RUN_DIR/agent.log``, not the terminal: pyinit
run's own lines say how the run went, and the workers' output (the script's
prints and its own traceback) still goes where pyinit run's went.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyinit import bytecode
from pyinit.jsonfile import write_json
from pyinit.run import compile_notes, group
from pyinit.run.preload import (
    PreloadError,
    collector_paused,
    fork_unsafe,
    import_all,
    import_compile_set,
    parse,
)
from pyinit.runlog.events import RUN_DIR_ENV, EventLog, boottime, process_start
from pyinit.runlog.progress import read_progress
from pyinit.torchrun import workers_end_with_this_process

PRELOAD_OPTION = "--preload="
FAILURES_FILE = "failures.json"
AGENT_LOG = "agent.log"
# How torchrun's agent is started cold; a warm interpreter takes what follows, and
# an agent forked from one shows this command to ps.
AGENT_START = (sys.executable, "-P", "-m", "pyinit.run.agent")
TERMINAL_FD_ENV = "PYINIT_TERMINAL_FD"  # the terminal, in an agent whose fd 2 is its log

# torch's own switch for a CUDA check that does not initialise CUDA: torchrun's
# LaunchConfig asks torch.cuda.is_available(), which otherwise runs cuInit in the
# agent, and a CUDA-initialised parent cannot fork workers that use CUDA. The
# workers inherit it; their availability check then asks NVML, as torch documents.
FORK_SAFE_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
# What the agent's environment holds unless the user set it: a warm
# interpreter, which imports as the agent would, starts with the same.
AGENT_ENV_DEFAULTS = {FORK_SAFE_CUDA_CHECK: "1"}


def set_agent_defaults() -> None:
    """AGENT_ENV_DEFAULTS in this process's environment, where the user set none."""
    for name, value in AGENT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def main(argv: list[str] | None = None, started: float | None = None) -> None:
    """torchrun's main with `argv`; `started` is when this process began
    (a warm interpreter's fork), else /proc's record of it."""
    entered = boottime()
    argv = sys.argv[1:] if argv is None else argv
    preloads: tuple[str, ...] = ()  # pyinit run's list when the workers are forked
    if argv[:1] and argv[0].startswith(PRELOAD_OPTION):
        preloads = parse(argv.pop(0)[len(PRELOAD_OPTION) :])
    set_agent_defaults()
    folder = os.environ.get(RUN_DIR_ENV)
    if folder:
        # Before torch is imported: its loggers' handlers take sys.stderr as it is
        # then.
        sys.stderr = open(Path(folder, AGENT_LOG), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        if "torch" in sys.modules:  # a warm interpreter's fork: torch's handlers exist
            log_handlers_to(sys.stderr, lambda stream: _on_fd(stream, 2))
        if preloads:  # forked workers: they take the terminal back (see the wrapper)
            _fd2_to(sys.stderr)
    log = EventLog.for_run(node=int(os.environ.get("PYINIT_NODE_RANK", "0")))
    preloaded = "torch" in sys.modules  # a warm interpreter's fork
    if preloaded:
        environment_read_again()
    start = boottime()
    with collector_paused():
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        from pyinit.run import store

        store.register_handler(str(Path(folder, "status")) if folder else None)
        notice_worker_ends()
        if folder:
            time_restarts(Path(folder, "status"), int(os.environ.get("PYINIT_NODE_RANK", "0")))
        if preloads:  # workers forked from here: a restarted group's are too
            forked_workers_end_as_processes()
            # Before the first fork: the workers say there whether they compiled, and a
            # restarted one finds what the last one compiled on.
            compile_notes.share()
            preload_compile_for_restarts()
        imported = boottime()
        try:
            new = import_all(preloads)
        except PreloadError as error:
            sys.exit(str(error))  # its last line: pyinit run names it
    unsafe = fork_unsafe() if preloads else ""
    if unsafe:
        sys.exit(f"--preload {','.join(preloads)}: {unsafe}")
    if log is not None:
        log.phase("agent start", started or process_start(), entered)
        log.phase("agent import torch", start, imported, preloaded=preloaded)
        log.phase("agent preload", imported, boottime(), modules=list(preloads), imported=new)
        log.close()
    # What this agent imported, kept for the next cold start where the
    # environment has no bytecode of its own (pyinit.bytecode); a warm
    # interpreter's fork leaves it to the warm interpreter.
    filler = None if preloaded else bytecode.fill_later()
    workers_end_with_this_process()
    try:
        torchrun.main(argv)
    except ChildFailedError as failed:
        record_failures(failed)
        raise
    finally:
        bytecode.end(filler)


class WorkerEnds:
    """A wait with a timeout that a worker's end cuts short: its process's
    pidfd, and for a forked worker the pipe it hands its return value back
    on (it lives on until the agent has read every rank's). Each is dropped
    once seen readable, so that an end torch has seen does not cut every
    later wait short."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._owned: set[int] = set()  # the pidfds; the pipes are torch's

    def watch(self, pids: Iterable[int], pipes: Iterable[int] = ()) -> None:
        """The workers to watch, beside those watched already (forget() first
        for a new group)."""
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already (torch sees it), or no pidfds here
                continue
            self._owned.add(fd)
            self._poll.register(fd, select.POLLIN)
        for fd in pipes:
            self._poll.register(fd, select.POLLIN)

    def forget(self) -> None:
        self._poll = select.poll()
        for fd in self._owned:
            os.close(fd)
        self._owned.clear()

    def wait(self, seconds: float) -> None:
        """Returns when a watched worker has ended or returned, or after `seconds`."""
        for fd, _ in self._poll.poll(seconds * 1000):
            self._poll.unregister(fd)
            if fd in self._owned:
                self._owned.remove(fd)
                os.close(fd)


def notice_worker_ends() -> None:
    """torchrun's agent looks at its workers once per monitor interval (0.1
    s), sleeping in between: a worker that died waited that long for the
    restart, 37% of an eager restart on a 2-core machine (0.19 s against
    0.12 with a 0.02 s interval), and a finished group for its end. The
    agent's sleep between looks now ends as soon as a worker process ends
    or hands back its return value, and otherwise lasts the interval, so
    the agent looks no more often than torch's does. The pidfds are closed
    before each group is started, so no worker inherits its siblings'."""
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    ends = WorkerEnds()
    start = LocalElasticAgent._start_workers

    @functools.wraps(start)
    def start_watched(agent: Any, *args: Any, **kwargs: Any) -> Any:
        ends.forget()
        pids = start(agent, *args, **kwargs)
        returns = getattr(agent._pcontext, "_ret_vals", {})  # forked workers only
        ends.watch(pids.values(), [queue._reader.fileno() for queue in returns.values()])
        return pids

    class Clock:
        """The time module as torch's agent sees it, but for its sleep."""

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            ends.wait(seconds)

    LocalElasticAgent._start_workers = start_watched
    api.time = Clock()


def time_restarts(status_dir: Path, node: int) -> None:
    """A restart's phases in the run's event log, from hooks on torchrun's
    agent (its own methods, one per step of a restart): the failure seen
    (from the failed rank's last sign of life), the workers stopped, the
    rendezvous, the new workers started. The new workers time the rest."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    attempt = 0
    restarting: EventLog | None = None

    def timed(cls: type, method: str, phase: str) -> None:
        inner = getattr(cls, method)

        @functools.wraps(inner)
        def wrapper(agent: Any, *args: Any, **kwargs: Any) -> Any:
            began = boottime()
            try:
                return inner(agent, *args, **kwargs)
            finally:
                if restarting is not None:
                    restarting.phase(phase, began, boottime())

        setattr(cls, method, wrapper)

    restart = SimpleElasticAgent._restart_workers

    @functools.wraps(restart)
    def timed_restart(agent: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal attempt, restarting
        attempt += 1
        seen = boottime()
        restarting = EventLog.for_run(node=node, attempt=attempt)
        if restarting is None:
            return restart(agent, *args, **kwargs)
        signs = [max(p.last_step, p.beat) for p in read_progress(status_dir)]
        if signs:
            # The rank that went quiet first: the others kept beating until now.
            restarting.phase("restart detect", min(min(signs), seen), seen)
        try:
            return restart(agent, *args, **kwargs)
        finally:
            restarting.close()
            restarting = None

    SimpleElasticAgent._restart_workers = timed_restart
    timed(LocalElasticAgent, "_stop_workers", "restart stop")
    timed(SimpleElasticAgent, "_rendezvous", "restart rendezvous")
    timed(LocalElasticAgent, "_start_workers", "restart start workers")


def forked_workers_end_as_processes() -> None:
    """Workers forked by torchrun's agent end as the processes torchrun
    starts end, seen from the agent.

    torch's group of forked workers is done when every worker has handed
    back its function's return value; each then waits, before it exits, for
    the agent to say it has read them all. Two ends did not fit:

    - A worker that exits 0 without a return value (a script ending in
      ``os._exit(0)``, common where a library's teardown can hang): the
      agent waited for its value for good. It now counts as returned, as a
      process that exits 0 is a success for torchrun.
    - When the agent stops the workers (a signal to the run, a failed
      rank), a worker that had already returned (a script that caught
      Ctrl-C's KeyboardInterrupt, saved and ended) waited out torchrun's 30
      s grace and was KILLed. Its return value is already in its pipe (a
      SimpleQueue, no feeder thread), so the agent says it has read them all
      before it signals the workers; the workers see that as the group's
      stop (``pyinit.run.group``). It says so without waiting for a worker
      to wake (``group.release``): one that torch had killed while it
      waited, as it kills the rest when a rank dies, hung the agent."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    start, poll, close = (
        MultiprocessContext._start,
        MultiprocessContext._poll,
        MultiprocessContext._close,
    )

    @functools.wraps(start)
    def start_sharing(context: Any) -> Any:
        group.started(context._worker_finished_event, context._ret_vals)
        return start(context)

    @functools.wraps(poll)
    def poll_counting_silent_ends(context: Any) -> Any:
        result = poll(context)
        if result is not None or context._pc is None:
            return result
        silent = [rank for rank, process in enumerate(context._pc.processes)
                  if rank not in context._return_values and process.exitcode == 0]  # fmt: skip
        if not silent:
            return None
        for rank in silent:  # a value sent just before the exit is read, not replaced
            queue = context._ret_vals[rank]
            context._return_values[rank] = None if queue.empty() else queue.get()
        return poll(context)

    @functools.wraps(close)
    def close_releasing(context: Any, *args: Any, **kwargs: Any) -> Any:
        finished = getattr(context, "_worker_finished_event", None)
        if finished is not None:
            group.release(finished)
        return close(context, *args, **kwargs)

    MultiprocessContext._start = start_sharing
    MultiprocessContext._poll = poll_counting_silent_ends
    MultiprocessContext._close = close_releasing


def preload_compile_for_restarts() -> None:
    """Once a worker has called torch.compile (its wrapper notes it in
    pyinit.run.compile_notes' page), imports what a compiled step needs
    (COMPILE_PRELOADS, and pyinit.run.preload.compute_compile_caches) in a
    thread, while the workers train: a restarted group, forked from here,
    then has it imported, instead of importing it in every new worker before
    its first compiled step (4 s on an H200 host). The thread is joined
    before any restart forks, so no thread runs at a fork (the fork-safety
    rule of pyinit.run.preload); a bytecode cache that became ready since
    the agent started is taken up then too (pyinit.bytecode.use)."""
    import threading

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    importer: threading.Thread | None = None

    def import_quietly() -> None:
        # Frozen out of the collector's reach as the agent's own imports are:
        # otherwise every collection in a restarted worker walks the compile
        # set's objects (its inductor phase 1.15 s against 1.09 on the VM).
        with contextlib.suppress(PreloadError), collector_paused():
            import_compile_set()  # one that fails is imported by a worker that compiles

    monitor = LocalElasticAgent._monitor_workers

    @functools.wraps(monitor)
    def watching(agent: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal importer
        if importer is None and compile_notes.seen():
            importer = threading.Thread(target=import_quietly, name="compile preloads",
                                        daemon=True)  # fmt: skip
            importer.start()
        return monitor(agent, *args, **kwargs)

    restart = SimpleElasticAgent._restart_workers

    @functools.wraps(restart)
    def restart_unthreaded(agent: Any, *args: Any, **kwargs: Any) -> Any:
        if importer is not None:
            importer.join()
        # A bytecode cache this agent's filler made ready since it started: the
        # new workers read what they import late from there, not from source
        # (pyinit run checked PYINIT_BYTECODE_CACHE before this agent began).
        bytecode.use()
        return restart(agent, *args, **kwargs)

    LocalElasticAgent._monitor_workers = watching
    SimpleElasticAgent._restart_workers = restart_unthreaded


def environment_read_again() -> None:
    """In a warm interpreter's fork, with the launch's environment: what was
    read from the environment once, as the interpreter started or imported,
    read from the launch's, as a fresh start would. The C library's time zone
    (TZ, or /etc/localtime), and c10d's debug level (TORCH_DISTRIBUTED_DEBUG,
    which torch.distributed reads as it loads; a wrong value fails here as
    that import fails in a cold agent). Python code that looked a variable
    up while the warm interpreter imported is compared instead
    (pyinit.run.warm.protocol)."""
    time.tzset()
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available():
        distributed.set_debug_level_from_env()


def _fd2_to(log: Any) -> None:
    """The agent's fd 2 becomes its log, so what torch's C++ side writes there
    goes to the log too: the store's warning for each connection whose peer
    has no name, a connection's timeout with its C++ stack. The terminal
    stays open on another descriptor, named in TERMINAL_FD_ENV, which each
    forked worker makes its fd 2 again. Only for forked workers: a spawned
    one would not inherit it."""
    terminal = os.dup(2)
    os.dup2(log.fileno(), 2)
    os.environ[TERMINAL_FD_ENV] = str(terminal)


def log_handlers_to(stream: Any, writing_to: Callable[[Any], bool]) -> None:
    """Every logging handler whose stream is `writing_to` (torch's, made when
    torch was imported, and any other) writes to `stream` instead."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and writing_to(handler.stream):
                handler.setStream(stream)


def _on_fd(stream: Any, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


def record_failures(failed: Any) -> None:
    """torchrun's record of each failed worker (rank, pid, exit code, the
    signal that killed it, when), for pyinit run to name the first: a worker
    killed by a signal leaves no record of its own."""
    folder = os.environ.get(RUN_DIR_ENV)
    if not folder:
        return
    records = [
        {"rank": rank, "local_rank": f.local_rank, "pid": f.pid, "exit": f.exitcode,
         "signal": f.signal_name() if f.exitcode < 0 else None, "time": float(f.timestamp)}
        for rank, f in failed.failures.items()
    ]  # fmt: skip
    with contextlib.suppress(OSError):  # a full disk: pyinit run falls back on torchrun's status
        write_json(Path(folder) / "status" / FAILURES_FILE, records)


if __name__ == "__main__":
    main()
