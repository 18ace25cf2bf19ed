"""What both sides of a warm launch share: where the socket is, how a
message travels, and what a launch must share with the warm interpreter
(:class:`Identity`) for the fork to be what a fresh start would have been,
and how each side's select loop hears its signals (:class:`Wakeup`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyinit import private_folder
from pyinit.errors import InputError

FOLDER_ENV = "PYINIT_WARM_DIR"  # another folder than the user's default
SOCKET_NAME = "warm.sock"
LOG_NAME = "warm.log"
# Left once pyinit run has said that it leaves warm interpreters behind unasked.
NOTED_NAME = "noted"
MAX_MESSAGE = 16 << 20  # an environment and argv fit many times over
HEADER = struct.Struct("<I")
MAX_FDS = 8
# The warm interpreter's first message on a connection it will read: it has
# accepted it, so its imports are done. A request's descriptors are sent after
# it: in a queued connection they would hold the caller's pipes open.
GREETING = {"serving": True}
DEFAULT_IDLE_TIMEOUT_S = 1800.0
# The signals pyinit run forwards to its agent, warm or cold.
FORWARDED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                       signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH})  # fmt: skip

# Read by libraries as they load (C code's getenv: the OpenMP and BLAS runtimes,
# the dynamic loader) or by the interpreter as it starts: the warm interpreter's
# values are baked in. Whatever Python code looks up while the warm interpreter
# imports is recorded there too (Identity.import_env), torch's configuration
# modules (TORCHDYNAMO_*, TORCHINDUCTOR_*, TORCH_LOGS, PYTORCH_JIT...) among it.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "LD_", "LC_",
                        "TORCHDYNAMO_", "TORCHINDUCTOR_", "TORCH_COMPILE")  # fmt: skip
IMPORT_TIME_NAMES = frozenset({"LANG", "LANGUAGE", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL",
                               "TORCH_SHOW_CPP_STACKTRACES", "PYTORCH_JIT"})  # fmt: skip
# Set by pyinit run for every launch, or by the shell for every command (a
# module may look PWD up as it loads, TERM for colours): never compared.
PER_LAUNCH_PREFIXES = ("PYINIT_",)
PER_COMMAND_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "TERM"})
# Where bytecode is read from, never what a module does (Python checks it
# against its source): pyinit sets it once its cache is ready (pyinit.bytecode),
# which may be after the warm interpreter started.
WHERE_ONLY_NAMES = frozenset({"PYTHONPYCACHEPREFIX"})
UNCOMPARED_NAMES = PER_COMMAND_NAMES | WHERE_ONLY_NAMES


def import_time(name: str) -> bool:
    return name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)


def folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's folder for the socket: PYINIT_WARM_DIR, else
    $XDG_RUNTIME_DIR/pyinit (systemd's per-user tmpfs), else /tmp/pyinit-UID.
    InputError for a relative PYINIT_WARM_DIR: each command would take it
    from the folder it runs in, and a warm interpreter started in one would
    be invisible from another."""
    if environ.get(FOLDER_ENV):
        chosen = environ[FOLDER_ENV]
        if not os.path.isabs(chosen):
            raise InputError(f"{FOLDER_ENV}={chosen!r} is not an absolute path (a folder "
                             "for every command, wherever it runs)")  # fmt: skip
        return Path(chosen)
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime, "pyinit")
    return Path(f"/tmp/pyinit-{os.geteuid()}")


def checked_folder(path: Path, create: bool) -> Path | None:
    """`path` when it is this user's private folder, None when missing;
    PermissionError naming it otherwise (see pyinit.private_folder)."""
    return private_folder.checked(path, create, "the warm interpreter's folder")


