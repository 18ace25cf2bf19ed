"""``pyinit run``: check the node, configure NCCL, start torchrun with the
right node rank and master, forward signals, report how it ended.

    pyinit run --hostfile hosts -- train.py --steps 1000

The nodes come from, in order: ``--hostfile`` (IP addresses, node 0 is the
master; this node found by its own addresses), SLURM (``SLURM_JOB_NODELIST``,
``SLURM_NODEID``, ``SLURM_NNODES``), ``MASTER_ADDR`` with ``NODE_RANK`` and
``NNODES`` (or ``WORLD_SIZE``), else this node alone. torchrun runs with a
static rendezvous at the master; its workers run the script through
``pyinit.run.worker``, which records the script's own exit status. The
supervision (signals forwarded, children reaped, KILL after a grace) is the
C++ core's, the same loop `pod-init -- CMD` runs.
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from pyinit import _native
from pyinit.errors import EXIT_FAILURE, EXIT_STALLED, InputError
from pyinit.extras import require
from pyinit.jsonfile import parse_json
from pyinit.run.events import RUN_DIR_ENV, EventLog, boottime, process_start
from pyinit.run.preflight import PREFLIGHT_MODES, preflight
from pyinit.run.stall import StallWatch, flight_recorder_env
from pyinit.run.steps import FOLDER as STEPS_FOLDER

# What the core's supervisor takes: the signals it forwards, and SIGCHLD.
SUPERVISED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGQUIT, signal.SIGWINCH, signal.SIGCHLD}  # fmt: skip
# torchrun gives its workers 30 s after a TERM before it KILLs them; wait past that.
TORCHRUN_GRACE_S = 30.0
# pod-init, between pyinit run and torchrun, KILLs after this; pyinit run a little later.
GUARD_GRACE_S = TORCHRUN_GRACE_S + 10.0
ESCALATE_AFTER_S = GUARD_GRACE_S + 5.0
LIVENESS_LINGER_S = 3.0
PEER_POLL_S = 1.0  # how often a watched run asks the other nodes for a stall
# Workers per node: far above any GPU count, and a bound on what torchrun is asked to fork.
MAX_NPROC = 1024


@dataclass(frozen=True)
class Nodes:
    count: int
    rank: int
    master: str
    source: str  # hostfile, slurm, environment, single
    addresses: tuple[str, ...] = ()  # every node's address, when known
    interface: str = ""  # the one holding this node's address (hostfile only)
    # The hostfile's node list as the core loaded it, handed to the NCCL builder as it is.
    native: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "native"}


def find_nodes(hostfile: str | None, env: Mapping[str, str]) -> Nodes:
    if hostfile:
        from pyinit.nccl import load_nodes

        native = load_nodes(hostfile)  # read and resolved once for the whole run
        addresses = tuple(native.addresses)
        return Nodes(len(addresses), native.node_rank, addresses[0], "hostfile", addresses,
                     native.interface, native)  # fmt: skip
    if "SLURM_JOB_NODELIST" in env:
        try:
            names = _native.expand_nodelist(env["SLURM_JOB_NODELIST"])
        except ValueError as e:
            listed = env["SLURM_JOB_NODELIST"]
            shown = repr(listed) if len(listed) <= 64 else repr(listed[:64]) + "..."
            raise InputError(f"SLURM_JOB_NODELIST={shown}: {e}") from None
        count = _int_env(env, "SLURM_NNODES", len(names))
        rank = _int_env(env, "SLURM_NODEID", 0)
        _check_rank(rank, count, "SLURM_NODEID")
        # torchrun would retry an unresolvable master for minutes: find out now, once.
        try:
            socket.getaddrinfo(names[0], None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(
                f"SLURM_JOB_NODELIST: the master {names[0]!r} does not resolve: {reason}"
            ) from None
        return Nodes(count, rank, names[0], "slurm", tuple(names))
    if "MASTER_ADDR" in env:
        count = _int_env(env, "NNODES", _int_env(env, "WORLD_SIZE", 1))
        rank = _int_env(env, "NODE_RANK", _int_env(env, "GROUP_RANK", 0))
        _check_rank(rank, count, "NODE_RANK")
        return Nodes(count, rank, env["MASTER_ADDR"], "environment")
    return Nodes(1, 0, "127.0.0.1", "single", ("127.0.0.1",))


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    if key not in env:
        return default
    try:
        return int(env[key])
    except ValueError:
        raise InputError(f"{key}={env[key]!r} is not a whole number") from None


def _check_rank(rank: int, count: int, key: str) -> None:
    if count < 1 or not 0 <= rank < count:
        raise InputError(f"{key}={rank} does not fit {count} nodes")


@dataclass(frozen=True)
class Target:
    """What each worker runs: a script, a module (``-m``) or a program (``--no-python``)."""

    kind: str  # script, module, program
    name: str
    args: tuple[str, ...] = ()

    def check(self) -> None:
        """InputError when there is nothing to run by that name."""
        if self.kind == "script" and not Path(self.name).is_file():
            raise InputError(f"{self.name}: no such script")
        if self.kind == "module":
            top = self.name.split(".")[0]
            # Where the workers look: sys.path and the working directory (see the worker).
            search = [*sys.path, os.getcwd()]
            if not top or importlib.machinery.PathFinder.find_spec(top, search) is None:
                raise InputError(f"-m {self.name}: no module named {top!r} here")
        if self.kind == "program" and shutil.which(self.name) is None:
            raise InputError(f"--no-python {self.name}: no such program (or not executable)")


# The torchrun options pyinit run sets itself; --torchrun passes on any other.
OWNED_TORCHRUN_OPTIONS = {
    "--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr",
    "--master-port", "--master_port", "--nproc-per-node", "--nproc_per_node",
    "--max-restarts", "--max_restarts", "--no-python", "--no_python", "--standalone",
    "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "-m",
    "--module", "--run-path", "--run_path", "--start-method", "--start_method",
}  # fmt: skip
WORKER_STARTS = ("fork", "spawn")


def torchrun_options(text: str) -> list[str]:
    """--torchrun's words, refusing the options pyinit run owns."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise InputError(f"--torchrun {text!r}: {e}") from None
    for word in words:
        option = word.split("=", 1)[0]
        if option in OWNED_TORCHRUN_OPTIONS:
            raise InputError(f"--torchrun: pyinit run sets {option} itself (see pyinit run --help)")
    return words


