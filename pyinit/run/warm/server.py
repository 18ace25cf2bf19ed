"""The warm interpreter: binds the user's socket, imports torch and the
preloads, then forks a keeper for every launch it is handed::

    python -P -m pyinit.run.warm.server [--preload MOD,...] [--idle-timeout S] [--ready-fd N]

Three processes per launch, each with one job (the keeper and its agent
forked ahead, a spare pair waiting for the next launch):

- the warm interpreter accepts, checks the peer's uid before reading
  anything, reads every peer's request as it comes (``intake``: none waits
  behind another), compares a launch with itself, and hands it to the spare;
- the keeper and the agent (``keeper``) run the launch.

What it holds and how a launch compares with it is ``interpreter.Warm``. Its
own lines go to ``warm.log`` beside the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinit import bytecode
from pyinit.run.agent import set_agent_defaults
from pyinit.run.preload import (
    PreloadError,
    fork_unsafe,
    parse,
)
from pyinit.run.warm import caller, cpu_probe, protocol
from pyinit.run.warm.intake import REPLY_TIMEOUT_S, Intake
from pyinit.run.warm.interpreter import Spare, Warm, say
from pyinit.run.warm.keeper import WAITED, keep, reaped

# How often the loop looks for a worker's first compile while a launch runs,
# when it waits for one before importing the compile set (pyinit.run.compile_notes).
COMPILE_SEEN_POLL_S = 0.25


def bind(path: Path) -> socket.socket:
    """The listening socket at `path`; OSError EADDRINUSE when a warm
    interpreter answers there already (a dead one's socket is replaced)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(str(path))
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            listener.close()
            raise protocol.socket_error(error, "bind", path) from None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            listener.close()
            raise OSError(errno.EADDRINUSE, "a warm interpreter is running already",
                          str(path)) from None  # fmt: skip
        except ConnectionRefusedError:
            path.unlink()  # a dead one's socket
            listener.bind(str(path))
        finally:
            probe.close()
    os.chmod(path, 0o600)
    listener.listen(64)
    return listener


@dataclass
class Channels:
    """What the warm interpreter's loop waits on; a fork closes its copies."""

    listener: socket.socket
    wakeup: protocol.Wakeup
    intake: Intake

    def close_in_fork(self) -> None:
        self.listener.close()
        self.wakeup.close()
        self.intake.close()


def serve(warm: Warm, listener: socket.socket, path: Path) -> None:
    """Accepts until stopped or idle for the idle timeout."""
    listener.setblocking(False)
    channels = Channels(listener, protocol.Wakeup(WAITED), Intake(say))
    warm.spare = fork_spare(warm, channels)
    last = time.monotonic()
    stopping = False
    while True:
        timeout = channels.intake.timeout()
        if warm.idle_timeout > 0 and not warm.keepers and not channels.intake.pending \
                and not stopping:  # fmt: skip
            timeout = max(0.0, last + warm.idle_timeout - time.monotonic())
            if timeout == 0:
                say(f"idle for {warm.idle_timeout:g} s (--idle-timeout): ending")
                warm.end_import()
                return
        if warm.keepers and warm.deferred and not warm.compile_set_wanted():
            # A worker that compiles says so through shared memory, not a wakeup.
            timeout = min(COMPILE_SEEN_POLL_S, timeout if timeout is not None else math.inf)
        watched = [channels.wakeup.read_fd]
        if warm.importing is not None:
            watched.append(warm.importing.done_fd)
        if not stopping:
            watched += [listener.fileno(), *channels.intake.fds()]
        ready = _poll(watched, timeout)
        for sig in channels.wakeup.signals():
            if sig == signal.SIGCHLD:
                _reap(warm)
                last = time.monotonic()
            elif not stopping:
                stopping = True
                say(f"{signal.Signals(sig).name}: no more launches")
        if not stopping:
            if listener.fileno() in ready:
                _accept_all(channels)
            for conn, request, fds in channels.intake.read(ready):
                last = time.monotonic()
                with conn:
                    try:
                        stopping = _answer(warm, channels, conn, request, fds) or stopping
                    finally:
                        for fd in fds:
                            os.close(fd)
        if warm.importing is not None and warm.importing.done_fd in ready and not stopping:
            stopping = _take_step(warm, channels)
        if not stopping and warm.deferred and warm.importing is None \
                and not channels.intake.pending and warm.compile_set_wanted():  # fmt: skip
            if warm.spare is None:  # forked before the thread starts: it serves meanwhile
                warm.spare = fork_spare(warm, channels)
            if warm.until_compiled and not warm.probe_begun:
                # A launch compiles now: the next may too, so the CPU probe runs
                # beside the imports, forked before their thread starts.
                _begin_probe(warm, channels, beside_a_compile=True)
            warm.begin_import()
        if stopping:
            warm.end_import()
            _unlink_if_ours(path, listener)
            channels.intake.close()
            listener.close()
            warm.drop_spare()
            if not warm.keepers:
                return
        elif warm.spare is None and warm.importing is None:
            warm.spare = fork_spare(warm, channels)


def _take_step(warm: Warm, channels: Channels) -> bool:
    """The deferred step under way waited for and taken in, and after the
    last one the CPU probe started; True when forking is no longer safe
    (said here): no more launches."""
    unsafe = warm.settle_import()
    if unsafe:
        say(f"{unsafe}: no more launches")
        return True
    if not warm.deferred:
        warm.drop_spare()  # forked before the compile set: the next one has it
        if not warm.probe_begun:
            _begin_probe(warm, channels)
        elif warm.probe_ended is not None:
            _take_probe(warm, warm.probe_ended)
    return False


def _begin_probe(warm: Warm, channels: Channels, beside_a_compile: bool = False) -> None:
    warm.cpu_probe = cpu_probe.start(channels.close_in_fork, beside_a_compile)
    warm.probe_begun = True


def _take_probe(warm: Warm, status: int) -> None:
    """The ended probe's verdicts taken in (its wait `status`); a spare
    forked before them is replaced by one that has them."""
    assert warm.cpu_probe is not None
    problem = cpu_probe.finish(warm.cpu_probe, status)
    warm.cpu_probe = None
    warm.probe_ended = None
    if problem:
        say(problem)
    else:
        warm.drop_spare()


def _poll(fds: list[int], timeout: float | None) -> set[int]:
    """The descriptors of `fds` that are readable or closed (poll: no limit
    on descriptor numbers, and no descriptor of its own for a fork to inherit)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _events in poller.poll(None if timeout is None else timeout * 1000)}


def _unlink_if_ours(path: Path, listener: socket.socket) -> None:
    """The socket file, unless another warm interpreter has bound it since."""
    if listener.fileno() >= 0 and listener.getsockname() == str(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _reap(warm: Warm) -> None:
    for pid, status in reaped():
        warm.keepers.discard(pid)
        if warm.cpu_probe is not None and warm.cpu_probe.pid == pid:
            if warm.deferred or warm.importing is not None:
                # Its verdicts go into inductor's caches, imported with the set:
                # taken once the set is in (_take_step).
                warm.probe_ended = status
            else:
                _take_probe(warm, status)
        if warm.spare is not None and warm.spare.pid == pid:  # it died waiting
            warm.drop_spare()


def _accept_all(channels: Channels) -> None:
    """Every connection waiting, refused unless it is this user's (before a
    byte is read), else greeted and read as its bytes come."""
    while True:
        try:
            conn, _ = channels.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:  # out of descriptors: the oldest peer makes room
            say(f"a connection could not be taken: {error.strerror or error}")
            if not channels.intake.pending:
                return
            channels.intake.add_room()
            continue
        uid = protocol.peer_uid(conn)
        if uid == os.geteuid():
            try:
                # Before this, the peer only knows it is queued (the imports may still
                # run): it sends its request, and the descriptors in it, only now.
                protocol.send(conn, protocol.GREETING)
            except OSError:  # gone already (a probe)
                conn.close()
                continue
            channels.intake.add(conn)
            continue
        # Before reading a byte: another user's process learns nothing but this.
        say(f"refused a connection from uid {uid}")
        with conn, contextlib.suppress(OSError):
            conn.settimeout(REPLY_TIMEOUT_S)
            protocol.send(conn, {"ok": False, "reason": "refused: another user's"})


def _answer(warm: Warm, channels: Channels, conn: socket.socket, request: dict[str, Any],
            fds: list[int]) -> bool:  # fmt: skip
    """One whole request answered (a launch forks a keeper). True when it
    asked the warm interpreter to stop. Whatever the request holds, a fault
    in judging it refuses it with one line here and one to the peer."""
    try:
        op = request.get("op")
        if op == "status":
            protocol.send(conn, {"ok": True, **warm.status()})
        elif op == "stop":
            protocol.send(conn, {"ok": True, "pid": os.getpid(), "running": len(warm.keepers)})
            return True
        elif op == "launch":
            return _launch(warm, channels, conn, request, fds)
        else:
            protocol.send(conn, {"ok": False, "reason": f"unknown request {op!r:.60}"})
    except OSError as error:
        say(f"a client went away: {error.strerror or error}")
    except Exception as error:  # an untrusted request: anything may be wrong
        say(f"a request of the wrong shape: {type(error).__name__}: {error!s:.200}")
        with contextlib.suppress(OSError):
            protocol.send(conn, {"ok": False, "reason": "a malformed request"})
    return False


def launch_problem(request: dict[str, Any], fds: list[int]) -> str:
    """What is wrong with a launch request's shape ("" when nothing): a
    client of this user's may still send anything."""
    env, args, interpreter = request.get("env"), request.get("args"), request.get("interpreter")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "env must map names to strings"
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "args must be a list of strings"
    if not isinstance(request.get("cwd"), str):
        return "cwd is missing"
    if not (isinstance(interpreter, dict) and isinstance(interpreter.get("python"), str)
            and isinstance(interpreter.get("version"), str)
            and isinstance(interpreter.get("sys_path"), list)
            and all(isinstance(p, str) for p in interpreter["sys_path"])):  # fmt: skip
        return "interpreter must hold python, version and sys_path"
    if len(fds) < 3:
        return "the standard streams are missing"
    return ""


