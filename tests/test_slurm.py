"""pod-init under a real SLURM: Debian's slurmctld, slurmd and munge, each node
in its own network and UTS namespace on this machine (tests/slurm_cluster.py).
A job of several nodes trains with `pyinit run` taking nodes, ranks and the
master from SLURM's variables; `pyinit check --slurm-drain` as the nodes'
HealthCheckProgram drains a sick node with its summary line and jobs go
elsewhere; scancel ends every node's workers and the event logs say why; eight
nodes join one job, and when one dies the other seven name it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE, TINY
from conftest import run_events as events
from slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.root, pytest.mark.slow]


def need_slurm() -> None:
    if os.geteuid() != 0:
        pytest.skip("SLURM's daemons and namespaces need root (CI runs as root)")
    missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch", "nsenter")
               if shutil.which(t) is None]  # fmt: skip
    if missing:
        pytest.skip(f"no {', '.join(missing)} (./bootstrap test installs slurmctld slurmd munge)")


def job_script(folder: Path, pyinit_bin: Path, shards: Path, steps: int, nodes: int,
               options: str = "", script_options: str = "", step: str = "",
               refused_step: str = "") -> Path:  # fmt: skip
    """A batch job: one pyinit run per node through srun (with `step`, srun's
    options for a step on part of the job's nodes), each with its run folder.
    With `refused_step`, srun's options for a step before it that pyinit run
    is expected to refuse, and a line with that step's status."""
    script = folder / "job.sh"
    runs = folder / "runs"
    command = (f"exec {pyinit_bin} run --nproc-per-node 1 --run-dir {runs}/$SLURMD_NODENAME "
               f"{options} -- {EXAMPLE} --data {shards} --steps {steps} {' '.join(TINY)} "
               f"{script_options}")  # fmt: skip
    refused = f"srun {refused_step} sh -c '{command}'; echo \"refused step: $?\"\n"
    script.write_text(
        "#!/bin/sh\n"
        f"#SBATCH --nodes={nodes} --ntasks-per-node=1 --output={folder}/job-%j.out\n"
        'echo "job id: $SLURM_JOB_ID"\n'
        f"{refused if refused_step else ''}"
        f"srun {step} sh -c '{command}'\n"
    )
    return script


def run_job(cluster: SlurmCluster, script: Path) -> str:
    """The output of the batch job `script`, run to its end, which must be a success."""
    done = cluster.run("sbatch", "--wait", "--parsable", script, check=False)
    output = next(script.parent.glob("job-*.out")).read_text()
    assert done.returncode == 0, output[-3000:]
    return output


def job_port(output: str) -> int:
    """The store's port of the job whose output this is (its script echoes its id)."""
    job = int(output.split("job id: ", 1)[1].split()[0])
    return 15000 + 2 * (job % 5000)


def wait_for_steps(folder: Path, seconds: float) -> str:
    """The job's output, once rank 0 has logged a step."""
    deadline = time.monotonic() + seconds
    output = ""
    while "step " not in output:
        assert time.monotonic() < deadline, f"training did not start: {output[-2000:]}"
        time.sleep(0.5)
        output = "".join(p.read_text() for p in folder.glob("job-*.out"))
    return output


def wait_until_gone(cluster: SlurmCluster, job: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip():
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.5)


def processes(cluster: SlurmCluster, node: int) -> list[tuple[int, str]]:
    """(pid, command name) of everything running in the node's namespace."""
    found = []
    for pid in cluster.run("ip", "netns", "pids", cluster.namespaces[node]).stdout.split():
        with contextlib.suppress(FileNotFoundError):
            found.append((int(pid), Path(f"/proc/{pid}/comm").read_text().strip()))
    return found


def test_a_three_node_job_trains(pyinit_bin, shards, tmp_path):
    need_slurm()
    with SlurmCluster(tmp_path / "slurm", 3) as cluster:
        output = run_job(cluster, job_script(tmp_path, pyinit_bin, shards, steps=10, nodes=3))
    assert "all-reduce: sum 6 over 3 ranks, expected 6" in output
    assert "step    10" in output
    for rank, name in enumerate(cluster.names):
        start = events(tmp_path / "runs" / name)[0]
        # Nodes, this node's rank and the master all from SLURM: no hostfile.
        assert start["nodes"]["source"] == "slurm" and start["nodes"]["rank"] == rank
        assert start["nodes"]["names"] == cluster.names
        assert start["nodes"]["addresses"] == cluster.addresses
        assert start["nodes"]["listen"] == cluster.addresses[rank]
        spawn = next(e for e in events(tmp_path / "runs" / name) if e["event"] == "spawn")
        endpoint = spawn["command"][spawn["command"].index("--rdzv-endpoint") + 1]
        # The master's address, resolved once: torch's workers ask no name server either.
        # The job's own port: jobs sharing a node do not both take 29500.
        assert endpoint == f"{cluster.addresses[0]}:{job_port(output)}"


def test_a_step_on_part_of_a_job_trains_where_each_node_maps_its_own_name_to_loopback(
    pyinit_bin, shards, tmp_path
):
    # Debian's installer writes "127.0.1.1 HOSTNAME" into /etc/hosts, so a node's own
    # name resolves to a loopback address on that node and to its real one elsewhere.
    # A store, liveness port or gloo bound there is out of the other nodes' reach.
    # The step runs on nodes 1 and 2 of the three: SLURM_NODEID counts the step's.
    need_slurm()
    with SlurmCluster(tmp_path / "slurm", 3, debian_hosts=True) as cluster:
        # 30 steps of 0.5 s: past the 10 s after which an unanswering node is lost.
        output = run_job(cluster, job_script(tmp_path, pyinit_bin, shards, steps=30, nodes=3,
                                             options="--join-timeout 60",
                                             script_options="--slow-data 0.5",
                                             step="-N 2 -n 2 --relative 1",
                                             refused_step="-N 2 -n 3 --relative 1"))  # fmt: skip
    # Two tasks on one node, which would take the same node rank: each of the three
    # tasks says why, before any of them listens or starts anything.
    crowded = (
        "pyinit: this job step runs 2 tasks on node 0 (node1) "
        "(SLURM_STEP_TASKS_PER_NODE='2,1'): pyinit run starts a node's ranks itself"
    )
    assert output.count(crowded) == 3 and "refused step: 2\n" in output, output
    assert "all-reduce: sum 3 over 2 ranks, expected 3" in output
    assert "step    30" in output
    assert not (tmp_path / "runs" / "node0").exists()
    names, addresses = cluster.names[1:], cluster.addresses[1:]
    for rank, name in enumerate(names):
        nodes = events(tmp_path / "runs" / name)[0]["nodes"]
        assert nodes["names"] == names and nodes["rank"] == rank, nodes
        # Its own name is a loopback address; the other's is the other's.
        assert nodes["addresses"][rank] == "127.0.1.1", nodes
        assert nodes["addresses"][1 - rank] == addresses[1 - rank], nodes
        # So it listens on every address, and gloo takes the route's interface.
        assert nodes["listen"] == "" and nodes["interface"], nodes
        if rank == 0:
            rendezvous = next(e for e in events(tmp_path / "runs" / name)
                              if e["event"] == "rendezvous")  # fmt: skip
            port = job_port(output)
            assert rendezvous["listening"] in (f"[::]:{port}", f"0.0.0.0:{port}"), rendezvous
        assert not [e for e in events(tmp_path / "runs" / name) if e["event"] == "node lost"]


def test_a_sick_node_is_drained_with_the_checks_line_and_avoided(pyinit_bin, tmp_path):
    need_slurm()
    flags = tmp_path / "flags"
    flags.mkdir()
    health = tmp_path / "health.sh"
    # The fixture's flag: a node with a file here expects 8 GPUs, finds none: CRITICAL.
    health.write_text(
        "#!/bin/sh\n"
        f"export SLURM_CONF={tmp_path}/slurm/slurm.conf\n"
        f'extra=""; [ -e {flags}/$(hostname) ] && extra="--expect-gpus 8"\n'
        f"exec {pyinit_bin} check --slurm-drain $extra\n"
    )
    health.chmod(0o755)
    (flags / "node1").touch()
    with SlurmCluster(tmp_path / "slurm", 3, health_program=str(health),
                      health_interval=2) as cluster:  # fmt: skip
        deadline = time.monotonic() + 60
        while cluster.node_states()["node1"][0] not in ("drained", "draining"):
            assert time.monotonic() < deadline, cluster.node_states()
            time.sleep(0.5)
        _, reason = cluster.node_states()["node1"]
        assert reason.startswith("POD-INIT CHECK CRITICAL - 1 critical; first: CRITICAL "
                                 "topology GPU_COUNT_LOW"), reason  # fmt: skip
        assert all(cluster.node_states()[n][0] == "idle" for n in ("node0", "node2"))
        # Two nodes asked: the job lands on the healthy two.
        done = cluster.run("srun", "-N2", "hostname")
        assert sorted(done.stdout.split()) == ["node0", "node2"]


def test_scancel_ends_every_node_and_the_logs_say_why(pyinit_bin, shards, tmp_path):
    need_slurm()
    with SlurmCluster(tmp_path / "slurm", 2) as cluster:
        script = job_script(tmp_path, pyinit_bin, shards, steps=100_000, nodes=2)
        job = cluster.run("sbatch", "--parsable", script).stdout.strip()
        wait_for_steps(tmp_path, 300)
        cluster.run("scancel", job)
        wait_until_gone(cluster, job, 120)
        # Every worker ended with its node's pyinit run: nothing but slurmd is left.
        for node in range(cluster.count):
            names = [name for _, name in processes(cluster, node)]
            assert names == ["slurmd"], names
    for name in cluster.names:
        log = events(tmp_path / "runs" / name)
        signals = [e["signal"] for e in log if e["event"] == "signal"]
        assert signals and signals[0] == "SIGTERM", log[-3:]
        # SLURM stops a job's steps with TERM: 128 + 15, as any program killed by it.
        assert log[-1]["event"] == "end" and log[-1]["status"] == 143, log[-1]
    # torch's SignalException tracebacks and logging errors are the agents' logs' alone.
    output = next(tmp_path.glob("job-*.out")).read_text()
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    assert "pyinit run: exited with status 143" in output


def kill_job_processes(cluster: SlurmCluster, node: int) -> None:
    """Node `node` dies as far as the job can tell: everything in its namespace
    but slurmd and slurmstepd is KILLed."""
    for pid, name in processes(cluster, node):
        if name not in ("slurmd", "slurmstepd"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_eight_nodes_join_and_name_a_killed_one(pyinit_bin, shards, tmp_path):
    need_slurm()
    with SlurmCluster(tmp_path / "slurm", 8) as cluster:
        script = job_script(tmp_path, pyinit_bin, shards, steps=100_000, nodes=8)
        job = cluster.run("sbatch", "--parsable", script).stdout.strip()
        output = wait_for_steps(tmp_path, 400)
        assert "all-reduce: sum 36 over 8 ranks, expected 36" in output
        kill_job_processes(cluster, 7)
        wait_until_gone(cluster, job, 240)
    for name in cluster.names[:7]:
        end = events(tmp_path / "runs" / name)[-1]
        assert end["event"] == "end" and end["status"] != 0, end
        assert end["unreachable_nodes"] == [
            {"rank": 7, "name": "node7", "address": cluster.addresses[7]}
        ], end


def test_the_command_line_cluster_leaves_nothing_running(tmp_path):
    """`slurm_cluster.py down` once left the munged that `up` had started."""
    import subprocess
    import sys

    need_slurm()

    def munged_running() -> bool:
        return subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0

    before = munged_running()
    script = Path(__file__).parent / "slurm_cluster.py"
    up = subprocess.run([sys.executable, script, "up", "1", tmp_path], capture_output=True,
                        text=True, timeout=120)  # fmt: skip
    assert up.returncode == 0, up.stderr[-2000:]
    assert up.stdout.startswith("export SLURM_CONF=")
    down = subprocess.run([sys.executable, script, "down", tmp_path], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr[-2000:]
    for pid in json.loads((tmp_path / "cluster.json").read_text())["pids"]:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        )
    assert munged_running() == before