def socket_error(error: OSError, operation: str, path: Path) -> OSError:
    """`error` from binding or connecting at `path`, naming it (Python's own
    check of an AF_UNIX path's length gives no errno: ENAMETOOLONG then)."""
    number = error.errno or errno.ENAMETOOLONG
    return OSError(number, f"{operation}: {error.strerror or error}", str(path))


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """One message: its length, then JSON; descriptors travel with the first bytes."""
    data = json.dumps(message).encode()
    packet = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [packet], list(fds))
        if sent < len(packet):  # an empty sendall still writes: EPIPE once the peer is done
            sock.sendall(packet[sent:])
    else:
        sock.sendall(packet)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors that came with it; (None, [])
    when the other side has closed. ValueError for what is not a message."""
    head, fds = bytearray(), []
    while len(head) < HEADER.size:
        if max_fds and not head:
            chunk, got, _flags, _addr = socket.recv_fds(sock, HEADER.size, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(HEADER.size - len(head))
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        head += chunk
    length = body_length(head)
    body = bytearray()
    while len(body) < length:
        chunk = sock.recv(min(length - len(body), 1 << 20))
        if not chunk:
            raise ValueError("the message was cut short")
        body += chunk
    return decode(body), fds


def body_length(head: bytes | bytearray) -> int:
    """The length a message's header (its first HEADER.size bytes) announces;
    ValueError past MAX_MESSAGE."""
    (length,) = HEADER.unpack_from(head)
    if length > MAX_MESSAGE:
        raise ValueError(f"a message of {length} bytes (at most {MAX_MESSAGE})")
    return length


def decode(body: bytes | bytearray) -> dict[str, Any]:
    """A message's JSON object; ValueError for anything else, however it is
    malformed (nesting deep enough to exhaust the interpreter's stack too)."""
    try:
        message = json.loads(body)
    except RecursionError:
        raise ValueError("malformed JSON: nested too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def peer_uid(sock: socket.socket) -> int:
    """The connected process's uid, from the kernel (SO_PEERCRED)."""
    return _peer_credentials(sock)[1]


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end (for a connection not yet
    accepted, the one listening); 0 when it is in a pid namespace this
    process cannot see."""
    return _peer_credentials(sock)[0]


def _peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """pid, uid and gid of the peer, from the kernel (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


NAMESPACES = ("mnt", "net", "pid", "ipc", "uts", "user", "cgroup")
# What else of the process must be the same, and how a difference is named.
SHARED = {"uid": "user", "gid": "group", "groups": "set of supplementary groups",
          "root": "root folder (chroot)", "cgroup": "cgroup", "namespaces": "namespace",
          "privileges": "set of capabilities, no_new_privs or seccomp",
          "security": "security context (AppArmor, SELinux)"}  # fmt: skip
STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
                 "Seccomp_filters")  # fmt: skip


class Wakeup:
    """Signals as bytes on a pipe, for a select loop (no threads): each of
    `signals` is caught and unblocked in this thread until ``close``, which
    puts the handlers, the wakeup fd and the signal mask back."""

    def __init__(self, signals: Sequence[int]):
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
        self._fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self._mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)

    def signals(self) -> list[int]:
        """The signals of ours that came since the last call, in order."""
        try:
            return [sig for sig in os.read(self.read_fd, 256) if sig in self._previous]
        except BlockingIOError:
            return []

    def close(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        signal.set_wakeup_fd(self._fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self.read_fd)
        os.close(self.write_fd)


def process_status(pid: int | str) -> dict[str, str]:
    """The fields of /proc/PID/status ("self": this process's), each value
    without the blanks around it. OSError when it cannot be read."""
    fields = (line.partition(":") for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: value.strip() for key, _, value in fields}


def interpreter_here(agent_path: Sequence[str]) -> dict[str, Any]:
    """What a launch says of the interpreter its agent would run: the binary
    itself (a venv's python and python3 are one interpreter; its sys.path,
    compared too, tells one venv from another), its version, the agent's
    sys.path."""
    return {"python": os.path.realpath(sys.executable), "version": sys.version,
            "sys_path": list(agent_path)}  # fmt: skip


@dataclass
class Identity:
    """What a launch must share with the warm interpreter: the interpreter
    its agent would run (as the launch says: interpreter_here), and who the
    process is, as the kernel tells it for its pid (never as a client says:
    a process in a sandbox, without a capability or under no_new_privs,
    could claim the warm interpreter's and have its script run outside)."""

    python: str
    version: str
    sys_path: list[str]
    uid: int
    gid: int
    groups: list[int]
    root: str
    cgroup: str
    namespaces: dict[str, str]
    privileges: dict[str, str]
    security: str
    import_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, pid: int | str, interpreter: Mapping[str, Any], environ: Mapping[str, str],
           status: Mapping[str, str] | None = None) -> Identity:  # fmt: skip
        """Process `pid`'s ("self": this one), running `interpreter` with
        `environ`; `status` its process_status where it was read already.
        OSError when that cannot be read; a link or file of it that cannot
        be read counts as empty, which no process that can read its own
        has."""
        proc = f"/proc/{pid}"
        status = process_status(pid) if status is None else status
        return cls(
            python=interpreter["python"], version=interpreter["version"],
            sys_path=list(interpreter["sys_path"]),
            # Effective ids, as access checks use them: real, effective, saved, fs.
            uid=int(status["Uid"].split()[1]), gid=int(status["Gid"].split()[1]),
            groups=sorted(int(g) for g in status.get("Groups", "").split()),
            root=_link(f"{proc}/root"), cgroup=_read(f"{proc}/cgroup"),
            namespaces={ns: _link(f"{proc}/ns/{ns}") for ns in NAMESPACES},
            privileges={k: status[k] for k in STATUS_FIELDS if k in status},
            security=_read(f"{proc}/attr/current"),
            import_env={k: v for k, v in environ.items() if import_time(k)},
        )  # fmt: skip

    @classmethod
    def here(cls, environ: Mapping[str, str], agent_path: Sequence[str]) -> Identity:
        return cls.of("self", interpreter_here(agent_path), environ)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def difference(self, launch: Identity, environ: Mapping[str, str],
                   read_at_import: frozenset[str]) -> str:  # fmt: skip
        """Why a launch with `launch` and the caller's full `environ` cannot
        use this warm interpreter; "" when it can."""
        if launch.python != self.python or launch.version != self.version:
            return f"another interpreter ({launch.python}, this one is {self.python})"
        if launch.sys_path != self.sys_path:
            return f"another sys.path ({_first_difference(launch.sys_path, self.sys_path)})"
        why = self.process_difference(launch)
        if why:
            return why
        names = set(self.import_env) | {k for k in environ if import_time(k)} | read_at_import
        for name in sorted(names):
            if name.startswith(PER_LAUNCH_PREFIXES) or name in UNCOMPARED_NAMES:
                continue
            mine, theirs = self.import_env.get(name), environ.get(name)
            if mine != theirs:
                shown = "unset" if theirs is None else f"{name}={theirs!r:.60}"
                was = "unset" if mine is None else f"{mine!r:.60}"
                return f"{name} differs ({shown} here, {was} in the warm interpreter)"
        return ""

    def process_difference(self, other: Identity) -> str:
        """How `other` is not the same process as this one, as the kernel
        tells it (user, root folder, cgroup, namespaces, privileges); ""
        where it is the same."""
        for key, what in SHARED.items():
            if getattr(other, key) != getattr(self, key):
                if key == "namespaces":
                    what = next(f"{n} namespace" for n in NAMESPACES
                                if other.namespaces[n] != self.namespaces[n])  # fmt: skip
                return f"another {what} here than the warm interpreter's"
        return ""


def _first_difference(theirs: Any, mine: Sequence[str]) -> str:
    theirs = list(theirs or [])
    for a, b in zip(theirs, mine, strict=False):
        if a != b:
            return f"{a} here, {b} in the warm interpreter"
    return f"{len(theirs)} entries here, {len(mine)} in the warm interpreter"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def agent_sys_path() -> list[str]:
    """The sys.path an agent started from here would have: this one, less
    the script's or working folder its own start put first (-P keeps it off)."""
    return list(sys.path) if sys.flags.safe_path else list(sys.path[1:])


# The mapping methods that look one name up (os.environ.get, `in`), unlike
# its views, whose walks look every name up.
ASKING = frozenset({"get", "__contains__", "setdefault", "pop"})


@contextlib.contextmanager
def recording_environ_reads() -> Iterator[set[str]]:
    """The names Python code looks up in os.environ or os.environb inside the
    block (not those it meets walking the whole mapping, as tqdm does for its
    prefix), as text: os.get_exec_path, which every subprocess start calls,
    asks os.environ for b"PATH" too."""
    seen: set[str] = set()
    environ_type = type(os.environ)
    lookup = environ_type.__getitem__

    def recorded(self: Any, key: Any) -> Any:
        caller = sys._getframe(1).f_code
        asked = "_collections_abc" not in caller.co_filename or caller.co_name in ASKING
        if asked and isinstance(key, (str, bytes)):
            seen.add(os.fsdecode(key))
        return lookup(self, key)

    environ_type.__getitem__ = recorded  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        environ_type.__getitem__ = lookup  # type: ignore[method-assign]
