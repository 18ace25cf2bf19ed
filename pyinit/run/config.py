"""``pyinit run``'s settings, made once: the options (each also settable from
the environment as ``PYINIT_<OPTION>``, as torchrun's are from ``PET_*``),
and :class:`RunConfig`, the frozen value every later step takes, built by
:func:`config_from_args` with every check done there and nowhere else.

``--run-dir`` has no environment fallback: ``PYINIT_RUN_DIR`` is what a run
tells its own agent and workers (``pyinit.runlog.events``), so a run started
from inside a worker would otherwise write into its parent's folder.
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import shutil
import stat
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyinit import _native, argtypes
from pyinit.errors import InputError
from pyinit.extras import require
from pyinit.jsonfile import kind_of
from pyinit.run import ddp_pieces, preload

ENV_PREFIX = "PYINIT_"
PREFLIGHT_MODES = ("warn", "strict", "off")
# Workers per node: far above any GPU count, and a bound on what torchrun is asked to fork.
MAX_NPROC = 1024
WORKER_STARTS = ("fork", "spawn")
# The torchrun options pyinit run sets itself; --torchrun passes on any other.
OWNED_TORCHRUN_OPTIONS = {
    "--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr",
    "--master-port", "--master_port", "--nproc-per-node", "--nproc_per_node",
    "--max-restarts", "--max_restarts", "--no-python", "--no_python", "--standalone",
    "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-conf",
    "--rdzv_conf", "-m",
    "--module", "--run-path", "--run_path", "--start-method", "--start_method",
}  # fmt: skip
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
# auto (the default): hand the launch to a warm interpreter, starting one where
# leaving it behind is right (may_leave_warm_unasked); off: every launch cold.
WARM_ENV, WARM_MODES = "PYINIT_WARM", ("auto", "off")


@dataclass(frozen=True)
class Target:
    """What each worker runs: a script, a module (``-m``) or a program (``--no-python``)."""

    kind: str  # script, module, program
    name: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    target: Target
    hostfile: str | None
    standalone: bool
    torchrun_options: tuple[str, ...]
    nproc: int | None  # None: one per GPU, else one per CPU up to 8
    master_port: int | None  # None: a free one on one node, Nodes.port or 29500 across nodes
    join_timeout: float
    max_restarts: int
    preflight: str
    expect_gpus: int | None
    run_dir: Path | None  # None: pyinit-run/nodeR
    compile_cache: Path | None  # torch.compile's portable caches; None: the run folder
    monitor_interval: float
    sysfs_root: str
    rescan: bool
    boot_state: str
    worker_start: str
    stall_timeout: float
    pod_init: str  # the executable torchrun runs under
    preloads: tuple[str, ...] = ()  # the script's own, imported before the workers fork
    cold: bool = False  # never hand the launch to a warm interpreter
    # Start a warm interpreter for this launch and the next when none runs:
    # "asked" (--keep-warm), "auto" (the default where it is right), "" never.
    leave_warm: str = ""


def env_name(option: str) -> str:
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def add_arguments(run: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    """pyinit run's options, with their environment fallbacks as defaults
    (argparse checks a string default with the option's own type)."""

    def option(name: str, default: object, help: str, **kwargs: object) -> None:
        key = env_name(name)
        run.add_argument(name, default=environ.get(key, default),
                         help=f"{help} (env {key})", **kwargs)  # type: ignore[arg-type]  # fmt: skip

    def flag(name: str, help: str) -> None:
        # The environment's word is checked by config_from_args (_flag), not here:
        # building the parser must not fail for every other command.
        key = env_name(name)
        run.add_argument(name, action="store_true", default=environ.get(key),
                         help=f"{help} (env {key}=1)")  # fmt: skip

    option("--hostfile", None, "one IP address per node, node 0 first", metavar="FILE")
    option("--nproc-per-node", "auto", "workers on this node (auto: one per GPU, else one "
           "per CPU up to 8)", metavar="N|auto")  # fmt: skip
    # 65534 at most: the port above it is the run's liveness port.
    option("--master-port", None, "the rendezvous store's port on node 0 (default: a free "
           "one on a single node; across nodes MASTER_PORT, else a SLURM job's own, else "
           "29500)", type=argtypes.whole(1, 65534), metavar="P")  # fmt: skip
    option("--join-timeout", 300.0, "seconds for every node to join before the run ends, "
           "naming the missing ones", type=argtypes.seconds(1, 86400), metavar="S")  # fmt: skip
    option("--max-restarts", 0, "worker-group restarts torchrun may make",
           type=argtypes.whole(0, 1000), metavar="K")  # fmt: skip
    option("--preflight", "warn", "strict: do not start on an error finding",
           choices=PREFLIGHT_MODES)  # fmt: skip
    option("--expect-gpus", None, "a preflight error when fewer GPUs are found",
           type=argtypes.whole(0, _native.MAX_EXPECTED_GPUS), metavar="N")  # fmt: skip
    run.add_argument("--run-dir", metavar="DIR", help="events.jsonl, NCCL files (pyinit-run/nodeR)")
    option("--compile-cache", "", "a folder the nodes share (beside the checkpoints) for "
           "torch.compile's portable caches, which a node joining later loads instead of "
           "compiling (default: the run folder)", metavar="DIR")  # fmt: skip
    option("--monitor-interval", 5.0, "sample into RUN_DIR/monitor.jsonl every S seconds "
           "(0: off)", type=argtypes.seconds(0.1, 3600, zero=True), metavar="S")  # fmt: skip
    option("--sysfs-root", "/sys", "scan this tree (a fixture)", metavar="DIR")
    flag("--rescan", "scan even when PID 1 left a scan of this boot")
    option("--boot-state", "/run/pod-init", "where PID 1 left its scan and NCCL files",
           metavar="DIR")  # fmt: skip
    run.add_argument("-m", dest="module", metavar="MODULE",
                     help="run a module as python -m does (ARGS after --)")  # fmt: skip
    run.add_argument("--no-python", action="store_true",
                     help="SCRIPT is a program to execute, not Python")  # fmt: skip
    option("--stall-timeout", 0.0, "end (or restart) the workers when a rank makes no step "
           "for S seconds after its last one, naming it; 0: off (try 300)",
           type=argtypes.seconds(1, 86400, zero=True), metavar="S")  # fmt: skip
    option("--worker-start", "fork", "fork: workers forked from torchrun's agent, torch "
           "imported once; spawn: a fresh interpreter each, as plain torchrun",
           choices=WORKER_STARTS)  # fmt: skip
    option("--preload", "", "more modules to import once before the workers fork (the "
           "script's heavy imports, e.g. transformers)", metavar="MOD[,MOD...]")  # fmt: skip
    flag("--cold", "start torchrun's agent afresh, never in a warm interpreter (pyinit warm)")
    flag("--keep-warm", "leave a warm interpreter with these preloads for the next launch")
    flag("--standalone", "this node alone, whatever SLURM or the environment say")
    option("--torchrun", "", "more torchrun options, quoted as one (e.g. '--log-dir L "
           "--redirects 3'); those pyinit run sets itself are refused",
           metavar="'OPTIONS'")  # fmt: skip
    run.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS...]")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Every check of pyinit run's settings, before anything is written."""
    target = _target(args)
    # Choices are not checked by argparse for defaults, which the environment may give.
    if args.worker_start not in WORKER_STARTS:
        raise InputError(f"--worker-start must be fork or spawn, not {args.worker_start!r}")
    if args.preflight not in PREFLIGHT_MODES:
        raise InputError(f"--preflight must be warn, strict or off, not {args.preflight!r}")
    nproc = _nproc(args.nproc_per_node)
    extra = torchrun_options(args.torchrun)
    check_target(target)
    pod_init = pod_init_executable()
    standalone = _flag(args.standalone, "--standalone")
    if standalone and args.hostfile:
        raise InputError("--standalone is one node alone: it takes no --hostfile")
    require("torch", "pyinit run (torchrun)")
    preloads = preload.parse(args.preload)
    preload.check_exists(preloads)
    if preloads and (args.worker_start != "fork" or target.kind == "program"):
        raise InputError("--preload imports before the workers fork: it takes Python workers "
                         "and --worker-start fork")  # fmt: skip
    warm_mode = (os.environ.get(WARM_ENV) or "auto").strip().lower()
    if warm_mode not in WARM_MODES:
        raise InputError(f"{WARM_ENV}={os.environ[WARM_ENV]!r}: expected auto or off")
    if ddp_pieces.switch(os.environ) not in ("on", "off"):
        raise InputError(f"{ddp_pieces.SWITCH}={os.environ[ddp_pieces.SWITCH]!r}: "
                         "expected on or off")  # fmt: skip
    cold = _flag(args.cold, "--cold")
    keep_warm = _flag(args.keep_warm, "--keep-warm")
    if cold and keep_warm:
        raise InputError("--cold and --keep-warm: give one")
    if warm_mode == "off" and keep_warm:
        raise InputError(f"--keep-warm and {WARM_ENV}=off: give one")
    cold = cold or warm_mode == "off"
    unasked = not cold and may_leave_warm_unasked(os.environ)
    leave_warm = "asked" if keep_warm else "auto" if unasked else ""
    if args.run_dir and Path(args.run_dir).exists() and not Path(args.run_dir).is_dir():
        raise InputError(f"--run-dir {args.run_dir}: exists and is not a folder")
    if args.compile_cache and not Path(args.compile_cache).is_dir():
        raise InputError(f"--compile-cache {args.compile_cache}: not a folder")
    return RunConfig(
        target=target, hostfile=args.hostfile or None, standalone=standalone,
        torchrun_options=tuple(extra), nproc=nproc, master_port=args.master_port,
        join_timeout=args.join_timeout,
        max_restarts=args.max_restarts, preflight=args.preflight, expect_gpus=args.expect_gpus,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        compile_cache=Path(args.compile_cache) if args.compile_cache else None,
        monitor_interval=args.monitor_interval, sysfs_root=args.sysfs_root,
        rescan=_flag(args.rescan, "--rescan"),
        boot_state=args.boot_state, worker_start=args.worker_start,
        stall_timeout=args.stall_timeout, pod_init=pod_init, preloads=preloads, cold=cold,
        leave_warm=leave_warm,
    )  # fmt: skip


