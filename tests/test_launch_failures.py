"""What `pyinit run` says when the launch goes wrong: a taken port is one line
before anything starts, one node's store is on the loopback on a free port
(two runs on one machine do not collide), a missing node is waited for aloud
and named at --join-timeout, and torch's own tracebacks go to agent.log while
the script's own reach the terminal."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import run_events as events

RUN = ("run", "--monitor-interval", "0")


def pyinit_run(pyinit_bin, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([pyinit_bin, *RUN, *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def free_port_pair() -> int:
    """A loopback port free with the one after it: a run's store and its
    liveness port. Tests that run at once must not share 29500."""
    while True:
        with socket.socket() as store, socket.socket() as liveness:
            store.bind(("127.0.0.1", 0))
            port = store.getsockname()[1]
            try:
                liveness.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def missing_node_args(tmp_path, join_timeout: int) -> list:
    """`pyinit run`'s arguments for a run on this node and one that never comes."""
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n192.0.2.99\n")
    # A machine without GPUs: on one with them, NCCL's files would refuse a master on
    # the loopback (other nodes could not reach it), before the wait this is about.
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    return ["--hostfile", hostfile, "--master-port", str(free_port_pair()),
            "--join-timeout", str(join_timeout), "--preflight", "off",
            "--sysfs-root", tmp_path / "sys", "--run-dir", tmp_path / "run", "--",
            script]  # fmt: skip


