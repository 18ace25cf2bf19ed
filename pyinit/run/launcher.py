"""``pyinit run``: check the node, configure NCCL, start torchrun with the
right node rank and master, forward signals, report how it ended.

    pyinit run --hostfile hosts -- train.py --steps 1000

In torchrun's shape: the options become a frozen ``RunConfig``
(``pyinit.run.config``); ``prepare`` makes the plan (the nodes, the run
folder, the preflight, NCCL's files, the environment and the command);
``launch`` supervises it; ``conclude`` draws the exit status and the ``end``
event from what happened. torchrun runs with a static rendezvous at the
master; its workers run the script through ``pyinit.run.wrapper``, which
records the script's own exit status. The supervision (signals forwarded,
children reaped, KILL after a grace) is the C++ core's, the same loop
`pod-init -- CMD` runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from pyinit import _native
from pyinit.errors import EXIT_FAILURE, EXIT_STALLED
from pyinit.run import store
from pyinit.run.agent import (
    AGENT_LOG,
    AGENT_START,
    FAILURES_FILE,
    PRELOAD_OPTION,
)
from pyinit.run.compiles import COMPILE_CACHE_ENV, COMPILE_CACHE_FILE
from pyinit.run.config import RunConfig
from pyinit.run.flight_recorder import flight_recorder_env
from pyinit.run.liveness import PEER_POLL_S, JoinWatch, Liveness, named
from pyinit.run.nodes import Nodes, endpoint, find_nodes
from pyinit.run.preflight import preflight
from pyinit.run.preload import DEFAULT_PRELOADS
from pyinit.run.stall import FLIGHT_RECORDER_WAIT_S, STACK_WAIT_S, StallWatch
from pyinit.run.store import Store
from pyinit.run.warm import client, protocol
from pyinit.runlog.events import (
    FILE_NAME,
    RUN_DIR_ENV,
    EventLog,
    boottime,
    default_folder,
    process_start,
)
from pyinit.runlog.progress import TEARDOWN_S, teardown_path
from pyinit.runlog.steps import FOLDER as STEPS_FOLDER
from pyinit.say import say

# What the core's supervisor takes: the signals it forwards, and SIGCHLD.
SUPERVISED = {*protocol.FORWARDED, signal.SIGCHLD}
# torchrun gives its workers 30 s after a TERM before it KILLs them; wait past that.
TORCHRUN_GRACE_S = 30.0
# pod-init, between pyinit run and torchrun, KILLs after this; pyinit run a little later.
GUARD_GRACE_S = TORCHRUN_GRACE_S + 10.0
ESCALATE_AFTER_S = GUARD_GRACE_S + 5.0
LIVENESS_LINGER_S = 3.0
# How long a node whose stall had every rank waiting asks the other nodes for the
# cause: the node that has it finds the same stall within about a poll of this one,
# and gathers its ranks' stacks (and flight recorder) for at most this.
CAUSE_WAIT_S = max(STACK_WAIT_S, FLIGHT_RECORDER_WAIT_S) + PEER_POLL_S
CAUSE_ASK_S = 0.2


def guarded(pod_init: str, command: Sequence[str]) -> list[str]:
    """The command under pod-init, a subreaper between pyinit run and
    torchrun: every orphan of the run (a script's subprocess, a setsid daemon)
    re-parents to it, and when pyinit run dies, even by kill -9, it KILLs them
    all (--end-with-parent). A process cannot outlive its supervisor's KILL
    otherwise: the kernel re-parents orphans past a dead subreaper."""
    return [pod_init, "--end-with-parent", "--grace", str(int(GUARD_GRACE_S)),
            "--", *command]  # fmt: skip


def agent_preloads(config: RunConfig) -> list[str]:
    """What the agent imports before it forks Python workers; nothing when
    each worker starts its own interpreter."""
    if config.worker_start != "fork" or config.target.kind == "program":
        return []
    return list(dict.fromkeys((*DEFAULT_PRELOADS, *config.preloads)))


def torchrun_command(nodes: Nodes, nproc: int, config: RunConfig, status_dir: Path,
                     rendezvous: Store) -> list[str]:  # fmt: skip
    """torchrun's agent (through pyinit.run.agent, which marks its start) with
    the rendezvous on the store pyinit run bound, running pyinit.run.wrapper per rank.
    Python workers are forked from the agent, torch already imported, unless
    --worker-start is spawn; a program always gets a fresh interpreter to wrap it."""
    target = config.target
    preloads = agent_preloads(config)
    if preloads:
        worker_file = importlib.util.find_spec("pyinit.run.wrapper").origin
        entry = ["--start-method", "fork", "--run-path", worker_file]
        preloads = [f"{PRELOAD_OPTION}{','.join(preloads)}"]
    else:
        # -P: the working directory stays off sys.path, so a checkout of pod-init
        # there cannot shadow the installed package (python -m would put it first).
        entry = ["--no-python", sys.executable, "-P", "-m", "pyinit.run.wrapper"]
    return [
        *AGENT_START, *preloads,
        "--nnodes", str(nodes.count),
        *store.torchrun_options(rendezvous, nodes.rank, config.join_timeout),
        "--nproc-per-node", str(nproc), "--max-restarts", str(config.max_restarts),
        # torchrun's folder per attempt and rank (its workers' error files) in the run
        # folder: without it, torchrun leaves a new /tmp/torchelastic_* at every launch.
        # Before --torchrun's words, so that a --log-dir there comes last and wins.
        "--log-dir", str(status_dir.parent / "torchrun"),
        *config.torchrun_options,
        *entry, str(status_dir), target.kind, target.name, *target.args,
    ]  # fmt: skip


@dataclass
class Plan:
    """What launch() runs: every setting found, every file written."""

    config: RunConfig
    nodes: Nodes
    folder: Path
    status_dir: Path
    log: EventLog
    liveness: Liveness | None
    rendezvous: Store
    env: dict[str, str]
    command: list[str]  # torchrun's, before pod-init is put in front
    preloads: list[str]  # what the agent imports before it forks workers
    entered: float  # CLOCK_BOOTTIME at pyinit run's start


@dataclass
class Outcome:
    code: int  # what the supervised command exited with
    forwarded: list[int]  # signals forwarded, first first
    survivors: int  # processes ended after the command
    stalls: StallWatch
    joins: JoinWatch | None  # several nodes: who has joined
    warm_ended: str = ""  # the warm interpreter that ran the agent went away first: why
    join_expired: bool = False  # this node's agent was ended for not joining in time
    peer_lost: bool = False  # this node's workers were ended for a node that went away


def run(config: RunConfig, nvml_backend: Any = None, out: IO[str] = sys.stderr) -> int:
    """Runs the target under torchrun on this node; returns the exit status.
    Whatever happens after the log is open, it gets an ``end`` event and is
    closed, and the liveness port is closed."""
    entered = boottime()
    nodes = find_nodes(config.hostfile, {} if config.standalone else os.environ)
    # Bound before anything is written: a taken port or an address of a family
    # this host lacks is one line, with no run folder left behind.
    rendezvous = store.bind(nodes, config.master_port or nodes.port)
    liveness = None
    if nodes.count > 1 and nodes.source in ("hostfile", "slurm"):
        try:
            liveness = Liveness(nodes.listen, rendezvous.port + 1)
        except OSError:
            rendezvous.close()
            raise
    folder = config.run_dir or default_folder(nodes.rank)
    log = EventLog(folder / FILE_NAME, node=nodes.rank)
    ended = False
    try:
        log.write("start", argv=sys.argv, nodes=nodes.to_dict(), pid=os.getpid())
        if config.leave_warm:
            # First, so its imports go on beside the preflight and the NCCL files;
            # and before launch() makes this process a subreaper: the warm
            # interpreter detaches, and must not re-parent here, where
            # end_children() would end it.
            _start_warm(config, log, out)
        plan = prepare(config, nodes, folder, log, liveness, rendezvous, entered, nvml_backend,
                       out)  # fmt: skip
        if plan is None:
            ended = True
            return EXIT_FAILURE
        outcome = launch(plan, out)
        status = conclude(plan, outcome, out)
        ended = True
        return status
    except BaseException as error:
        if not ended:
            log.write("end", status=EXIT_FAILURE, error=f"{type(error).__name__}: {error}")
        raise
    finally:
        rendezvous.close()
        if liveness is not None:
            liveness.close()
        log.close()


def prepare(config: RunConfig, nodes: Nodes, folder: Path, log: EventLog,
            liveness: Liveness | None, rendezvous: Store, entered: float, nvml_backend: Any,
            out: IO[str]) -> Plan | None:  # fmt: skip
    """The preflight, NCCL's files, the environment and the command; None
    (with its end event) when a strict preflight refuses the node."""
    checked = boottime()
    node = preflight(config.preflight, sysfs_root=config.sysfs_root,
                     expect_gpus=config.expect_gpus, rescan=config.rescan,
                     state_dir=config.boot_state, nvml_backend=nvml_backend)  # fmt: skip
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
            say(f"pyinit run: preflight {p.severity} {p.code} {p.device}: {p.message}", out)
    log.write("preflight", mode=config.preflight, gpus=gpus, topology=node.source,
              problems=[asdict(p) for p in problems])  # fmt: skip
    if config.preflight == "strict" and any(p.severity == "error" for p in problems):
        log.write("end", status=EXIT_FAILURE, reason="preflight errors (strict)")
        say("pyinit run: preflight found errors; not starting (--preflight strict)", out)
        return None
    nproc = config.nproc or gpus or min(os.cpu_count() or 1, 8)
    env = dict(os.environ, PYINIT_NODE_RANK=str(nodes.rank))
    env[RUN_DIR_ENV] = str(folder.resolve())
    cache_folder = config.compile_cache or folder
    env[COMPILE_CACHE_ENV] = str((cache_folder / COMPILE_CACHE_FILE).resolve())
    if rendezvous.listening is not None:
        env[store.FD_ENV] = str(rendezvous.listening.fileno())
    if "GLOO_SOCKET_IFNAME" not in env and (nodes.interface or nodes.count == 1):
        # Gloo finds its interface through the host name (DNS or /etc/hosts); the
        # hostfile already says which address this node is, a host name on a loopback
        # address would keep it from the other nodes, and one node alone needs only
        # the loopback (a fresh boot may have no name that resolves).
        env["GLOO_SOCKET_IFNAME"] = nodes.interface or "lo"
    if gpus:
        configured = boottime()
        _configure_nccl(node, nodes, folder, env, log, out)
        log.phase("nccl files", configured, boottime())
    status_dir = folder / "status"
    status_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank-*.json", "attempt-*", "progress-rank*", "stack-rank*", FAILURES_FILE,
                    store.JOINED_FILE):  # fmt: skip
        for stale in status_dir.glob(pattern):
            stale.unlink()
    # A reused --run-dir: the report reads the last run's events, so only its step records.
    for stale in (folder / STEPS_FOLDER).glob("rank-*"):
        stale.unlink()
    if config.stall_timeout > 0:
        for key, value in flight_recorder_env(folder, status_dir).items():
            env.setdefault(key, value)
    command = torchrun_command(nodes, nproc, config, status_dir, rendezvous)
    serving = {}
    if rendezvous.listening is not None:
        serving["listening"] = endpoint(*rendezvous.listening.getsockname()[:2])
    log.write("rendezvous", endpoint=rendezvous.endpoint, serving=rendezvous.listening is not None,
              join_timeout=config.join_timeout, **serving)  # fmt: skip
    return Plan(config, nodes, folder, status_dir, log, liveness, rendezvous, env, command,
                agent_preloads(config), entered)  # fmt: skip


def _configure_nccl(node: Any, nodes: Nodes, folder: Path, env: dict[str, str], log: EventLog,
                    out: IO[str]) -> None:  # fmt: skip
    if node.boot_state is not None and node.boot_state.nccl_dir and nodes.count == 1:
        # PID 1 configured NCCL for this boot and this single node: use its files as they are.
        env.update(node.boot_state.nccl_env)
        log.write("nccl", reused=str(node.boot_state.nccl_dir), env=node.boot_state.nccl_env)
        return
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
        _use_tuner_plugin(tuning, cached, Path(config.out_dir) / TABLE_NAME, env, log)


def launch(plan: Plan, out: IO[str]) -> Outcome:
    """The monitor, then torchrun under pod-init under the core's supervisor,
    the restart and stall watches on its tick."""
    config, log, liveness, nodes = plan.config, plan.log, plan.liveness, plan.nodes
    monitor = None
    parent = os.getpid()
    if config.monitor_interval > 0:
        # The golden metrics beside the run, in the run's folder. Started before the
        # signals are blocked below, so it can be ended with TERM.
        monitor = subprocess.Popen(
            [sys.executable, "-P", "-m", "pyinit.cli", "monitor", "--interval",
             str(config.monitor_interval), "--out", str(plan.folder / "monitor.jsonl")],
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
        # This node's agent never reached the rendezvous in time, or another node went
        # away: ended with the TERM a stop would send, which this process sends itself
        # (not a forwarded one).
        join_expired = peer_lost = own_term_due = False
        lost: list[tuple[int, float]] = []  # nodes gone, from the peer watch's thread

        def on_signal(sig: int) -> bool:
            """Whether `sig` came from outside (False: this process's own TERM)."""
            nonlocal own_term_due
            if sig == signal.SIGTERM and own_term_due:
                own_term_due = False
                return False
            if not forwarded:
                log.write("signal", signal=signal.Signals(sig).name)
            forwarded.append(sig)
            return True

        restarts = _RestartWatch(plan.status_dir, log)
        stalls = StallWatch(plan.status_dir, plan.folder, config.stall_timeout, nodes.rank, log,
                            out, plan.env,
                            announce=liveness.report_stall if liveness else None)  # fmt: skip
        if liveness is not None:
            liveness.watch_peers(nodes.addresses, nodes.rank,
                                 stalls.peer_stall if config.stall_timeout > 0 else None,
                                 lambda rank, silent_s: lost.append((rank, silent_s)))  # fmt: skip
        joins = None
        if liveness is not None:

            def say_waiting(line: str) -> None:
                say(f"pyinit run: {line}", out)

            joins = JoinWatch(plan.status_dir / store.JOINED_FILE, liveness, nodes,
                              config.join_timeout, say_waiting)  # fmt: skip
            liveness.joined = joins.has_joined
            joins.start()

        def end_own_workers() -> None:
            nonlocal own_term_due
            own_term_due = True
            # To this thread, which waits for it: sent to the process, the TERM may
            # go to a thread that does not block it (one a library started before
            # the mask), and its default action ends this process.
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        def on_tick() -> None:
            nonlocal join_expired, peer_lost
            restarts.check()
            stalls.check()
            if joins is not None and not join_expired and joins.expired():
                join_expired = True
                log.write("join timeout", seconds=config.join_timeout)
                end_own_workers()
            if liveness is not None and restarts.attempts_seen:
                liveness.workers_started()
            if lost and not peer_lost and not forwarded:
                # Its ranks are gone from every collective: this node's can only wait.
                peer_lost = True
                for rank, silent_s in lost:
                    failed = liveness.said_failed(rank)
                    log.write("node lost", rank=rank, name=nodes.names[rank],
                              address=nodes.addresses[rank], silent_s=round(silent_s, 1),
                              run_failed=failed)  # fmt: skip
                    how = ", whose run failed," if failed else ""
                    say(f"pyinit run: node {rank} ({nodes.names[rank]}){how} has not answered "
                        f"for {silent_s:.0f} s: ending this node's workers", out)  # fmt: skip
                end_own_workers()

        log.write("spawn", command=plan.command,
                  seconds_since_start=round(boottime() - plan.entered, 4))  # fmt: skip
        warm, warm_ended, code = None, "", None
        if not config.cold:
            try:
                warm = _hand_over(plan, out)
            except client.Interrupted as interrupted:
                on_signal(interrupted.signal)
                code = 128 + interrupted.signal
                say(f"pyinit run: {interrupted} while the warm interpreter imported: nothing "
                    "was started", out)  # fmt: skip
        if warm is not None:
            code, warm_ended = _relay(warm, forwarded, on_signal, on_tick, log, out)
        elif code is None:
            # As bytes: an argument or a variable need not be UTF-8 (a surrogate escape).
            code = _native.supervise(
                [os.fsencode(word) for word in guarded(config.pod_init, plan.command)],
                {os.fsencode(k): os.fsencode(v) for k, v in plan.env.items()},
                grace_s=ESCALATE_AFTER_S,
                on_signal=on_signal, on_tick=on_tick, tick_s=0.25,
                on_log=lambda line: log.write("supervisor", message=line),
                # Until pod-init has asked for its own parent-death signal, it dies with us.
                parent_death_signal=signal.SIGKILL,
            )  # fmt: skip
        restarts.check()  # an attempt that began and ended between two looks
        stalls.finish()  # a stall being looked into when the workers ended
        if joins is not None:
            joins.stop()
        if monitor is not None:
            monitor.terminate()
            monitor.wait()
        survivors = _native.end_children()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return Outcome(code, forwarded, survivors, stalls, joins, warm_ended, join_expired,
                   peer_lost)  # fmt: skip


def _relay(warm: client.WarmLaunch, forwarded: list[int], on_signal: Any, on_tick: Any,
           log: EventLog, out: IO[str]) -> tuple[int, str]:  # fmt: skip
    """A warm launch supervised from here: its status, and why it ended
    early when the warm interpreter went away ("" when it did not)."""

    def on_warm_signal(sig: int) -> None:
        # The line pod-init says for a cold launch.
        name = signal.Signals(sig).name.removeprefix("SIG")
        escalates = sig in client.ESCALATING and not any(s in client.ESCALATING for s in forwarded)
        if not on_signal(sig):
            return  # this process's own TERM: why was said where it was sent
        then = f"; KILL in {GUARD_GRACE_S:g} s if it has not ended" if escalates else ""
        say(f"pyinit run: forwarded {name} to torchrun's agent (pid {warm.agent_pid}){then}",
            out)  # fmt: skip

    try:
        code = client.relay(warm, sorted(SUPERVISED - {signal.SIGCHLD}), on_warm_signal, on_tick,
                            tick_s=0.25, grace_s=GUARD_GRACE_S)  # fmt: skip
    except client.WarmEnded as ended:
        say(f"pyinit run: {ended}", out)
        log.write("warm_ended", reason=str(ended))
        return EXIT_FAILURE, str(ended)
    return code, ""


def _hand_over(plan: Plan, out: IO[str]) -> client.WarmLaunch | None:
    """The agent forked by the user's warm interpreter, if one runs and
    matches this launch; otherwise None, after one line saying why not."""
    handed = boottime()
    store_fd = plan.rendezvous.listening.fileno() if plan.rendezvous.listening else None
    env = {k: v for k, v in plan.env.items() if k != store.FD_ENV}
    warm = client.hand_over(plan.command[len(AGENT_START) :], env, plan.preloads, store_fd,
                            store.FD_ENV, _taken_stop)  # fmt: skip
    if isinstance(warm, str):
        say(f"pyinit run: starting cold: {warm}", out)
        plan.log.write("warm", used=False, reason=warm)
        return None
    if warm is not None:
        # A warm interpreter still importing makes the launch wait: that is not the handoff.
        waited = max(0.0, warm.imported[1] - handed)
        plan.log.write("warm", used=True, pid=warm.warm_pid, agent_pid=warm.agent_pid,
                       handoff_s=round(warm.forked_at - handed - waited, 6),
                       waited_for_imports_s=round(waited, 6))  # fmt: skip
        # When its imports were done: under PID 1, beside the boot's steps.
        plan.log.phase("warm imports", *warm.imported, pid=warm.warm_pid)
    return warm


def _taken_stop() -> int:
    """A TERM, INT or HUP that came (blocked, so pending) while the launch
    waited for its warm interpreter, taken so that nothing forwards it
    later; 0 when none came."""
    info = signal.sigtimedwait(client.ESCALATING, 0)
    return info.si_signo if info is not None else 0


def _start_warm(config: RunConfig, log: EventLog, out: IO[str]) -> None:
    """A warm interpreter with this run's preloads, unless one runs already:
    started, not waited for. This launch is handed to it (waiting for its
    imports, as the cold agent would have waited for its own) and so is the
    next. Said every time when asked (--keep-warm), the first time only when
    not (a mark in the socket's folder)."""
    try:
        running = client.connect()  # bound, whether or not its imports are done
        if running is not None:
            running.close()
            return
        # pyinit run's own environment: the run's additions are per launch.
        code, said = client.start(config.preloads, protocol.DEFAULT_IDLE_TIMEOUT_S,
                                  wait_ready=False, until_compiled=True)  # fmt: skip
        if code:
            say(f"pyinit run: no warm interpreter for the next launch: {said}", out)
            return
        log.write("warm_started", asked=config.leave_warm == "asked")
        noted = protocol.folder() / protocol.NOTED_NAME
        if config.leave_warm == "asked":
            say("pyinit run: a warm interpreter is starting for this launch and the next "
                "(pyinit warm status)", out)  # fmt: skip
        elif not noted.exists():
            idle = protocol.DEFAULT_IDLE_TIMEOUT_S / 60
            say(f"pyinit run: a warm interpreter stays on this node for the next launch, "
                f"until {idle:g} min without one (pyinit warm stop ends it; --cold or "
                f"PYINIT_WARM=off never use one)", out)  # fmt: skip
            noted.touch()
    except (OSError, ValueError):
        pass  # a folder or socket that cannot be used: the handoff says so, once


def conclude(plan: Plan, outcome: Outcome, out: IO[str]) -> int:
    """The run's status and its end event: who failed first, stalls here and
    on other nodes, nodes that are gone."""
    config, log, liveness, nodes = plan.config, plan.log, plan.liveness, plan.nodes
    stalls, forwarded = outcome.stalls, outcome.forwarded
    failures = failure_records(plan.status_dir)
    status = _exit_status(outcome.code, forwarded, failures[0] if failures else None)
    if (outcome.join_expired or outcome.peer_lost) and status != 0 and not forwarded:
        # As torchrun's rendezvous timeout on the nodes inside it; and not 143, nor
        # the first rank's, for workers this process ended.
        status = EXIT_FAILURE
    if status != 0 and config.stall_timeout > 0 and liveness is not None:
        # A stalled node's workers were ended: ours may have failed on the broken
        # connection before the next poll. Its verdict is still being served. A
        # stall found here with every rank waiting has its cause on another node,
        # which finds the same stall about when this one does and may still be
        # gathering its stacks: it is asked again until every node has spoken.
        deadline = time.monotonic() + CAUSE_WAIT_S
        while True:
            # Taken first: every verdict it counts has been handed on, and is checked below.
            spoke = liveness.all_spoke(nodes.addresses, nodes.rank)
            for verdict in liveness.new_peer_stalls(nodes.addresses, nodes.rank):
                stalls.peer_stall(verdict)
            stalls.check()
            if spoke or not stalls.cause_elsewhere() or time.monotonic() >= deadline:
                break
            time.sleep(CAUSE_ASK_S)
    if status != 0 and (stalls.stalls or stalls.peer_stalls) and not forwarded:
        status = EXIT_STALLED  # the workers were ended for a stall, and not restarted
    fields: dict[str, Any] = {"status": status, "torchrun_status": outcome.code,
                              "survivors_killed": outcome.survivors, "stalls": stalls.stalls,
                              "peer_stalls": stalls.peer_stalls, "failures": failures}  # fmt: skip
    if failures and not forwarded and status not in (0, EXIT_STALLED) and not outcome.peer_lost:
        first = failures[0]
        say(f"pyinit run: rank {first['rank']} failed first ({_how(first)})", out)
    hung = [r["rank"] for r in failures if _written(teardown_path(plan.status_dir, r["rank"]))]
    if hung:
        fields["teardown_hung"] = hung
    for rank in hung:
        say(f"pyinit run: rank {rank} failed and its interpreter did not end within "
            f"{TEARDOWN_S:g} s; it was ended (its threads then: "
            f"{teardown_path(plan.status_dir, rank)})", out)  # fmt: skip
    joins = outcome.joins
    if status != 0 and joins is not None and not joins.has_joined() and not forwarded:
        if outcome.join_expired:  # named then
            fields["not_joined"] = joins.missing_at_limit
        else:
            fields["not_joined"] = joins.missing()
            say(f"pyinit run: {named(fields['not_joined'])} did not join within "
                f"{config.join_timeout:g} s (--join-timeout)", out)  # fmt: skip
    elif status != 0 and liveness is not None:
        lost = liveness.unreachable(nodes.addresses, nodes.rank)
        fields["unreachable_nodes"] = [
            {"rank": r, "name": nodes.names[r], "address": nodes.addresses[r]} for r in lost
        ]
        for r in lost:
            say(f"pyinit run: node {r} ({nodes.names[r]}) is gone", out)
    if outcome.warm_ended:
        fields["warm_ended"] = outcome.warm_ended
    log.write("end", **fields)
    if liveness is not None and status == 0:
        # Said before this node stops answering, or the others take it for gone.
        liveness.end_well(nodes.count - 1, LIVENESS_LINGER_S)
    elif liveness is not None:
        # The other nodes are checking who is gone right now, or will as they end:
        # stay reachable a moment, saying this run ended.
        liveness.end_failed()
        time.sleep(LIVENESS_LINGER_S)
    details = plan.folder / AGENT_LOG
    if status != 0 and not failures and not forwarded and not fields.get("not_joined") and not (
            stalls.stalls or stalls.peer_stalls) and not outcome.warm_ended and not (
            outcome.peer_lost):  # fmt: skip
        # No worker failed: the agent did, before or between them; its last word says why.
        said = _last_line(details)
        if said:
            say(f"pyinit run: torchrun's agent failed: {said}", out)
    where = f"; torchrun's own log: {details}" if status != 0 and details.exists() else ""
    say(f"pyinit run: exited with status {status}{where}", out)
    return status


def _written(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _last_line(path: Path) -> str:
    """The last line of a log that is not blank, or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def failure_records(status_dir: Path) -> list[dict[str, Any]]:
    """Every failed worker, earliest first (torchrun's rule for the root
    cause): the script's own records (rank, pid, exit, time) and the agent's
    for workers that could not write one (killed by a signal), one per rank."""
    by_rank: dict[int, dict[str, Any]] = {}
    agent = status_dir / FAILURES_FILE
    if agent.exists():
        for record in json.loads(agent.read_text()):
            by_rank[record["rank"]] = record
    for path in status_dir.glob("rank-*.json"):
        record = json.loads(path.read_text())
        if record["exit"] != 0:
            # The script's own word wins: torchrun reports any failed worker as 1.
            by_rank[record["rank"]] = {**by_rank.get(record["rank"], {}), **record,
                                       "signal": None}  # fmt: skip
    return sorted(by_rank.values(), key=lambda r: (r.get("time") or 0.0, r["rank"]))


def _how(record: dict[str, Any]) -> str:
    where = f"pid {record['pid']}, " if record.get("pid") else ""
    if record.get("signal"):
        return f"{where}killed by {record['signal']}"
    return f"{where}exit status {record['exit']}"


def _nccl_tuning(node: Any, env: Mapping[str, str], log: EventLog, out: IO[str]) -> tuple[Any, str]:
    """The cached NCCL tuning for this node and its file, or (None, "") after
    one line saying why NCCL chooses alone (in the event log only on a node
    of one GPU, where the line's advice, --tune, has nothing to time)."""
    from pyinit.nccl.tuning_cache import cache_dir, for_run

    if node.nvml is None:
        return None, ""  # no driver view: no key to look the node up by
    if "NCCL_TUNER_PLUGIN" in env:
        why = f"NCCL_TUNER_PLUGIN is set ({env['NCCL_TUNER_PLUGIN']})"
    else:
        tuning, why = for_run(node.topology, node.nvml, cache_dir(env))
        if tuning is not None:
            return tuning, why
    if len(node.nvml.gpus) > 1:
        say(f"pyinit run: NCCL tuning not used: {why}", out)
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


def _exit_status(code: int, forwarded: list[int], first: dict[str, Any] | None) -> int:
    """The run's status: 128+N when it forwarded signal N, else the first
    failing worker's (the script's own status, or 128+N for a worker signal N
    killed; torchrun reports any failure as 1), else torchrun's."""
    if forwarded:
        return 128 + forwarded[0]
    if code == 0:
        return 0
    if first is None:
        return code
    if first.get("signal"):
        return 128 + signal.Signals[first["signal"]].value
    return int(first["exit"])


class _RestartWatch:
    """Logs a restart event for every new attempt mark pyinit.worker leaves."""

    def __init__(self, status_dir: Path, log: EventLog):
        self._status_dir = status_dir
        self._log = log
        self.attempts_seen = 0  # attempts whose workers have started: 0 before the first

    def check(self) -> None:
        seen = len(list(self._status_dir.glob("attempt-*")))
        for attempt in range(max(self.attempts_seen, 1), seen):
            self._log.write("restart", attempt=attempt)
        self.attempts_seen = max(self.attempts_seen, seen)