def may_leave_warm_unasked(environ: Mapping[str, str]) -> bool:
    """Whether a run may leave a warm interpreter behind without being asked:
    not in a SLURM job (the step's cgroup ends with the step and would kill
    it), nor as the workload of a container or boot image (pyinit run is PID 1
    or PID 1's child: the run's end is theirs)."""
    return not environ.get("SLURM_JOB_ID") and 1 not in (os.getpid(), os.getppid())


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


def _flag(value: bool | str | None, option: str) -> bool:
    """A flag: given (True), or its environment word, or absent."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    word = value.strip().lower()
    if word not in TRUE + FALSE:
        raise InputError(f"{env_name(option)}={value!r}: expected 1 or 0 ({option})")
    return word in TRUE


def _target(args: argparse.Namespace) -> Target:
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if args.module and args.no_python:
        raise InputError("-m and --no-python: give one")
    if args.module:
        return Target("module", args.module, tuple(command))
    if not command:
        raise InputError("no script: pyinit run [options] -- SCRIPT [ARGS...] (or -m MODULE)")
    return Target("program" if args.no_python else "script", command[0], tuple(command[1:]))


def check_target(target: Target) -> None:
    """InputError when there is nothing to run by that name."""
    import importlib.machinery

    if target.kind == "script":
        try:
            mode = os.stat(target.name).st_mode
        except OSError:
            raise InputError(f"{target.name}: no such script") from None
        if not stat.S_ISREG(mode):  # each worker reads it: a pipe could be read once
            raise InputError(f"{target.name}: {kind_of(mode)}, not a script file")
    if target.kind == "script" and not os.access(target.name, os.R_OK):
        # Each worker would print its own PermissionError traceback.
        raise InputError(f"{target.name}: a script this user cannot read (its mode or owner): "
                         "make it readable")  # fmt: skip
    if target.kind == "module":
        top = target.name.split(".")[0]
        # Where the workers look: sys.path and the working directory (see the worker).
        search = [*sys.path, os.getcwd()]
        if not top or importlib.machinery.PathFinder.find_spec(top, search) is None:
            raise InputError(f"-m {target.name}: no module named {top!r} here")
    if target.kind == "program" and shutil.which(target.name) is None:
        raise InputError(f"--no-python {target.name}: no such program (or not executable)")


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
