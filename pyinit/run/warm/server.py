"""The warm interpreter: binds the user's socket, imports torch and the
preloads, then forks a keeper for every launch it is handed::

    python -P -m pyinit.run.warm.server [--preload MOD,...] [--idle-timeout S] [--ready-fd N]

Three processes per launch, each with one job (the keeper and its agent
forked ahead, a spare pair waiting for the next launch):

- the warm interpreter accepts, checks the peer's uid before reading
  anything, compares the launch with itself, and forks;
- the keeper (one per launch, a subreaper) forks the agent with the caller's
  descriptors, environment, folder, umask, limits and affinity, relays the
  caller's signals to it and its exit status back, and KILLs everything the
  launch left when the caller goes away (even by kill -9: its socket closes)
  or the warm interpreter dies;
- the agent runs ``pyinit.run.agent.main``, as ``python -m pyinit.run.agent``
  would, with the imports done.

Its own lines go to ``warm.log`` beside the socket.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pyinit import _native
from pyinit.run.events import boottime, process_start
from pyinit.run.preload import DEFAULT_PRELOADS, PreloadError, fork_unsafe, import_all, parse
from pyinit.run.warm import protocol

# What the warm interpreter and each keeper wait for besides their sockets.
WAITED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
READ_TIMEOUT_S = 10.0  # a peer of the same user that connects and says nothing


def say(line: str) -> None:
    print(f"pyinit warm: {line}", file=sys.stderr, flush=True)


class Warm:
    """The warm interpreter's state: what it imported, from which files,
    how it compares, what it has served."""

    def __init__(self, preloads: tuple[str, ...], idle_timeout: float):
        self.preloads = tuple(dict.fromkeys((*DEFAULT_PRELOADS, *preloads)))
        self.idle_timeout = idle_timeout
        self.started = time.time()
        self.launches = 0
        self.keepers: set[int] = set()  # launches running
        self.spare: Spare | None = None
        self.start_env = dict(os.environ)
        self.identity = protocol.Identity.here(self.start_env, protocol.agent_sys_path())
        self.set_by_import: dict[str, str] = {}
        self.read_at_import: frozenset[str] = frozenset()
        self.files: dict[str, tuple[int, int, int]] = {}
        self.imported = (process_start(), 0.0)  # CLOCK_BOOTTIME: the start, and ready

    def load(self) -> None:
        """The preloads, the agent's own imports, and a record of each file."""
        with protocol.recording_environ_reads() as seen:
            import_all(self.preloads)
            import_all(("torch.distributed.run", "pyinit.run.agent", "pyinit.run.store",
                        "pyinit.run.wrapper"))  # fmt: skip
        self.read_at_import = frozenset(seen)
        # As they were before the imports, which set some (torch sets
        # TORCHINDUCTOR_CACHE_DIR): what a fresh start would have met.
        self.identity.import_env = {k: v for k, v in self.start_env.items()
                                    if protocol.import_time(k) or k in seen}  # fmt: skip
        self.set_by_import = {k: v for k, v in os.environ.items() if self.start_env.get(k) != v}
        self.imported = (self.imported[0], boottime())
        self.files = loaded_files()

    def difference(self, request: dict[str, Any]) -> str:
        """Why this launch cannot be served here ("" when it can)."""
        missing = [m for m in request.get("preloads", []) if m not in self.preloads]
        if missing:
            return f"the warm interpreter has not preloaded {', '.join(missing)}"
        why = self.identity.difference(request.get("identity", {}), request.get("env", {}),
                                       self.read_at_import)  # fmt: skip
        if why:
            return why
        for name, (_soft, hard) in request.get("limits", {}).items():
            _, mine = resource.getrlimit(getattr(resource, name))
            if mine != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > mine):
                return f"{name}'s hard limit is lower in the warm interpreter ({mine} < {hard})"
        return changed_file(self.files)

    def status(self) -> dict[str, Any]:
        memory = _memory(os.getpid())
        return {"pid": os.getpid(), "python": sys.executable, "preloads": list(self.preloads),
                "age_s": round(time.time() - self.started, 1), "launches": self.launches,
                "running": len(self.keepers), "idle_timeout_s": self.idle_timeout,
                **memory}  # fmt: skip


def loaded_files() -> dict[str, tuple[int, int, int]]:
    """Every loaded module's file, as it is on disk now (mtime, size, inode)."""
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in found:
            with contextlib.suppress(OSError):
                info = os.stat(path)
                found[path] = (info.st_mtime_ns, info.st_size, info.st_ino)
    return found


