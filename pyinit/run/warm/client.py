"""The caller's side: ``pyinit run`` handing its agent to a warm
interpreter and relaying signals and the exit status, and ``pyinit warm``
starting, asking and stopping one. The standard library only: this is on
every launch's path."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinit.run.warm import protocol

# A warm interpreter still importing (one a run that came first started, or one
# starting beside a slow boot) answers once its imports end, however long they
# take: a request waits as long as it works, and gives up when it has used no
# CPU for STALL_S (stuck), or at once when it has ended.
STALL_S = 60.0
POLL_S = 0.2  # also how soon a signal that ends the launch ends the wait
REST_S = 30.0  # for the rest of a message once its first bytes came, and to send one
ESCALATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class WarmEnded(Exception):
    """The warm interpreter went away during the run: one line saying so."""


class Interrupted(Exception):
    """A signal that ends the launch came while it waited for the warm
    interpreter (still importing): nothing was started."""

    def __init__(self, sig: int):
        super().__init__(signal.Signals(sig).name)
        self.signal = sig


@dataclass
class WarmLaunch:
    sock: socket.socket
    agent_pid: int
    warm_pid: int
    forked_at: float  # CLOCK_BOOTTIME of the agent's fork
    imported: tuple[float, float]  # the warm interpreter's start and its imports' end


def socket_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The user's warm socket when its folder exists (PermissionError when
    the folder is refused, see protocol.checked_folder)."""
    folder = protocol.checked_folder(protocol.folder(environ), create=False)
    return None if folder is None else folder / protocol.SOCKET_NAME


def connect(environ: Mapping[str, str] = os.environ) -> socket.socket | None:
    """A connection to the user's warm interpreter; None when none runs.
    OSError naming the socket when it cannot be used (too long a path for
    AF_UNIX, not a socket, not ours to enter); InputError for a relative
    PYINIT_WARM_DIR."""
    path = socket_path(environ)
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as error:
        sock.close()
        raise protocol.socket_error(error, "connect", path) from None
    return sock


