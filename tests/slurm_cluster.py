"""A real SLURM cluster on one machine, for tests and for trying pod-init
with SLURM: Debian's slurmctld, one slurmd per node, each node in its own
network namespace (its address on a bridge) and UTS namespace (its host
name), and munge for their credentials. Root only.

    python tests/slurm_cluster.py up 3 /tmp/slurm     # prints the SLURM_CONF to export
    python tests/slurm_cluster.py down /tmp/slurm

The controller listens on the bridge (10.78.T.1), on a free port of its own;
node i is `node{i}` at 10.78.T.(i + 2), with a hosts file bind-mounted over
/etc/hosts in its mount namespace, so job steps resolve the nodes' names as a
real cluster's would.
With `debian_hosts`, each node's file first maps the node's own name to
127.0.1.1, the line Debian's installer writes for the host's name.
Job steps run as root, tracked by process (proctrack/linuxproc), no cgroups.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import netns
from netns import free_port

SETS = itertools.count()


class SlurmCluster:
    def __init__(self, folder: Path, count: int, health_program: str | None = None,
                 health_interval: int = 0, subnet: int | None = None,
                 debian_hosts: bool = False):  # fmt: skip
        self.folder = Path(folder)
        self.count = count
        self.health_program = health_program
        self.health_interval = health_interval
        self.subnet = subnet if subnet is not None else 78 + next(SETS) % 100
        self.debian_hosts = debian_hosts
        self.tag = f"sl{os.getpid() % 10000}x{self.subnet}"
        # The controller's port, one of its own: a controller left by a run that
        # was killed holds the default (6817) on every address.
        self.port = free_port("")
        self.names = [f"node{i}" for i in range(count)]
        self.addresses = [f"10.{self.subnet}.0.{i + 2}" for i in range(count)]
        self.controller = f"10.{self.subnet}.0.1"
        self.namespaces = [f"{self.tag}n{i}" for i in range(count)]  # as netns names them
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []
        self._munged = False
        self.spool: Path | None = None

    # --- bring-up ---------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """The cluster started, every node up; on failure, nothing of it left."""
        try:
            self._start()
        except BaseException:
            self.down()
            raise

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # slurmstepd makes its Unix sockets in the spool folder, and a path past
        # 108 bytes (a deep test folder) fails every job step: a short one of its own.
        self.spool = Path(tempfile.mkdtemp(prefix="slurm-spool-"))
        for sub in ("state", "logs"):
            (self.folder / sub).mkdir(exist_ok=True)
        self._start_munge()
        netns.add_nodes(self.tag, self.addresses, bridge_address=self.controller)
        hosts = ["127.0.0.1 localhost", f"{self.controller} ctl"]
        hosts += [f"{a} {n}" for a, n in zip(self.addresses, self.names, strict=True)]
        (self.folder / "hosts").write_text("\n".join(hosts) + "\n")
        for name in self.names:
            own = [f"127.0.1.1 {name}"] if self.debian_hosts else []
            lines = hosts[:1] + own + hosts[1:]
            (self.folder / f"hosts-{name}").write_text("\n".join(lines) + "\n")
        self.conf.write_text(self.config())
        self._daemons.append(self._spawn(None, "ctl", "slurmctld"))
        for ns, name in zip(self.namespaces, self.names, strict=True):
            self._daemons.append(self._spawn(ns, name, "slurmd"))
        self.wait_for(lambda states: all(s in ("idle", "drained", "draining") for s in states),
                      "every node up")  # fmt: skip

    def config(self) -> str:
        d = self.folder
        lines = [
            "ClusterName=podinit",
            f"SlurmctldHost=ctl({self.controller})", f"SlurmctldPort={self.port}",
            "AuthType=auth/munge", "CredType=cred/munge",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/logs/slurmctld.log", f"SlurmdLogFile={d}/logs/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "SelectType=select/linear",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "KillWait=10", "SlurmctldTimeout=30", "SlurmdTimeout=30",
            f"NodeName={','.join(self.names)} NodeAddr={','.join(self.addresses)} CPUs=2 "
            "State=UNKNOWN",
            f"PartitionName=debug Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE "
            "State=UP",
        ]  # fmt: skip
        if self.health_program:
            lines += [f"HealthCheckProgram={self.health_program}",
                      f"HealthCheckInterval={self.health_interval}",
                      "HealthCheckNodeState=ANY"]  # fmt: skip
        return "\n".join(lines) + "\n"

    def _start_munge(self) -> None:
        socket = Path("/run/munge/munge.socket.2")
        if socket.exists() and subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
        self._munged = True

    def _spawn(self, namespace: str | None, hostname: str, daemon: str) -> subprocess.Popen:
        # Its own host name and /etc/hosts; nsenter keeps the host's mounts
        # (/sys/fs/cgroup among them, which slurmd checks), unlike `ip netns exec`.
        hosts = self.folder / (f"hosts-{hostname}" if namespace else "hosts")
        inner = (f"hostname {hostname} && mount --bind {hosts} /etc/hosts && "
                 f"exec {daemon} -D")  # fmt: skip
        command = ["unshare", "--uts", "--mount", "sh", "-c", inner]
        if namespace:
            command = ["nsenter", f"--net=/run/netns/{namespace}", *command]
        with open(self.folder / "logs" / f"{daemon}-{hostname}.out", "w") as log:
            return subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    # --- use --------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 600,
            **kwargs) -> subprocess.CompletedProcess:  # fmt: skip
        return subprocess.run([str(a) for a in args], env=self.env, capture_output=True,
                              text=True, check=check, timeout=timeout, **kwargs)  # fmt: skip

    def node_states(self) -> dict[str, tuple[str, str]]:
        """Node name -> (state, reason), as sinfo says."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E", check=False).stdout
        states = {}
        for line in out.splitlines():
            name, state, reason = line.split("|", 2)
            states[name] = (state.rstrip("*~#"), reason)
        return states

    def wait_for(self, ready, what: str, timeout: float = 90) -> dict[str, tuple[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if len(states) == self.count and ready([s for s, _ in states.values()]):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"SLURM: waited {timeout} s for {what}; nodes: {states}")
            time.sleep(0.5)

    # --- teardown ---------------------------------------------------------------------

    def down(self) -> None:
        teardown(self._daemons, self.tag, self.count, self.spool)
        if self._munged:
            stop_munged()


def stop_munged() -> None:
    """TERM, and the wait for it to go: the next cluster must not find it half-stopped."""
    subprocess.run(["pkill", "-x", "munged"], capture_output=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)


def teardown(daemons: list, tag: str, count: int, spool: Path | None) -> None:
    """Stops the daemons (Popen objects or pids), then the nodes: what slurmd
    left running in them (job steps) and their network; then the spool folder."""
    for daemon in daemons:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon if isinstance(daemon, int) else daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for daemon in daemons:
        if isinstance(daemon, int):
            while os.path.exists(f"/proc/{daemon}") and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)
        else:
            try:
                daemon.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    netns.remove_nodes(tag, count)
    if spool is not None:
        shutil.rmtree(spool, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start a cluster and leave it running")
    up.add_argument("count", type=int)
    up.add_argument("folder")
    down = sub.add_parser("down", help="stop the cluster started in FOLDER")
    down.add_argument("folder")
    args = parser.parse_args()
    folder = Path(args.folder)
    if args.action == "up":
        cluster = SlurmCluster(folder, args.count, subnet=78)
        cluster.up()
        (folder / "cluster.json").write_text(json.dumps({
            "pids": [d.pid for d in cluster._daemons], "tag": cluster.tag,
            "count": cluster.count, "munged": cluster._munged,
            "spool": str(cluster.spool)}))  # fmt: skip
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    state = json.loads((folder / "cluster.json").read_text())
    teardown(state["pids"], state["tag"], state["count"], Path(state["spool"]))
    if state.get("munged"):  # the munged `up` started, not one that was running before
        stop_munged()
    return 0


if __name__ == "__main__":
    sys.exit(main())