def pod_init_executable() -> str:
    """The static pod-init installed with this package: the scripts folder of
    this interpreter's installation (a venv's bin), beside the interpreter,
    else PATH."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(folder, "pod-init")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("pod-init")
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "the pod-init executable is not installed beside "
                                "pyinit (reinstall pod-init)", "pod-init")  # fmt: skip
    return found


def guarded(pod_init: str, command: Sequence[str]) -> list[str]:
    """The command under pod-init, a subreaper between pyinit run and
    torchrun: every orphan of the run (a script's subprocess, a setsid daemon)
    re-parents to it, and when pyinit run dies, even by kill -9, it KILLs them
    all (--end-with-parent). A process cannot outlive its supervisor's KILL
    otherwise: the kernel re-parents orphans past a dead subreaper."""
    return [pod_init, "--end-with-parent", "--grace", str(int(GUARD_GRACE_S)),
            "--", *command]  # fmt: skip


def torchrun_command(nodes: Nodes, nproc: int, port: int, restarts: int, status_dir: Path,
                     target: Target, extra: Sequence[str] = (),
                     worker_start: str = "fork") -> list[str]:  # fmt: skip
    """torchrun's agent (through pyinit.run.agent, which marks its start) with
    the static rendezvous at the master, running pyinit.run.worker per rank.
    Python workers are forked from the agent, torch already imported, unless
    `worker_start` is spawn; a program always gets a fresh interpreter to wrap it."""
    if worker_start == "fork" and target.kind != "program":
        worker_file = importlib.util.find_spec("pyinit.run.worker").origin
        entry = ["--start-method", "fork", "--run-path", worker_file]
    else:
        # -P: the working directory stays off sys.path, so a checkout of pod-init
        # there cannot shadow the installed package (python -m would put it first).
        entry = ["--no-python", sys.executable, "-P", "-m", "pyinit.run.worker"]
    return [
        sys.executable, "-P", "-m", "pyinit.run.agent",
        "--nnodes", str(nodes.count), "--node-rank", str(nodes.rank),
        "--master-addr", nodes.master, "--master-port", str(port),
        "--nproc-per-node", str(nproc), "--max-restarts", str(restarts), *extra,
        *entry, str(status_dir), target.kind, target.name, *target.args,
    ]  # fmt: skip


class Liveness:
    """A TCP port on this node that answers while `pyinit run` lives, so the
    other nodes can tell which node went away when a run fails. It answers
    `alive`, or `stall {json}` once this node's stall watch has found a stall
    (its verdict: the causes and where they were), which the other nodes'
    watchers read, so every node names the rank that stalled."""

    def __init__(self, address: str, port: int):
        """Binds the port now (so a taken one fails before the run starts);
        it answers once ``start`` runs."""
        self.port = port
        self.answer = b"alive\n"
        self._stop = threading.Event()
        self._seen: dict[int, int] = {}  # the last stall number each node reported
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            self._sock = socket.create_server((address, port), family=family, reuse_port=False)
        except OSError as e:
            shown = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
            raise OSError(e.errno, f"cannot listen on {shown}, this node's liveness port "
                          f"(--master-port + 1): {e.strerror}") from None  # fmt: skip

    def start(self) -> None:
        threading.Thread(target=self._serve, name="pyinit-liveness", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.answer)

    def report_stall(self, verdict: dict[str, Any]) -> None:
        self.answer = b"stall " + json.dumps(verdict).encode() + b"\n"

    def _ask_peers(self, addresses: Sequence[str], own_rank: int,
                   timeout_s: float) -> dict[int, bytes | None]:  # fmt: skip
        """Every other node's answer on its liveness port (None: no answer)."""
        answers: dict[int, bytes | None] = {}
        for rank, address in enumerate(addresses):
            if rank == own_rank:
                continue
            try:
                with socket.create_connection((address, self.port), timeout=timeout_s) as conn:
                    answers[rank] = conn.makefile("rb").readline(1 << 16)
            except OSError:
                answers[rank] = None
        return answers

    def new_peer_stalls(self, addresses: Sequence[str], own_rank: int) -> list[dict[str, Any]]:
        """Each other node's stall verdict not seen before (asked once each)."""
        found = []
        for rank, line in self._ask_peers(addresses, own_rank, 0.5).items():
            verdict = _stall_verdict(line)
            if verdict is not None and verdict["count"] > self._seen.get(rank, 0):
                self._seen[rank] = verdict["count"]
                found.append(verdict)
        return found

    def watch_peers(self, addresses: Sequence[str], own_rank: int,
                    on_stall: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
        """Asks every other node once a second; hands on each new stall verdict."""

        def poll() -> None:
            while not self._stop.wait(PEER_POLL_S):
                for verdict in self.new_peer_stalls(addresses, own_rank):
                    on_stall(verdict)

        threading.Thread(target=poll, name="pyinit-peers", daemon=True).start()

    def unreachable(self, addresses: Sequence[str], own_rank: int) -> list[int]:
        """The other nodes that do not answer within 2 s."""
        answers = self._ask_peers(addresses, own_rank, 2.0)
        return [rank for rank, line in answers.items() if line is None]

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


def _stall_verdict(line: bytes | None) -> dict[str, Any] | None:
    """A peer's `stall {json}` answer, or None for anything else: a peer may
    be another program on that port, or cut off mid-line, and its garbage
    must not end this node's watch."""
    if not line or not line.startswith(b"stall "):
        return None
    try:
        verdict = parse_json(line[6:].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    count = verdict.get("count") if isinstance(verdict, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        return None
    return verdict


def _worker_status(status_dir: Path) -> int | None:
    """The first failing rank's own exit status, if a worker recorded one."""
    codes = []
    for path in status_dir.glob("rank-*.json"):
        record = json.loads(path.read_text())
        if record["exit"] != 0:
            codes.append((record["rank"], record["exit"]))
    return min(codes)[1] if codes else None


def run(
    target: Target,
    *,
    hostfile: str | None = None,
    standalone: bool = False,
    torchrun: str = "",
    nproc_per_node: str = "auto",
    master_port: int = 29500,
    max_restarts: int = 0,
    preflight_mode: str = "warn",
    expect_gpus: int | None = None,
    run_dir: str | None = None,
    monitor_interval: float = 5.0,
    sysfs_root: str = "/sys",
    rescan: bool = False,
    boot_state: str = "/run/pod-init",
    nvml_backend: Any = None,
    worker_start: str = "fork",
    stall_timeout: float = 0.0,
    out: IO[str] = sys.stderr,
) -> int:
    """Runs the target under torchrun on this node; returns the exit status."""
    entered = boottime()
    if worker_start not in WORKER_STARTS:
        raise InputError(f"--worker-start must be fork or spawn, not {worker_start!r}")
    nproc = _nproc(nproc_per_node)  # every check before anything is written
    extra = torchrun_options(torchrun)
    target.check()
    pod_init = pod_init_executable()
    if standalone and hostfile:
        raise InputError("--standalone is one node alone: it takes no --hostfile")
    require("torch", "pyinit run (torchrun)")
    if preflight_mode not in PREFLIGHT_MODES:
        raise InputError(f"--preflight must be warn, strict or off, not {preflight_mode!r}")
    if run_dir and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise InputError(f"--run-dir {run_dir}: exists and is not a folder")
    nodes = find_nodes(hostfile, {} if standalone else os.environ)
    liveness = None
    if nodes.count > 1 and nodes.source in ("hostfile", "slurm"):
        # Bound before anything is written: a taken port or an address of a family
        # this host lacks is one line, with no run folder left behind.
        # SLURM's addresses are its node names, resolved as the job's hosts resolve them.
        liveness = Liveness(nodes.addresses[nodes.rank], master_port + 1)
    folder = Path(run_dir or f"pyinit-run/node{nodes.rank}")
    log = EventLog(folder / "events.jsonl", node=nodes.rank)
    log.write("start", argv=sys.argv, nodes=nodes.to_dict(), pid=os.getpid())
    checked = boottime()
    node = preflight(preflight_mode, sysfs_root=sysfs_root, expect_gpus=expect_gpus,
                     rescan=rescan, state_dir=boot_state, nvml_backend=nvml_backend)  # fmt: skip
    if node.boot_state is not None:
        # PID 1's steps of this boot, on the same clock: the run's timeline starts at power-on.
        for step in node.boot_state.timeline:
            log.phase(step["phase"], step["start_s"], step["start_s"] + step["seconds"],
                      source="pid1")  # fmt: skip
    log.phase("supervisor start", process_start(), entered)
    log.phase("preflight", checked, boottime())
    problems, gpus = node.problems, node.gpus
    for p in problems:
        if p.severity != "info":
            print(f"pyinit run: preflight {p.severity} {p.code} {p.device}: {p.message}", file=out)
    log.write("preflight", mode=preflight_mode, gpus=gpus, topology=node.source,
              problems=[asdict(p) for p in problems])  # fmt: skip
    if preflight_mode == "strict" and any(p.severity == "error" for p in problems):
        if liveness is not None:
            liveness.close()
        log.write("end", status=EXIT_FAILURE, reason="preflight errors (strict)")
        print("pyinit run: preflight found errors; not starting (--preflight strict)", file=out)
        return EXIT_FAILURE
    nproc = nproc or gpus or min(os.cpu_count() or 1, 8)
    env = dict(os.environ, PYINIT_NODE_RANK=str(nodes.rank))
    env[RUN_DIR_ENV] = str(folder.resolve())
    if "GLOO_SOCKET_IFNAME" not in env and (nodes.interface or nodes.count == 1):
        # Gloo finds its interface through the host name (DNS or /etc/hosts); the
        # hostfile already says which address this node is, and one node alone
        # needs only the loopback (a fresh boot may have no name that resolves).
        env["GLOO_SOCKET_IFNAME"] = nodes.interface or "lo"
    configured = boottime()
    if gpus and node.boot_state is not None and node.boot_state.nccl_dir and nodes.count == 1:
        # PID 1 configured NCCL for this boot and this single node: use its files as they are.
        env.update(node.boot_state.nccl_env)
        log.write("nccl", reused=str(node.boot_state.nccl_dir), env=node.boot_state.nccl_env)
    elif gpus:
        from pyinit.nccl import configure

        tuning, cached = _nccl_tuning(node, env, log, out)
        config = configure(topology=node.topology, nodes=nodes.native, tuning=tuning,
                           out_dir=str(folder / "nccl"), nvml=node.nvml)  # fmt: skip
        config.write()
        env.update(config.env)
        log.write("nccl", files=sorted(config.files), env=config.env)
        if tuning is not None:
            from pyinit.nccl.tuning import TABLE_NAME

            # The copy beside this run's NCCL files: the cache may change under a long run.
            table = Path(config.out_dir) / TABLE_NAME
            _use_tuner_plugin(tuning, cached, table, env, log)
    if gpus:
        log.phase("nccl files", configured, boottime())
    status_dir = folder / "status"
    status_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank-*.json", "attempt-*", "progress-rank*", "stack-rank*"):
        for stale in status_dir.glob(pattern):
            stale.unlink()
    # A reused --run-dir: the report reads the last run's events, so only its step records.
    for stale in (folder / STEPS_FOLDER).glob("rank-*"):
        stale.unlink()
    if stall_timeout > 0:
        for key, value in flight_recorder_env(folder, status_dir).items():
            env.setdefault(key, value)
    command = torchrun_command(nodes, nproc, master_port, max_restarts, status_dir, target, extra,
                               worker_start)  # fmt: skip
    monitor = None
    parent = os.getpid()
    if monitor_interval > 0:
        # The golden metrics beside the run, in the run's folder. Started before the
        # signals are blocked below, so it can be ended with TERM.
        monitor = subprocess.Popen(
            [sys.executable, "-P", "-m", "pyinit.cli", "monitor", "--interval",
             str(monitor_interval), "--out", str(folder / "monitor.jsonl")],
            stderr=subprocess.DEVNULL,
            # No thread runs yet, so preexec_fn is safe: the monitor ends with this process.
            preexec_fn=lambda: _native.die_with_parent(signal.SIGTERM, parent),
        )  # fmt: skip
    # Supervision is the core's (the same loop as pod-init's): it takes the signals
    # with sigtimedwait, so they are blocked here before any thread starts.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISED)
    try:
        if liveness is not None:
            liveness.start()
        _native.become_subreaper()  # workers torchrun leaves behind re-parent here
        forwarded: list[int] = []

        def on_signal(sig: int) -> None:
            if not forwarded:
                log.write("signal", signal=signal.Signals(sig).name)
            forwarded.append(sig)

        restarts = _RestartWatch(status_dir, log)
        stalls = StallWatch(status_dir, folder, stall_timeout, nodes.rank, log, out, env,
                            announce=liveness.report_stall if liveness else None)  # fmt: skip
        if liveness is not None and stall_timeout > 0:
            liveness.watch_peers(nodes.addresses, nodes.rank, stalls.peer_stall)

        def on_tick() -> None:
            restarts.check()
            stalls.check()

        log.write("spawn", command=command,
                  seconds_since_start=round(boottime() - entered, 4))  # fmt: skip
        code = _native.supervise(
            guarded(pod_init, command), env, grace_s=ESCALATE_AFTER_S, on_signal=on_signal,
            on_tick=on_tick, tick_s=0.25,
            on_log=lambda line: log.write("supervisor", message=line),
            # Until pod-init has asked for its own parent-death signal, it dies with us.
            parent_death_signal=signal.SIGKILL,
        )  # fmt: skip
        restarts.check()  # an attempt that began and ended between two looks
        stalls.finish()  # a stall being looked into when the workers ended
        if monitor is not None:
            monitor.terminate()
            monitor.wait()
        survivors = _native.end_children()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    status = _exit_status(code, forwarded, _worker_status(status_dir))
    if status != 0 and stall_timeout > 0 and liveness is not None:
        # A stalled node's workers were ended: ours may have failed on the broken
        # connection before the next poll. Its verdict is still being served.
        for verdict in liveness.new_peer_stalls(nodes.addresses, nodes.rank):
            stalls.peer_stall(verdict)
        stalls.check()
    if status != 0 and (stalls.stalls or stalls.peer_stalls) and not forwarded:
        status = EXIT_STALLED  # the workers were ended for a stall, and not restarted
    fields: dict[str, Any] = {"status": status, "torchrun_status": code,
                              "survivors_killed": survivors, "stalls": stalls.stalls,
                              "peer_stalls": stalls.peer_stalls}  # fmt: skip
    if status != 0 and liveness is not None:
        lost = liveness.unreachable(nodes.addresses, nodes.rank)
        fields["unreachable_nodes"] = [{"rank": r, "address": nodes.addresses[r]} for r in lost]
        for r in lost:
            print(f"pyinit run: node {r} ({nodes.addresses[r]}) is gone", file=out)
    log.write("end", **fields)
    if liveness is not None:
        if status != 0:
            # The other nodes are checking who is gone right now: stay reachable a moment.
            time.sleep(LIVENESS_LINGER_S)
        liveness.close()
    log.close()
    print(f"pyinit run: exited with status {status}", file=out)
    return status


def _nccl_tuning(node: Any, env: Mapping[str, str], log: EventLog, out: IO[str]) -> tuple[Any, str]:
    """The cached NCCL tuning for this node and its file, or (None, "") after
    one line saying why NCCL chooses alone."""
    from pyinit.nccl.tuning import cache_dir, for_run

    if node.nvml is None:
        return None, ""  # no driver view: no key to look the node up by
    if "NCCL_TUNER_PLUGIN" in env:
        why = f"NCCL_TUNER_PLUGIN is set ({env['NCCL_TUNER_PLUGIN']})"
    else:
        tuning, why = for_run(node.topology, node.nvml, cache_dir(env))
        if tuning is not None:
            return tuning, why
    print(f"pyinit run: NCCL tuning not used: {why}", file=out)
    log.write("nccl_tuning", used=False, reason=why)
    return None, ""


def _use_tuner_plugin(tuning: Any, cached: str, table: Path, env: dict[str, str],
                      log: EventLog) -> None:  # fmt: skip
    from pyinit.nccl.tuning import plugin_run_env

    for key, value in plugin_run_env(tuning, table, os.environ).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    log.write("nccl_tuning", used=True, cached=cached, table=str(table), key=tuning.key.id,
              rules=len(tuning.rules), env=tuning.plugin_env)  # fmt: skip


def _exit_status(code: int, forwarded: list[int], worker: int | None) -> int:
    """The run's status: 128+N when it forwarded signal N, else the failing
    script's own status (torchrun reports any failure as 1), else torchrun's."""
    if forwarded:
        return 128 + forwarded[0]
    if code == 0:
        return 0
    return worker if worker is not None else code


def _nproc(value: str) -> int | None:
    """The worker count asked for; None for auto (one per GPU, else per CPU)."""
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        raise InputError(
            f"--nproc-per-node must be a whole number or auto, not {value!r}"
        ) from None
    if not 1 <= count <= MAX_NPROC:
        raise InputError(f"--nproc-per-node must be from 1 to {MAX_NPROC}, not {count}")
    return count


class _RestartWatch:
    """Logs a restart event for every new attempt mark pyinit.worker leaves."""

    def __init__(self, status_dir: Path, log: EventLog):
        self._status_dir = status_dir
        self._log = log
        self._attempts = 1

    def check(self) -> None:
        seen = len(list(self._status_dir.glob("attempt-*")))
        for attempt in range(self._attempts, seen):
            self._log.write("restart", attempt=attempt)
        self._attempts = max(self._attempts, seen)