def changed_file(files: dict[str, tuple[int, int, int]]) -> str:
    """The first loaded module file changed on disk since it was imported."""
    for path, was in files.items():
        try:
            info = os.stat(path)
        except OSError:
            return f"{path} is gone since the warm interpreter imported it"
        if (info.st_mtime_ns, info.st_size, info.st_ino) != was:
            return f"{path} changed since the warm interpreter imported it"
    return ""


def _memory(pid: int) -> dict[str, int]:
    """Resident and proportional set sizes (the workers' shared pages count
    once in PSS, split among those that share them)."""
    found = {}
    for name, key in (("status", "VmRSS"), ("smaps_rollup", "Pss")):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key + ":"):
                    found[f"{key.lower().removeprefix('vm')}_bytes"] = int(line.split()[1]) * 1024
    return found


def bind(path: Path) -> socket.socket:
    """The listening socket at `path`; OSError EADDRINUSE when a warm
    interpreter answers there already (a dead one's socket is replaced)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(str(path))
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            listener.close()
            raise
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


def serve(warm: Warm, listener: socket.socket, path: Path) -> None:
    """Accepts until stopped or idle for the idle timeout."""
    wakeup = protocol.Wakeup(WAITED)
    warm.spare = fork_spare(warm, listener, wakeup)
    last = time.monotonic()
    stopping = False
    while True:
        timeout = None
        if warm.idle_timeout > 0 and not warm.keepers and not stopping:
            timeout = max(0.0, last + warm.idle_timeout - time.monotonic())
            if timeout == 0:
                say(f"idle for {warm.idle_timeout:g} s (--idle-timeout): ending")
                return
        sockets = [wakeup.read_fd] if stopping else [listener, wakeup.read_fd]
        ready, _, _ = select.select(sockets, [], [], timeout)
        for sig in wakeup.signals():
            if sig == signal.SIGCHLD:
                _reap(warm)
                last = time.monotonic()
            elif not stopping:
                stopping = True
                say(f"{signal.Signals(sig).name}: no more launches")
        if listener in ready and not stopping:
            stopping = _accept(warm, listener, wakeup)
            last = time.monotonic()
        if stopping:
            _unlink_if_ours(path, listener)
            listener.close()
            if warm.spare is not None:
                warm.spare.channel.close()  # it ends; reaped as it does
            if not warm.keepers:
                return
        elif warm.spare is None:
            warm.spare = fork_spare(warm, listener, wakeup)


def _unlink_if_ours(path: Path, listener: socket.socket) -> None:
    """The socket file, unless another warm interpreter has bound it since."""
    if listener.fileno() >= 0 and listener.getsockname() == str(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _reaped() -> Iterator[tuple[int, int]]:
    """Each child that has ended, reaped as it is yielded (pid, wait status)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _reap(warm: Warm) -> None:
    for pid, _ in _reaped():
        warm.keepers.discard(pid)
        if warm.spare is not None and warm.spare.pid == pid:  # it died waiting
            warm.spare.channel.close()
            warm.spare = None


def _accept(warm: Warm, listener: socket.socket, wakeup: protocol.Wakeup) -> bool:
    """One connection: refused unless it is this user's; a launch forks a
    keeper. True when it asked the warm interpreter to stop."""
    conn, _ = listener.accept()
    with conn:
        uid = protocol.peer_uid(conn)
        if uid != os.geteuid():
            # Before reading a byte: another user's process learns nothing but this.
            say(f"refused a connection from uid {uid}")
            with contextlib.suppress(OSError):
                protocol.send(conn, {"ok": False, "reason": "refused: another user's"})
            return False
        conn.settimeout(READ_TIMEOUT_S)
        try:
            request, fds = protocol.receive(conn, protocol.MAX_FDS)
        except (OSError, ValueError) as error:
            say(f"a request that could not be read: {error}")
            return False
        try:
            if request is None:
                return False
            op = request.get("op")
            if op == "status":
                protocol.send(conn, {"ok": True, **warm.status()})
            elif op == "stop":
                protocol.send(conn, {"ok": True, "pid": os.getpid(), "running": len(warm.keepers)})
                return True
            elif op == "launch":
                _launch(warm, conn, request, fds, listener, wakeup)
            else:
                protocol.send(conn, {"ok": False, "reason": f"unknown request {op!r}"})
        except OSError as error:
            say(f"a client went away: {error.strerror or error}")
        except (TypeError, ValueError, AttributeError, KeyError) as error:
            say(f"a request of the wrong shape: {type(error).__name__}: {error}")
        finally:
            for fd in fds:
                os.close(fd)
    return False