def _launch(warm: Warm, channels: Channels, conn: socket.socket, request: dict[str, Any],
            fds: list[int]) -> bool:  # fmt: skip
    """Hands a launch that matches to the spare keeper, which runs it, with
    what the kernel says of the caller (pyinit.run.warm.caller). True when
    forking is no longer safe: no more launches."""
    why = launch_problem(request, fds)
    if why:
        protocol.send(conn, {"ok": False, "reason": f"a malformed launch: {why}"})
        return False
    try:
        peer = caller.read(protocol.peer_pid(conn), request["interpreter"], request["env"])
    except caller.Unknown as unknown:
        protocol.send(conn, {"ok": False, "reason": str(unknown)})
        return False
    why = warm.difference(request, peer)
    if why:
        protocol.send(conn, {"ok": False, "reason": why})
        return False
    if warm.spare is None and warm.importing is not None and _take_step(warm, channels):
        protocol.send(conn, {"ok": False, "reason": "the warm interpreter may no longer fork"})
        return True
    spare = warm.spare or fork_spare(warm, channels)
    warm.spare = None
    protocol.send(spare.channel, {**request, **peer.settings()}, [conn.fileno(), *fds])
    spare.channel.close()
    warm.launches += 1
    warm.keepers.add(spare.pid)
    return False


