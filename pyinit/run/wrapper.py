"""What each worker of ``pyinit run`` runs: the user's script (as
``__main__``), module (as ``python -m`` runs it) or program, with

- its exit status written down, because torchrun reports a failed worker as its
  own exit status 1 and the script's own code is lost;
- a mark per attempt, so restarts show without parsing torchrun's log;
- the worker's timeline in the run's event log (``PYINIT_RUN_DIR``), without the
  script's help: its start, ``import torch``, the device's initialisation, the
  process group's, the first optimizer step and the last (hooks on torch's own
  functions, installed before the script runs);
- its progress for the stall watch (``pyinit.runlog.progress``): a step count
  and a heartbeat, and its stacks on request (faulthandler).

``pyinit run`` starts it two ways. By default torchrun forks each worker from
its agent, which has imported torch already (``--start-method fork --run-path``
this file): the workers do not import torch again. With ``--worker-start
spawn``, or for a program, torchrun starts a fresh interpreter::

    python -m pyinit.run.wrapper STATUS_DIR script|module|program NAME [ARGS...]

Under plain torchrun (``-m pyinit.run.wrapper`` with ``PYINIT_RUN_DIR`` set) the
same marks are written, which is how the two launchers are compared.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import os
import re
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from pyinit import _native
from pyinit.jsonfile import write_json
from pyinit.phases import install as install_phases
from pyinit.phases import phase
from pyinit.process_end import flush_stdio
from pyinit.run import compile_notes, ddp_pieces, fresh_interpreter, group
from pyinit.run.agent import TERMINAL_FD_ENV, log_handlers_to
from pyinit.run.compiles import (
    COMPILE_CACHE_ENV,
    CompileMarks,
    load_portable,
    once_dynamo_is_imported,
)
from pyinit.run.pattern_setup import PatternSetup, optimizer_device
from pyinit.run.preload import COMPILE_PRELOADS, threads_as_asked
from pyinit.run.store import FD_ENV as STORE_FD_ENV
from pyinit.runlog.appender import Appender
from pyinit.runlog.events import EventLog, boottime, process_start
from pyinit.runlog.progress import (
    STACK_SIGNAL,
    TEARDOWN_S,
    ProgressWriter,
    install,
    progress_path,
    stack_path,
    teardown_path,
    traceback_path,
)
from pyinit.runlog.steps import StepLog, steps_path
from pyinit.say import say
from pyinit.torchrun import worker_ends_with_it

# The status a shell shows for Python ended by an uncaught KeyboardInterrupt
# (it ends by SIGINT itself).
INTERRUPTED = 128 + signal.SIGINT


def _record(status_dir: Path, code: int) -> None:
    """The script's own exit status for pyinit run; on a full disk, without it
    (pyinit run then reports torchrun's status), said in one line. A failure's
    teardown is bounded from here on."""
    rank = os.environ.get("RANK", "0")
    record = {"rank": int(rank), "pid": os.getpid(), "exit": code, "time": time.time()}
    try:
        write_json(status_dir / f"rank-{rank}.json", record, indent=None)
    except OSError as error:
        say(f"pyinit run: rank {rank}'s exit status {code} is not recorded: "
            f"{error.strerror or error}")  # fmt: skip
    if code != 0:
        _bound_teardown(status_dir, rank)


def _bound_teardown(status_dir: Path, rank: str) -> None:
    """A failed worker ends within TEARDOWN_S, whatever its teardown does.
    Freeing the failed script's objects can block for good: torch's teardown
    of a DDP reducer over a broken gloo group can deadlock holding the GIL,
    and every other rank then waits for this one's sockets to close.
    faulthandler's watchdog needs no GIL: past the limit it writes every
    thread's stack to the rank's teardown file and exits with status 1."""
    try:
        stacks = open(teardown_path(status_dir, int(rank)), "w")  # noqa: SIM115 (faulthandler keeps it)
    except OSError:
        stacks = sys.__stderr__  # a full disk: the stacks on the terminal, the bound kept
    faulthandler.dump_traceback_later(TEARDOWN_S, exit=True, file=stacks)


def _run_program(argv: list[str]) -> int:
    """A program under the core's supervisor, as pod-init runs a command: the
    seven signals forwarded, every child reaped, its status as a shell gives
    it (128+N for signal N, 127 not found). This worker runs no thread of its
    own, so the signals the supervisor waits for are blocked in all of them."""
    return _native.supervise([os.fsencode(word) for word in argv], {},
                             on_log=lambda line: say(f"pyinit run: {line}"))  # fmt: skip


def attempt_store(dist: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """After a restart, the process group's keys in a prefix of their own.

    torchrun's static rendezvous (the one pyinit run uses) keeps one store for
    every attempt of the worker group, and the default process group writes
    the same keys each time: a restarted rank can read a killed rank's gloo
    address and fail with "Connection refused". Only for the env:// default
    that torchrun sets up; a script that brings its own store keeps it."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    own_rendezvous = len(args) > 1 or kwargs.get("store") is not None or kwargs.get(
        "init_method", "env://") != "env://"  # fmt: skip
    if attempt == 0 or own_rendezvous or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)  # fmt: skip
    kwargs["store"] = dist.PrefixStore(f"pyinit/attempt_{attempt}", store)
    kwargs.setdefault("rank", int(os.environ["RANK"]))
    kwargs.setdefault("world_size", int(os.environ["WORLD_SIZE"]))