def launch_problem(request: dict[str, Any], fds: list[int]) -> str:
    """What is wrong with a launch request's shape ("" when nothing): a
    client of this user's may still send anything."""
    env, args, limits = request.get("env"), request.get("args"), request.get("limits", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "env must map names to strings"
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "args must be a list of strings"
    if not isinstance(request.get("cwd"), str) or not isinstance(request.get("umask"), int):
        return "cwd and umask are missing"
    if not isinstance(limits, dict) or not all(
            hasattr(resource, name) and isinstance(v, list) and len(v) == 2
            for name, v in limits.items()):  # fmt: skip
        return "limits must map RLIMIT_ names to [soft, hard]"
    if len(fds) < 3 or not isinstance(request.get("identity"), dict):
        return "the standard streams and the identity are missing"
    return ""


def _launch(warm: Warm, conn: socket.socket, request: dict[str, Any], fds: list[int],
            listener: socket.socket, wakeup: protocol.Wakeup) -> None:  # fmt: skip
    """Hands a launch that matches to the spare keeper, which runs it."""
    why = launch_problem(request, fds)
    if why:
        protocol.send(conn, {"ok": False, "reason": f"a malformed launch: {why}"})
        return
    why = warm.difference(request)
    if why:
        protocol.send(conn, {"ok": False, "reason": why})
        return
    spare = warm.spare or fork_spare(warm, listener, wakeup)
    warm.spare = None
    protocol.send(spare.channel, request, [conn.fileno(), *fds])
    spare.channel.close()
    warm.launches += 1
    warm.keepers.add(spare.pid)


@dataclass
class Spare:
    """A keeper and its agent, forked ahead of the next launch and waiting
    for it: a launch pays for neither fork (each copies the page tables of
    everything imported)."""

    pid: int
    channel: socket.socket  # the warm interpreter's end; closed: the spare ends


def fork_spare(warm: Warm, listener: socket.socket, wakeup: protocol.Wakeup) -> Spare:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            listener.close()
            wakeup.close()
            ours.close()
            code = keep(theirs, server, warm.set_by_import, warm.imported)
        finally:
            os._exit(code)
    theirs.close()
    return Spare(pid, ours)


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
    protocol.send(to_agent, request, fds[1:])
    for fd in fds[1:]:
        os.close(fd)
    to_agent.close()
    protocol.send(conn, {"ok": True, "pid": agent, "forked_at": forked_at, "warm_pid": server,
                         "imported": list(imported)})  # fmt: skip
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
            if "signal" in message:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent, int(message["signal"]))
            elif message.get("kill"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent, signal.SIGKILL)


def _agent_status(agent: int) -> int | None:
    """The agent's exit status once it has ended (a shell's: 128+N for
    signal N); other children (orphans re-parented here) are reaped."""
    for pid, status in _reaped():
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
            _exit(0)
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
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        for name, (soft, hard) in request.get("limits", {}).items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if request.get("affinity"):
            os.sched_setaffinity(0, request["affinity"])
        _reopen_stdio()
        from pyinit.run import agent

        sys.argv = [agent.__file__, *request["args"]]
        code = _run(lambda: agent.main(list(request["args"]), started=started))
    except BaseException:  # the caller must get a status, whatever this was
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
    finally:
        _exit(code)


def _run(main: Any) -> int:
    """main() with the exit status Python's own start gives it."""
    try:
        main()
    except SystemExit as done:
        if done.code is None:
            return 0
        if isinstance(done.code, int):
            return done.code
        print(done.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # As the interpreter does: end by SIGINT itself, for the shell's 130.
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit(code: int) -> NoReturn:
    """The interpreter's own end (atexit, flushed streams) without unwinding
    into the warm interpreter's frames."""
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush()
    os._exit(code)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyinit.run.warm.server")
    parser.add_argument("--preload", default="")
    parser.add_argument("--idle-timeout", type=float, default=protocol.DEFAULT_IDLE_TIMEOUT_S)
    parser.add_argument("--ready-fd", type=int, default=-1)
    args = parser.parse_args(argv)
    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd >= 0 else None

    def tell(line: str) -> None:
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.write(line + "\n")
                ready.flush()

    # The agent's own switch (see pyinit.run.agent): torch's CUDA check asks NVML.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    warm = Warm(parse(args.preload), args.idle_timeout)
    try:
        path = protocol.checked_folder(protocol.folder(), create=True) / protocol.SOCKET_NAME
        listener = bind(path)
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        tell(f"error {where}{error.strerror or error}")
        return 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