def request(op: str, environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """A status or stop answer; None when no warm interpreter runs."""
    sock = connect(environ)
    if sock is None:
        return None
    with sock:
        try:
            return exchange(sock, {"op": op})
        except (ConnectionResetError, BrokenPipeError):
            return None  # it closed its socket while stopping


def exchange(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = (),
             stop_waiting: Callable[[], int] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """`message` (with `fds`) sent to the warm interpreter at the other end
    of `sock` once it greets this connection, and its answer; None when it
    closed the connection (its refusal when it refused it unread).
    TimeoutError when it stalled (STALL_S); Interrupted when `stop_waiting`
    names a signal while it waits; OSError and ValueError as the socket and
    protocol.receive raise them."""
    peer = _Peer(sock, stop_waiting)
    peer.wait()
    sock.settimeout(REST_S)
    greeting, _ = protocol.receive(sock)
    if greeting != protocol.GREETING:
        return greeting
    protocol.send(sock, message, fds)
    peer.wait()
    answer, _ = protocol.receive(sock)
    return answer


class _Peer:
    """The warm interpreter at the other end of a connection (while its
    imports run, the connection waits in its listening socket's queue),
    watched for progress by its CPU time."""

    def __init__(self, sock: socket.socket, stop_waiting: Callable[[], int] | None):
        self.sock = sock
        self.stop_waiting = stop_waiting
        self.pid = protocol.peer_pid(sock)
        self.cpu = _cpu_ticks(self.pid)
        self.since = time.monotonic()

    def wait(self) -> None:
        """Returns once the peer has said something, or closed; TimeoutError
        when it made no progress for STALL_S; Interrupted as `stop_waiting`
        says."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while not poller.poll(POLL_S * 1000):
            sig = self.stop_waiting() if self.stop_waiting else 0
            if sig:
                raise Interrupted(sig)
            cpu, now = _cpu_ticks(self.pid), time.monotonic()
            if cpu is not None and cpu != self.cpu:
                self.cpu, self.since = cpu, now
            elif now - self.since >= STALL_S:
                whom = f"pid {self.pid}" if self.pid else "its process"
                raise TimeoutError(errno.ETIMEDOUT, f"{whom} did not answer and used no CPU "
                                                    f"for {STALL_S:g} s")  # fmt: skip


def _cpu_ticks(pid: int) -> int | None:
    """User and system CPU time of `pid` in clock ticks; None when it cannot
    be seen (ended, or in a pid namespace hidden from this one)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


def listener_difference(sock: socket.socket) -> str:
    """Why the process that listens at the other end of `sock` is not to be
    handed a launch ("" when it may): it is not who this process is, as the
    kernel tells it. The folder is this user's, but a process of this
    user's in a sandbox (another namespace, fewer privileges) may have bound
    the socket first, and would be sent this run's environment and
    terminal; a real warm interpreter there would refuse the launch anyway."""
    pid = protocol.peer_pid(sock)
    if pid <= 0:
        return "the warm interpreter runs in a PID namespace this process cannot see"
    interpreter = protocol.interpreter_here(())
    try:
        theirs = protocol.Identity.of(pid, interpreter, {})
        mine = protocol.Identity.of("self", interpreter, {})
    except (OSError, KeyError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        return f"the warm interpreter (pid {pid}) cannot be read ({reason})"
    return mine.process_difference(theirs)


def hand_over(args: Sequence[str], env: Mapping[str, str], preloads: Sequence[str],
              store_fd: int | None, store_env: str,
              stop_waiting: Callable[[], int]) -> WarmLaunch | str | None:  # fmt: skip
    """The agent (`args` as pyinit.run.agent takes them) started by the warm
    interpreter with this process's standard streams, folder, umask, limits,
    affinity, scheduling and `env`; the reason in one line when it would not
    serve this launch; None when no warm interpreter runs. Interrupted when
    `stop_waiting` names a signal before the agent was started."""
    try:
        sock = connect(env)
    except OSError as error:
        return f"{error.filename}: {error.strerror}"
    except ValueError as error:
        return str(error)
    if sock is None:
        return None
    why = listener_difference(sock)
    if why:
        sock.close()
        return why
    stdio = [fd for fd in (0, 1, 2) if _is_open(fd)]
    if len(stdio) < 3:
        sock.close()
        return "a standard stream is closed here"
    # Who this process is, its limits, umask, affinity and scheduling: the warm
    # interpreter asks the kernel (pyinit.run.warm.caller).
    launch = {
        "op": "launch", "args": list(args), "env": dict(env), "cwd": os.getcwd(),
        "preloads": list(preloads),
        "interpreter": protocol.interpreter_here(protocol.agent_sys_path()),
        "store_env": store_env,
    }  # fmt: skip
    fds = stdio + ([store_fd] if store_fd is not None else [])
    try:
        answer = exchange(sock, launch, fds, stop_waiting)
    except Interrupted:
        sock.close()  # found closed: no greeting is answered, no agent is handed the launch
        raise
    except (OSError, ValueError) as error:
        sock.close()
        said = error.strerror if isinstance(error, OSError) and error.strerror else error
        return f"the warm interpreter did not answer ({said})"
    if answer is None:
        sock.close()
        return "the warm interpreter closed the connection"
    if not answer.get("ok"):
        sock.close()
        return str(answer.get("reason", "refused"))
    sock.settimeout(None)
    start, end = answer["imported"]
    return WarmLaunch(sock, int(answer["pid"]), int(answer["warm_pid"]),
                      float(answer["forked_at"]), (float(start), float(end)))  # fmt: skip


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def relay(launch: WarmLaunch, signals: Sequence[int], on_signal: Callable[[int], None],
          on_tick: Callable[[], None], tick_s: float, grace_s: float) -> int:  # fmt: skip
    """Until the agent ends: each of `signals` this process receives goes to
    it (TERM, INT and HUP then have `grace_s` before the launch is KILLed),
    `on_tick` runs every `tick_s`. The agent's exit status (128+N for signal
    N). WarmEnded when the warm interpreter went away first. The other
    threads of this process must have `signals` blocked."""
    wakeup = protocol.Wakeup(signals)
    kill_at = 0.0
    try:
        while True:
            ready, _, _ = select.select([launch.sock, wakeup.read_fd], [], [], tick_s)
            for sig in wakeup.signals():
                on_signal(sig)
                with contextlib.suppress(OSError):
                    protocol.send(launch.sock, {"signal": sig})
                if sig in ESCALATING and not kill_at:
                    kill_at = time.monotonic() + grace_s
            if launch.sock in ready:
                try:
                    answer, _ = protocol.receive(launch.sock)
                except (OSError, ValueError):
                    answer = None
                if answer is None or "exit" not in answer:
                    why = (answer or {}).get("ended") or (
                        f"the warm interpreter's keeper of this run went away "
                        f"(warm interpreter pid {launch.warm_pid})")  # fmt: skip
                    raise WarmEnded(why)
                return int(answer["exit"])
            if kill_at and time.monotonic() >= kill_at:
                with contextlib.suppress(OSError):
                    protocol.send(launch.sock, {"kill": True})
                kill_at = float("inf")
            on_tick()
    finally:
        wakeup.close()
        launch.sock.close()


def start(preloads: Sequence[str], idle_timeout: float, wait_ready: bool,
          environ: Mapping[str, str] = os.environ,
          defer_compile: bool = False,
          until_compiled: bool = False) -> tuple[int, str]:  # fmt: skip
    """Starts a warm interpreter in a session of its own, with this
    environment, not as a child of this process (it detaches), and waits
    until its socket is bound (a launch then waits for its imports rather
    than starting cold). With `wait_ready`, until it has imported too:
    (0, "ready PID SECONDS"), or (1, its one-line error). With
    `defer_compile`, what only compiled scripts need is imported after the
    first launch is served (PID 1's); with `until_compiled`, only once a
    worker forked from it has compiled (a run starting one for itself)."""
    folder = protocol.checked_folder(protocol.folder(environ), create=True)
    assert folder is not None
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-P", "-m", "pyinit.run.warm.server",
               "--preload", ",".join(preloads), "--idle-timeout", str(idle_timeout),
               "--ready-fd", str(write_fd), "--detach",
               *(["--defer-compile-preloads"] if defer_compile else []),
               *(["--compile-preloads-once-compiled"] if until_compiled else [])]  # fmt: skip
    with open(folder / protocol.LOG_NAME, "ab") as log:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, pass_fds=(write_fd,),
                         env=dict(environ)).wait()  # fmt: skip
    os.close(write_fd)
    with os.fdopen(read_fd) as ready:
        said = ready.readline().strip()
        if said == "bound" and wait_ready:
            said = ready.readline().strip()
    if said == "bound" or said.startswith("ready"):
        return 0, said
    return 1, said.removeprefix("error ") or "the warm interpreter ended before it was ready"
