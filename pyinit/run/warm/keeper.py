"""The processes of one warm launch, forked from the warm interpreter
(``pyinit.run.warm.server``):

- the keeper (one per launch, a subreaper) forks the agent with the caller's
  descriptors, environment, folder, umask, limits and affinity, relays the
  caller's signals to it and its exit status back, and KILLs everything the
  launch left when the caller goes away (even by kill -9: its socket closes)
  or the warm interpreter dies;
- the agent runs ``pyinit.run.agent.main``, as ``python -m pyinit.run.agent``
  would, with the imports done.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from pyinit import _native, bytecode
from pyinit.process_end import exit_now, flush_stdio
from pyinit.run.warm import protocol, scheduling
from pyinit.runlog.events import boottime
from pyinit.say import say

# What the warm interpreter and each keeper wait for besides their sockets.
WAITED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def reaped() -> Iterator[tuple[int, int]]:
    """Each child that has ended, reaped as it is yielded (pid, wait status)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def keep(channel: socket.socket, server: int, set_by_import: dict[str, str],
         imported: tuple[float, float]) -> int:  # fmt: skip
    """The keeper of one launch (see the module's docstring): forks its
    agent at once, then waits for the launch on `channel`."""
    _native.become_subreaper()
    # The warm interpreter's end ends the run: TERM lets this keeper say so first.
    _native.die_with_parent(signal.SIGTERM, server)
    wakeup = protocol.Wakeup(WAITED)
    to_agent, agent_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    agent = os.fork()
    if agent == 0:
        wakeup.close()
        channel.close()
        to_agent.close()
        become_agent(agent_side, os.getppid())
    agent_side.close()
    try:
        request, fds = protocol.receive(channel, protocol.MAX_FDS + 1)
    except (OSError, ValueError):
        request, fds = None, []
    channel.close()
    if request is None:  # the warm interpreter stopped, or died: so does its spare
        _native.end_children(0)
        return 0
    conn = socket.socket(fileno=fds[0])
    # What the imports set in the environment, they would have set in a fresh start.
    request["env"] = {**set_by_import, **request["env"]}
    forked_at = boottime()
    try:
        protocol.send(conn, {"ok": True, "pid": agent, "forked_at": forked_at,
                             "warm_pid": server, "imported": list(imported)})  # fmt: skip
    except OSError:  # the caller gave up waiting (a signal): its agent never starts
        _native.end_children(0)
        return 1
    protocol.send(to_agent, request, fds[1:])
    for fd in fds[1:]:
        os.close(fd)
    to_agent.close()
    return relay(conn, agent, server, wakeup)


def relay(conn: socket.socket, agent: int, server: int, wakeup: protocol.Wakeup) -> int:
    """The caller's signals to the agent, the agent's status to the caller;
    everything of the launch KILLed when either side goes away first."""
    while True:
        ready, _, _ = select.select([conn, wakeup.read_fd], [], [])
        for sig in wakeup.signals():
            if sig == signal.SIGCHLD:
                code = _agent_status(agent)
                if code is not None:
                    survivors = _native.end_children(0)
                    protocol.send(conn, {"exit": code, "survivors": survivors})
                    return 0
            else:  # the warm interpreter died (the death signal), or a TERM for us
                _native.end_children(0)
                with contextlib.suppress(OSError):
                    protocol.send(conn, {"ended": f"the warm interpreter (pid {server}) "
                                                  "ended during the run"})  # fmt: skip
                return 1
        if conn in ready:
            try:
                message, _ = protocol.receive(conn)
            except (OSError, ValueError):
                message = None
            if message is None:  # pyinit run is gone: nothing of its launch outlives it
                _native.end_children(0)
                return 1
            forward = relayed_signal(message)
            if forward:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent, forward)


def relayed_signal(message: dict[str, Any]) -> int:
    """The signal a caller's message asks for its agent (0 for none): a
    signal number pyinit run forwards, or KILL; anything else is ignored."""
    if message.get("kill") is True:
        return signal.SIGKILL
    number = message.get("signal")
    if type(number) is int and number in protocol.FORWARDED:
        return number
    return 0


def _agent_status(agent: int) -> int | None:
    """The agent's exit status once it has ended (a shell's: 128+N for
    signal N); other children (orphans re-parented here) are reaped."""
    for pid, status in reaped():
        if pid == agent:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
    return None


def become_agent(channel: socket.socket, keeper: int) -> NoReturn:
    """In the keeper's fork: waits for the launch, takes on the caller's
    process as far as a fork can, then runs torchrun's agent. Never returns."""
    code = 1
    try:
        _native.die_with_parent(signal.SIGKILL, keeper)
        request, fds = protocol.receive(channel, protocol.MAX_FDS)
        started = boottime()
        channel.close()
        if request is None:
            exit_now(0)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for sig in WAITED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stdio, store_fd = fds[:3], fds[3] if len(fds) > 3 else None
        for number, fd in enumerate(stdio):
            os.dup2(fd, number)
            os.close(fd)
        env = dict(request["env"])
        if store_fd is not None:
            os.set_inheritable(store_fd, True)
            env[request["store_env"]] = str(store_fd)
        os.environ.clear()
        os.environ.update(env)
        # Where bytecode is read from, as a fresh start with this environment sets
        # it: the caller may name a bytecode cache that became ready after this
        # interpreter started, and the workers it forks then read their late
        # imports (triton's, at a first compile) from there, not from source.
        sys.pycache_prefix = env.get(bytecode.PREFIX_ENV) or None
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        for name, (soft, hard) in request.get("limits", {}).items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if request.get("affinity"):
            os.sched_setaffinity(0, request["affinity"])
        try:
            scheduling.take_on(request["scheduling"])
        except OSError as error:  # allowed by refusal(), refused by this kernel or /proc
            where = f"{error.filename}: " if error.filename else ""
            say(f"pyinit run: part of this launch's scheduling (nice, policy, IO priority, OOM "
                f"score) was not taken on: {where}{error.strerror or error}")  # fmt: skip
        _reopen_stdio()
        from pyinit.run import agent
        from pyinit.run.fresh_interpreter import show_arguments

        sys.argv = [agent.__file__, *request["args"]]
        # ps and pkill -f see the agent a cold launch starts, not the warm interpreter.
        show_arguments([*agent.AGENT_START[1:], *request["args"]])
        code = _run(lambda: agent.main(list(request["args"]), started=started))
    except BaseException:  # the caller must get a status, whatever this was
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
    finally:
        exit_now(code)


def _run(main: Any) -> int:
    """main() with the exit status Python's own start gives it."""
    try:
        main()
    except SystemExit as done:
        if done.code is None:
            return 0
        if isinstance(done.code, int):
            return done.code
        say(str(done.code))
        return 1
    except KeyboardInterrupt:
        # As the interpreter does: end by SIGINT itself, for the shell's 130.
        flush_stdio()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _reopen_stdio() -> None:
    """sys.stdin/stdout/stderr anew on the caller's descriptors: the warm
    interpreter made its own for its log, block-buffered; a terminal is
    line-buffered, as a fresh start would make it."""
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        mode = "r" if number == 0 else "w"
        stream = open(number, mode, closefd=False, encoding=old.encoding,  # noqa: SIM115
                      errors=old.errors)  # fmt: skip
        if number:
            stream.reconfigure(line_buffering=number == 2 or os.isatty(number),
                               write_through=bool(os.environ.get("PYTHONUNBUFFERED")))  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