def test_a_taken_port_is_one_line_and_nothing_starts(pyinit_bin, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = pyinit_run(pyinit_bin, "--master-port", str(port), "--run-dir", tmp_path / "run",
                            "--", script)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr == (f"pyinit: cannot listen on 127.0.0.1:{port} for the rendezvous "
                             "store: Address already in use (another run holds it: choose "
                             "another with --master-port, or leave it out on a single node "
                             "for a free one)\n")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_two_single_node_runs_share_a_machine(pyinit_bin, tmp_path):
    """Each takes a free loopback port for its store: neither holds 29500 or
    listens beyond the loopback."""
    script = tmp_path / "group.py"
    script.write_text("import time, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "dist.barrier()\ntime.sleep(2)\n")  # fmt: skip
    runs = [subprocess.Popen([pyinit_bin, "run", "--nproc-per-node", "2", "--monitor-interval",
                              "0", "--run-dir", tmp_path / f"run{i}", "--", script],
                             stderr=subprocess.PIPE, text=True) for i in range(2)]  # fmt: skip
    for run in runs:
        _, err = run.communicate(timeout=180)
        assert run.returncode == 0, err[-3000:]
    endpoints = [next(e for e in events(tmp_path / f"run{i}") if e["event"] == "rendezvous")
                 for i in range(2)]  # fmt: skip
    hosts = {e["endpoint"].rsplit(":", 1)[0] for e in endpoints}
    ports = {e["endpoint"].rsplit(":", 1)[1] for e in endpoints}
    assert hosts == {"127.0.0.1"} and len(ports) == 2 and "29500" not in ports


def test_a_missing_node_is_waited_for_aloud_and_named(pyinit_bin, tmp_path):
    began = time.monotonic()
    result = pyinit_run(pyinit_bin, *missing_node_args(tmp_path, 8))
    took = time.monotonic() - began
    assert result.returncode == 1, result.stderr[-3000:]
    assert "pyinit run: waiting for node 1 (192.0.2.99) to join" in result.stderr
    lines = result.stderr.splitlines()
    why = lines.index("pyinit run: node 1 (192.0.2.99) did not join within 8 s (--join-timeout): "
                      "ending this node's workers")  # fmt: skip
    # The TERM that ends the agent is this run's own: why comes first, and once.
    assert not any("forwarded TERM" in line for line in lines[:why]), result.stderr[-3000:]
    assert result.stderr.count("did not join") == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and took < 60, (took, result.stderr[-3000:])
    assert result.stderr.rstrip().splitlines()[-1].startswith("pyinit run: exited with status 1")
    end = events(tmp_path / "run")[-1]
    assert end["not_joined"] == ["node 1 (192.0.2.99)"]


def test_a_join_timeout_ends_the_run_beside_a_thread_started_before_it(tmp_path):
    """The run ends itself with a TERM to the thread that waits for it: sent
    to the process, it could go to a thread that did not block it, whose
    default action killed pyinit run (on an H200 node, the test above ended
    with -15)."""
    launch = ("import sys, threading, time\n"
              "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
              "from pyinit.cli import run_cli\n"
              "sys.argv[0] = 'pyinit'\n"
              "sys.exit(run_cli())\n")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", launch, *RUN, *missing_node_args(tmp_path, 3)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "pyinit run: node 1 (192.0.2.99) did not join within 3 s (--join-timeout)" in (
        result.stderr)  # fmt: skip


@pytest.mark.slow
def test_a_node_that_answers_but_never_joins_is_named(pyinit_bin, tmp_path):
    """Every node's pyinit run answers on its liveness port, but node 1's agent
    never reaches the rendezvous (a preload that hangs): node 0 names node 1,
    not 'every node', and node 1 ends its own agent at the join timeout
    rather than waiting for the preload."""
    from conftest import namespaces, node_addresses

    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    (tmp_path / "slow_preload.py").write_text("import time\ntime.sleep(3600)\n")
    hostfile = tmp_path / "hosts"
    addresses = node_addresses(2)
    hostfile.write_text("\n".join(addresses) + "\n")
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)  # no GPUs, no NCCL files
    with namespaces(2) as names:
        procs = []
        for rank, ns in enumerate(names):
            held = ["--preload", "slow_preload"] if rank == 1 else []
            command = ["ip", "netns", "exec", ns, "env", f"PYTHONPATH={tmp_path}", pyinit_bin,
                       "run", "--cold", "--hostfile", hostfile, "--join-timeout", "12",
                       "--preflight", "off", "--sysfs-root", tmp_path / "sys", "--master-port",
                       "29631", "--monitor-interval", "0", *held, "--run-dir",
                       tmp_path / f"run{rank}", "--", script]  # fmt: skip
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        began = time.monotonic()
        outputs = [proc.communicate(timeout=180) for proc in procs]
        waited = time.monotonic() - began
    node0, node1 = (err for _out, err in outputs)
    assert procs[0].returncode == 1, node0[-3000:]
    named = f"node 1 ({addresses[1]})"
    assert f"pyinit run: {named} did not join within 12 s (--join-timeout)" in node0, node0
    assert f"waiting for {named} to join (its pyinit run answers; its agent has not reached " \
           "the rendezvous)" in node0, node0  # fmt: skip
    assert events(tmp_path / "run0")[-1]["not_joined"] == [named]
    assert f"node 1 ({addresses[1]}, this node) did not join" in node1, node1[-3000:]
    assert procs[1].returncode == 1 and waited < 120, (waited, node1[-3000:])
    end = events(tmp_path / "run1")[-1]
    assert end["not_joined"] and end["torchrun_status"] == 128 + signal.SIGTERM, end


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_the_script_s_traceback_shows_and_torch_s_goes_to_the_log(pyinit_bin, tmp_path, start):
    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('boom in the script')\n")
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--worker-start", start, "--run-dir",
                        tmp_path / "run", "--", script)  # fmt: skip
    assert result.returncode == 1
    assert "ValueError: boom in the script" in result.stderr
    assert "ChildFailedError" not in result.stderr and "torch/distributed" not in result.stderr
    assert result.stderr.count("ValueError: boom in the script") == 1
    agent_log = tmp_path / "run" / "agent.log"
    assert "ChildFailedError" in agent_log.read_text()
    assert result.stderr.rstrip().splitlines()[-1] == (
        f"pyinit run: exited with status 1; torchrun's own log: {agent_log}")  # fmt: skip