def fork_spare(warm: Warm, channels: Channels) -> Spare:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            channels.close_in_fork()
            ours.close()
            if warm.cpu_probe is not None:  # the launch's processes get no copy of it
                os.close(warm.cpu_probe.verdicts_fd)
            code = keep(theirs, server, warm.set_by_import, warm.imported)
        finally:
            os._exit(code)
    theirs.close()
    return Spare(pid, ours)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyinit.run.warm.server")
    parser.add_argument("--preload", default="")
    parser.add_argument("--idle-timeout", type=float, default=protocol.DEFAULT_IDLE_TIMEOUT_S)
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument("--detach", action="store_true")
    parser.add_argument("--defer-compile-preloads", action="store_true")
    parser.add_argument("--compile-preloads-once-compiled", action="store_true")
    args = parser.parse_args(argv)
    if args.detach and os.fork() > 0:
        # The starter reaps this parent at once; the server is then nobody's child
        # but init's (or the nearest subreaper's above the starter), so a run that
        # started it and ends its own children at exit leaves it running.
        os._exit(0)
    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd >= 0 else None

    def tell(line: str) -> None:
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.write(line + "\n")
                ready.flush()

    set_agent_defaults()  # it imports as an agent: torch's CUDA check asks NVML
    warm = Warm(parse(args.preload), args.idle_timeout, args.defer_compile_preloads,
                args.compile_preloads_once_compiled)  # fmt: skip
    try:
        path = protocol.checked_folder(protocol.folder(), create=True) / protocol.SOCKET_NAME
        listener = bind(path)
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        tell(f"error {where}{error.strerror or error}")
        return 1
    except ValueError as error:
        tell(f"error {error}")
        return 2
    tell("bound")
    try:
        # Bound first: a run that comes while these import waits for them.
        began = time.monotonic()
        try:
            warm.load()
        except PreloadError as error:
            tell(f"error {error}")
            return 1
        unsafe = fork_unsafe()
        if unsafe:
            tell(f"error --preload {','.join(warm.preloads)}: {unsafe}")
            return 1
        took = time.monotonic() - began
        say(f"ready: pid {os.getpid()}, preloads {','.join(warm.preloads)}, {took:.2f} s")
        tell(f"ready {os.getpid()} {took:.3f}")
        if ready is not None:
            with contextlib.suppress(OSError):  # a starter that did not wait for this
                ready.close()
            ready = None
        serve(warm, listener, path)
    finally:
        _unlink_if_ours(path, listener)
        listener.close()
        bytecode.end(warm.filler)
        if warm.cpu_probe is not None:
            cpu_probe.stop(warm.cpu_probe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