class Marks:
    """The worker's phases, written to the run's event log (when there is one)
    as they end, and its progress, counted for the stall watch."""

    def __init__(self, log: EventLog | None, progress: ProgressWriter, steps: StepLog | None,
                 compile_cache: Path | None = None,
                 command: bytes = compile_notes.NO_KEY):  # fmt: skip
        self.log = log
        self.progress = progress  # counts the steps: the stall watch's and the timeline's
        self.steps = steps  # the report's record of each step
        self.ready = boottime()  # when the last phase ended: the next one's start
        self.first_step = 0.0  # when the first optimizer step ended
        self.step_began = 0.0  # when the first forward began
        self.optimizer_began = 0.0  # when the first optimizer step began
        self.destroyed_groups: list[Any] = []  # see keep_destroyed_groups
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.command = command  # compile_notes.command_key of what this worker runs
        # The same compiled job started again: inductor's patterns, set up beside start-up.
        self.pattern_setup: PatternSetup | None = None

        def first_compile() -> None:
            self.wait_for_patterns()
            # The sign for the agent or warm interpreter this was forked from to
            # import the compile set (pyinit.run.agent.preload_compile_for_restarts).
            compile_notes.note()
            # Here, not when dynamo is imported: what it imports, a compile imports
            # anyway, and a worker that never compiles must not.
            ddp_pieces.install()

        self.compiles = CompileMarks(self.log_phase, self.log_event,
                                     on_first_compile=first_compile,
                                     save_to=compile_cache)  # fmt: skip

    def set_up_patterns(self) -> str | None:
        """Where this command's last start on this node compiled past
        AOTAutograd's cache on a GPU, inductor's patterns for that GPU in a
        thread once CUDA is initialised (pyinit.run.pattern_setup); the
        device noted, if any."""
        device = compile_notes.remembered_device(self.command, self.local_rank)
        if device is not None and device.startswith("cuda"):
            self.pattern_setup = PatternSetup(device, self.log_phase)
        return device

    def wait_for_patterns(self) -> None:
        if self.pattern_setup is not None:
            self.pattern_setup.wait()

    def log_phase(self, name: str, start: float, end: float, **fields: Any) -> None:
        # Not self.phase: a compile inside a step does not end what the step waits on.
        if self.log is not None:
            self.log.phase(name, start, end, **fields)

    def log_event(self, kind: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.write(kind, **fields)

    def phase(self, name: str, start: float, end: float, **fields: Any) -> None:
        if self.log is not None:
            self.log.phase(name, start, end, **fields)
        self.ready = end

    def instrument_torch(self) -> None:
        """``import torch`` timed, and hooks on what every training script calls."""
        preloaded = "torch" in sys.modules  # forked from an agent that imported it
        start = boottime()
        import torch
        import torch.distributed as dist
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if not preloaded:  # forked with torch loaded: the worker start says so
            self.phase("import torch", start, boottime())

        lazy_init = torch.cuda._lazy_init
        initialising = False

        # torch's C++ side calls torch.cuda._lazy_init by name too, so this sees
        # the first CUDA use wherever it comes from. torch calls it again from
        # inside itself while it initialises (queued calls): those pass through.
        @functools.wraps(lazy_init)
        def timed_lazy_init() -> None:
            nonlocal initialising
            if initialising or torch.cuda.is_initialized():
                return lazy_init()
            initialising = True
            began = boottime()
            try:
                lazy_init()
            finally:
                initialising = False
            self.phase("device init", began, boottime())
            if self.pattern_setup is not None:
                self.pattern_setup.start()
            return None

        torch.cuda._lazy_init = timed_lazy_init
        init_process_group = dist.init_process_group

        @functools.wraps(init_process_group)
        def timed_init_process_group(*args: Any, **kwargs: Any) -> Any:
            began = boottime()
            attempt_store(dist, args, kwargs)
            result = init_process_group(*args, **kwargs)
            backend = str(dist.get_backend())
            self.phase("process group", began, boottime(), backend=backend,
                       world_size=dist.get_world_size())  # fmt: skip
            return result

        dist.init_process_group = timed_init_process_group
        dist.destroy_process_group = keep_destroyed_groups(dist, self.destroyed_groups)

        self._time_first_step(torch)
        once_dynamo_is_imported(torch, self.compiles.install)

        def after_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
            self.progress.step()
            if self.steps is not None:
                self.steps.step(self.progress.last_step)
            if not self.first_step:
                self.first_step = self.progress.last_step
                began = self.step_began or self.ready
                if self.step_began and self.optimizer_began:
                    self.phase("first optimizer step", self.optimizer_began, self.first_step)
                self.phase("first step", began, self.first_step)
                compiled = self.compiles.summary("first step")
                # Graphs past AOTAutograd's cache go through the patterns at every start.
                device = optimizer_device(optimizer) if compiled.get("aot_cache_bypasses") else None
                compile_notes.remember_device(self.command, self.local_rank, device)

        register_optimizer_step_post_hook(after_step)

        # Time blocked in any DataLoader is the step's data wait.
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        next_batch = _BaseDataLoaderIter.__next__

        @functools.wraps(next_batch)
        def timed_next(loader: Any) -> Any:
            with phase("data"):
                return next_batch(loader)

        _BaseDataLoaderIter.__next__ = timed_next

    def _time_first_step(self, torch: Any) -> None:
        """The first step's parts, from hooks on torch that remove themselves
        once used: the script's set-up (from the last phase to its first
        forward), the first forward of an outermost module, the first
        backward, the first optimizer step."""
        from torch.nn.modules import module
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        # The first outermost module call is found by a global hook that goes at
        # once: left in place, torch.compile would trace it into every submodule
        # call of that forward, and warn that it is there.
        first_call: Any = None  # the global hook, until it has fired
        undo_compiled_call: Callable[[], None] | None = None

        def forward_began(outermost: Any) -> None:
            nonlocal first_call
            first_call.remove()
            first_call = None
            if undo_compiled_call is not None:
                undo_compiled_call()
            self.wait_for_patterns()  # never beside a trace of the script's modules
            began = boottime()
            if not self.step_began:
                self.phase("script setup", self.ready, began)
                self.step_began = began

            def forward_ended(_module: Any, _args: Any, _result: Any) -> None:
                ended.remove()
                self.phase("first forward", began, boottime())

            ended = outermost.register_forward_hook(forward_ended, always_call=True)

        first_call = module.register_module_forward_pre_hook(
            lambda outermost, _args: forward_began(outermost))  # fmt: skip

        def ahead_of_compiled_modules() -> None:
            """A compiled module called first looks for global hooks before
            its own hooks run: it is the outermost, and the hook goes first."""
            nonlocal undo_compiled_call
            if first_call is None:  # a module was called before the first torch.compile
                return
            from torch._dynamo.eval_frame import OptimizedModule

            compiled_call = OptimizedModule.__call__

            def first_compiled_call(compiled: Any, *args: Any, **kwargs: Any) -> Any:
                if first_call is not None:
                    forward_began(compiled)
                return compiled_call(compiled, *args, **kwargs)

            def undo() -> None:
                OptimizedModule.__call__ = compiled_call

            OptimizedModule.__call__ = first_compiled_call
            undo_compiled_call = undo

        once_dynamo_is_imported(torch, ahead_of_compiled_modules)
        backward = torch.autograd.backward

        # Tensor.backward calls torch.autograd.backward by name.
        @functools.wraps(backward)
        def timed_backward(*args: Any, **kwargs: Any) -> Any:
            torch.autograd.backward = backward
            start = boottime()
            try:
                return backward(*args, **kwargs)
            finally:
                if self.step_began:
                    self.phase("first backward", start, boottime())

        torch.autograd.backward = timed_backward

        def before_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            if not self.optimizer_began and not self.first_step:
                self.optimizer_began = boottime()

        register_optimizer_step_pre_hook(before_step)

    def finish(self) -> None:
        self.wait_for_patterns()
        self.compiles.summary("end")
        if self.first_step and self.progress.steps > 1 and self.log is not None:
            self.log.phase("steps", self.first_step, self.progress.last_step,
                           steps=self.progress.steps)  # fmt: skip


def keep_destroyed_groups(dist: Any, kept: list[Any]) -> Any:
    """``destroy_process_group`` that keeps a reference to the groups it
    destroys, for ``release_groups`` to drop once the script has ended.

    A DDP model that outlives its process group holds the group's last
    reference. Freeing the model (as ``main()`` returns) frees the reducer
    holding the GIL (torch binds it without releasing it), and with it the
    gloo group, whose destructor joins gloo's threads. One of them may be
    freeing a finished collective whose thread-local state holds a Python
    object (the autograd context torch stashes during backward), which
    needs the GIL: the rank hangs for good. A group freed through its own
    Python object releases the GIL first (torch's holder for process
    groups), so the group is left for that path."""
    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_keeping(group: Any = None) -> Any:
        from torch.distributed import distributed_c10d as c10d

        world = getattr(c10d, "_world", None)  # torch's own table of groups
        kept.extend(list(getattr(world, "pg_map", ())) if group is None else [group])
        return destroy(group)

    return destroy_keeping


def release_groups(marks: Marks | None) -> None:
    """The destroyed groups freed, once whatever the script left is: the
    collector first (a reducer in a reference cycle), then each group
    through its Python object, which releases the GIL while gloo's threads
    are joined."""
    if marks is not None and marks.destroyed_groups:
        gc.collect()
        marks.destroyed_groups.clear()


def watch_progress(status_dir: Path, rank: int) -> ProgressWriter:
    """This rank's progress file and heartbeat for pyinit run's stall watch, and
    its stacks written on STACK_SIGNAL (faulthandler: even from inside C code)."""
    progress = ProgressWriter(progress_path(status_dir, rank))
    install(progress)
    # The watch reads each dump from where the file ended when it asked. A
    # signal handler cannot check its descriptor (pyinit.runlog.appender):
    # the heartbeat does, and hands faulthandler the file opened again.
    stacks = Appender(stack_path(status_dir, rank))

    def dump_stacks_to_file() -> None:
        faulthandler.register(STACK_SIGNAL, file=stacks.fd, all_threads=True, chain=False)

    def keep_stack_file() -> None:
        if stacks.reopened():
            dump_stacks_to_file()

    dump_stacks_to_file()
    progress.start_heartbeat(keep_stack_file)
    return progress


def main() -> None:
    entered = boottime()
    # Forked from the agent, whose fd 2 and sys.stderr are its log file: the
    # script's output and tracebacks go to the terminal, as they would without us.
    terminal = os.environ.pop(TERMINAL_FD_ENV, None)
    if terminal is not None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(int(terminal), 2)
            os.close(int(terminal))
    agent_log, sys.stderr = sys.stderr, sys.__stderr__
    if agent_log is not sys.stderr:
        # torch's log records (dynamo's recompile warnings, DDP's, TORCH_LOGS)
        # on the terminal, as a fresh interpreter's handlers write them.
        log_handlers_to(sys.stderr, lambda stream: stream is agent_log)
    # The agent's alone (the script's own subprocesses must not take it for theirs).
    os.environ.pop(STORE_FD_ENV, None)
    # If torchrun's agent dies (even by KILL), so does this worker.
    worker_ends_with_it()
    # Forked from the agent, the worker inherits its handlers (torchrun's, which
    # raise its SignalException on TERM, INT, HUP and QUIT).
    fresh_interpreter.signals_as_started()
    forked = "torch" in sys.modules
    if forked:
        threads_as_asked()  # torch's threads were counted in the parent
        fresh_interpreter.own_session()
        fresh_interpreter.multiprocessing_as_started()
        fresh_interpreter.take_stdin()
        fresh_interpreter.random_state_as_started()
        fresh_interpreter.drop_inherited_exit_functions()
    returns = group.return_pipe(int(os.environ.get("LOCAL_RANK", "0"))) if forked else None
    status_dir, kind, name, *args = sys.argv[1:]
    # torchrun counts its restarts of the worker group; pyinit run watches for new attempts.
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        (Path(status_dir) / f"attempt-{attempt}").touch()
    except OSError as error:  # a full disk: pyinit run misses this restart's mark, training goes on
        say(f"pyinit run: attempt {attempt} is not marked: {error.strerror or error}")
    rank, node = int(os.environ.get("RANK", "0")), int(os.environ.get("GROUP_RANK", "0"))
    log = EventLog.for_run(rank=rank, node=node, attempt=attempt)
    marks = None
    if kind != "program":
        progress = watch_progress(Path(status_dir), rank)
        steps = None
        if log is not None:
            steps = StepLog(steps_path(log.path.parent, rank), attempt, log)
            install_phases(steps)
        cache = Path(os.environ[COMPILE_CACHE_ENV]) if os.environ.get(COMPILE_CACHE_ENV) else None
        marks = Marks(log, progress, steps, cache if rank == 0 else None,
                      compile_notes.command_key(kind, name, args))  # fmt: skip
        last_compiled_on = marks.set_up_patterns()
        marks.phase("worker start", process_start(), entered, torch_loaded="torch" in sys.modules,
                    compile_loaded=COMPILE_PRELOADS[0] in sys.modules,
                    last_compiled_on=last_compiled_on)  # fmt: skip
        marks.instrument_torch()
        if cache is not None:
            load_portable(cache, marks.log_event)
    code = None  # the script's exit status once its end has been recorded
    worker = os.getpid()  # another pid at the script's end: a child the script forked
    try:
        if kind == "program":
            sys.exit(_run_program([name, *args]))
        sys.argv = [name, *args]
        fresh_interpreter.arguments_shown(kind, name, args)
        if kind == "module":
            # As `python -m` does, the working directory's modules are importable; last,
            # so a checkout of pod-init there cannot shadow the installed package.
            sys.path.append(os.getcwd())
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(name).resolve().parent))
            fresh_interpreter.run_script(name)
        if os.getpid() != worker:
            _child_ends(0)
    except SystemExit as e:
        # The status the process ends with: exit() keeps the low byte (-1 is 255).
        status = e.code % 256 if isinstance(e.code, int) else (0 if e.code is None else 1)
        if os.getpid() != worker:
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)  # as Python's exit shows sys.exit("why")
            _child_ends(status)
        code = _end(Path(status_dir), status, forked)
        if code != status:
            raise SystemExit(1) from None
        if code != 0:
            raise e from None
    except BaseException as error:
        interrupted = isinstance(error, KeyboardInterrupt)
        if os.getpid() != worker:
            traceback.print_exception(
                type(error), error, fresh_interpreter.from_the_script(error.__traceback__)
            )
            _child_ends(INTERRUPTED if interrupted else 1)
        if interrupted and group.stopping():
            # The agent's stop, by its SIGINT to the group: pyinit run says how the run ended.
            _end(Path(status_dir), INTERRUPTED, forked)
            sys.exit(INTERRUPTED)
        # Any other uncaught exception ends the script as Python ends it. torch's worker
        # function takes a KeyboardInterrupt for its agent's stop and ends the worker as 0
        # with no result, for which the agent would wait for good.
        line = checkpoint_failure(error)
        if line is None:
            line = peer_gone_line(error, traceback_path(Path(status_dir), rank))
        if line is not None:
            say(f"pyinit run: rank {rank}: {line}")
        else:
            # The script's own traceback, on the terminal as without us: a worker forked
            # by torchrun would otherwise hand it to the agent, whose log keeps it. (Not
            # kept in a local: this frame would then hold the script's frames in a cycle,
            # and the failed script's objects would never be freed.)
            traceback.print_exception(
                type(error), error, fresh_interpreter.from_the_script(error.__traceback__)
            )
        code = INTERRUPTED if interrupted else 1
        _end(Path(status_dir), code, forked)
        sys.exit(code)
    finally:
        if marks is not None:
            marks.finish()
        release_groups(marks)
    if code is None and (code := _end(Path(status_dir), 0, forked)):
        sys.exit(code)
    if not group.return_pipe_kept(returns):
        # The script closed the pipe torch's worker function would send its
        # None on: the worker ends as that function would, with status 0, which
        # the agent counts as returned.
        _exit_flushed(0)


def _child_ends(status: int) -> NoReturn:
    """A child the script forked (``os.fork()``) ran to the script's end: it
    ends as Python ends such a child, its threads joined and its exit
    functions run, and nothing of the worker's end: its exit status is not
    the rank's, and a result sent on torch's pipe would tell the agent the
    rank had finished while the worker still runs."""
    fresh_interpreter.run_at_exit()
    _exit_flushed(status)


def _exit_flushed(status: int) -> NoReturn:
    """The process's end without the interpreter's teardown, as
    multiprocessing ends a forked worker, its output written out first."""
    flush_stdio()
    os._exit(status)


def _end(status_dir: Path, code: int, forked: bool) -> int:
    """The script's end: its background checkpoints waited for (a failed one
    makes a clean exit 1) and its exit status recorded (a failed worker's
    teardown bounded from there), then, in a forked worker, its threads and
    atexit functions, as Python's exit runs them (a fresh interpreter does
    so itself, after this)."""
    if _finish_saves() and code == 0:
        code = 1
    _record(status_dir, code)
    if forked:
        fresh_interpreter.run_at_exit()
    return code


def checkpoint_failure(error: BaseException) -> str | None:
    """One line for a checkpoint that could not be written or read because
    of the disk or the file (a full or read-only disk, a damaged file), not
    the script: an OSError or InputError raised inside pyinit.checkpoint, or
    DCP's CheckpointException holding only such errors. None for the rest."""
    from pyinit.errors import InputError

    def ours(cause: BaseException) -> bool:
        if not isinstance(cause, (OSError, InputError)):
            return False
        frame = cause.__traceback__
        while frame is not None:
            if frame.tb_frame.f_globals.get("__name__", "").startswith("pyinit.checkpoint"):
                return True
            frame = frame.tb_next
        return False

    dcp = sys.modules.get("torch.distributed.checkpoint.api")
    if dcp is not None and isinstance(error, dcp.CheckpointException):
        causes = [cause for cause, _trace in error.failures.values()]
        if causes and all(ours(cause) for cause in causes):
            return "; ".join(dict.fromkeys(f"checkpoint: {cause}" for cause in causes))
        return None
    return f"checkpoint: {error}" if ours(error) else None


# What torch's backends say when the rank at the other end of a collective
# has gone: gloo's TCP transport (its message starts with its source file's
# path), and NCCL's remote error.
PEER_GONE = re.compile(r"gloo/transport/.*(Connection (closed|reset) by peer|Broken pipe)|"
                       r"NCCL.*remote process exited or there was a network error")  # fmt: skip


def peer_gone_line(error: BaseException, path: Path) -> str | None:
    """One line for a collective that failed because another rank went away
    (killed, stopped or its node lost), its traceback written to `path`;
    None for any other error. Such a rank is a casualty, not the cause:
    pyinit run names the rank that failed first or the node that is gone,
    and a stopped job would otherwise show one traceback per node that
    heard of the stop from its peers before its own signal came."""
    if not isinstance(error, RuntimeError):
        return None
    first = str(error).split("\n", 1)[0]
    found = PEER_GONE.search(first)
    if found is None:
        return None
    # gloo starts with its source file's [path:line] and ends with advice.
    advice = first.find(". ", found.end(1) if found.group(1) else found.end())
    said = re.sub(r"^\[[^\]]*\]\s*", "", first if advice < 0 else first[:advice])
    try:
        with open(path, "w") as f:
            traceback.print_exception(error, file=f)
        where = f"; its traceback: {path}"
    except OSError:
        traceback.print_exc()  # a full disk: the traceback on the terminal, as before
        where = ""
    return f"a collective failed because another rank is gone ({said}){where}"


def _finish_saves() -> bool:
    """Waits for the script's background checkpoints (a worker may exit
    through os._exit, which would cut them off); says which failed. True when
    one did."""
    checkpoint = sys.modules.get("pyinit.checkpoint")
    if checkpoint is None:
        return False
    failures = checkpoint.wait_pending()
    for line in failures:
        say(f"pyinit run: {line}")
    return bool(failures)


if __name__ == "__main__":
    main()
