"""`pyinit run --stall-timeout`: a rank that stops stepping while its process
lives is named within the timeout, with every rank's stack, and the worker
group ends (or restarts); two gloo ranks on CPU, rank 1 stopping at step 5."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import NODES, run_events

from pyinit.errors import EXIT_STALLED
from pyinit.run.flight_recorder import read_flight_recorder
from pyinit.run.stall import locate
from pyinit.runlog.events import process_alive

JOB = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    import pyinit.worker

    how = sys.argv[1]
    if how == "closes":  # a daemon's habit: its own files on the numbers of what it inherited
        os.closerange(3, 1 << 16)
        mine = [open(f"mine-{os.environ['RANK']}-{i}", "w") for i in range(40)]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stalling = int(os.environ.get("STALL_RANK", "1"))
    weight = torch.zeros(4)
    first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    for step in range(1, 31):
        if rank == stalling and step == 6 and first_attempt:
            if how == "mute":  # asleep, and deaf to the stack request: the watch waits it out
                import signal
                from pyinit.runlog.progress import STACK_SIGNAL
                signal.signal(STACK_SIGNAL, signal.SIG_IGN)
                time.sleep(3600)
            if how in ("sleep", "closes"):
                time.sleep(3600)  # the stall: asleep in the loop
            while True:  # the stall: busy, never reaching the all-reduce rank 0 waits in
                pass
        grad = torch.ones(4)
        dist.all_reduce(grad)
        weight -= 0.1 * grad  # no torch optimizer here: the script marks its steps
        pyinit.worker.step()
        time.sleep(0.05)
    print(f"rank {rank} done after {step} steps", flush=True)
""")
SLEEP_LINE = next(i for i, line in enumerate(JOB.splitlines(), 1) if "asleep in the loop" in line)


def run_job(pyinit_bin, tmp_path, how, *options):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.run(
        [pyinit_bin, "run", "--nproc-per-node", "2", "--monitor-interval", "0", "--run-dir",
         tmp_path / "run", *options, "--", script, how],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip


def events(tmp_path):
    return run_events(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sleep", "closes"])
def test_a_sleeping_rank_is_named_with_its_stack_and_the_run_ends(pyinit_bin, tmp_path, how):
    """Also where the script closed every descriptor it inherited and opened
    its own on those numbers: the stacks still come to the watch, and none
    lands in the script's files."""
    done = run_job(pyinit_bin, tmp_path, how, "--stall-timeout", "10")
    assert done.returncode == EXIT_STALLED, done.stderr[-3000:]
    log = events(tmp_path)
    stall = next(e for e in log if e["event"] == "stall")
    end = next(e for e in log if e["event"] == "end")
    ranks = {r["rank"]: r for r in stall["ranks"]}
    # Rank 1 stopped outside any collective: the cause; rank 0 waits for it in all_reduce.
    assert stall["causes"] == [1] and stall["waiting"] == [0]
    assert (
        ranks[1]["collective"] is None and ranks[1]["where"] == f"job.py:{SLEEP_LINE} in <module>"
    )
    assert ranks[0]["collective"] == "all_reduce"
    assert ranks[0]["last_step"] == ranks[1]["last_step"] == 5
    # Found within the timeout and a tick, ended within seconds of that.
    assert 10 <= ranks[1]["seconds_since_step"] < 11
    assert ranks[1]["seconds_since_beat"] < 3  # asleep with the GIL released: it still beats
    assert end["boottime"] - stall["boottime"] < 10 and end["status"] == EXIT_STALLED
    stack = (Path(stall["folder"]) / "stack-rank1.txt").read_text()
    assert f'job.py", line {SLEEP_LINE} in <module>' in stack
    assert "all_reduce" in (Path(stall["folder"]) / "stack-rank0.txt").read_text()
    assert "rank 1 (node 0) made no step for" in done.stderr and "after step 5" in done.stderr
    assert not any(process_alive(r["pid"]) for r in stall["ranks"])  # no process left
    assert all(mine.stat().st_size == 0 for mine in tmp_path.glob("mine-*"))
    assert len(list(tmp_path.glob("mine-*"))) == (80 if how == "closes" else 0)


@pytest.mark.slow
def test_a_signal_is_acted_on_at_once_while_stacks_are_gathered(pyinit_bin, tmp_path):
    """The watch once slept in the supervisor's tick for the stacks (2 s) and
    the flight recorder (10 s), and signals waited; its ticks never block now."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.Popen(
        [pyinit_bin, "run", "--nproc-per-node", "2", "--monitor-interval", "0", "--run-dir",
         tmp_path / "run", "--stall-timeout", "3", "--", script, "mute"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    found = tmp_path / "run" / "stall-1"
    deadline = time.monotonic() + 120
    while not found.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    sent = time.clock_gettime(time.CLOCK_BOOTTIME)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    forwarded = next(e for e in events(tmp_path) if e["event"] == "signal")
    assert forwarded["signal"] == "SIGTERM"
    assert forwarded["boottime"] - sent < 0.1  # within a tick's work, not the stack wait


@pytest.mark.slow
def test_a_stalled_group_is_restarted_within_max_restarts(pyinit_bin, tmp_path):
    done = run_job(pyinit_bin, tmp_path, "spin", "--stall-timeout", "5", "--max-restarts", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    log = events(tmp_path)
    kinds = [e["event"] for e in log]
    assert kinds.count("stall") == 1 and kinds.count("restart") == 1
    assert kinds.index("stall") < kinds.index("restart")
    assert (
        "rank 0 done after 30 steps" in done.stdout and "rank 1 done after 30 steps" in done.stdout
    )
    stall = next(e for e in log if e["event"] == "stall")
    assert stall["causes"] == [1]
    assert next(e for e in log if e["event"] == "end")["stalls"] == 1


def test_where_a_rank_is_comes_from_its_main_thread():
    dump = textwrap.dedent("""\
        Thread 0x00007f (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 331 in wait
          File "/x/site-packages/pyinit/runlog/progress.py", line 86 in beat_forever

        Current thread 0x00007e (most recent call first):
          File "/x/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
          File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2806 in all_reduce
          File "/job/train.py", line 42 in step
          File "/job/train.py", line 60 in <module>
          File "<frozen runpy>", line 88 in _run_code
          File "/x/site-packages/pyinit/run/wrapper.py", line 182 in main
    """)
    where = locate(dump)
    assert where.frame == "train.py:42 in step" and where.collective == "all_reduce"
    assert locate("no dump at all") is None


def test_the_timeout_is_checked_before_anything_starts(pyinit_bin, tmp_path):
    bad = subprocess.run([pyinit_bin, "run", "--stall-timeout", "-3", "--", sys.executable],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--stall-timeout" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_only_this_stalls_flight_recorder_dumps_count(tmp_path):
    """A second stall, or a reused --run-dir, once read the old dumps and could
    name the wrong rank; a user's TORCH_NCCL_DEBUG_INFO_TEMP_FILE was not
    looked at. Dumps there before the stall was found are not its own."""
    from pyinit.run.flight_recorder import FlightRecorder

    recorded = Path(__file__).parent / "data" / "flight-recorder" / "rank_0"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "trace_0").write_bytes(recorded.read_bytes())  # an old dump
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(mine / "trace_")}
    recorder = FlightRecorder.of_run(tmp_path, tmp_path, env)
    before = recorder.stamps()
    assert list(before) == [mine / "trace_0"]
    assert recorder.new_dumps(before) == []
    (mine / "trace_1").write_bytes(recorded.read_bytes())  # this stall's
    assert recorder.new_dumps(before) == [mine / "trace_1"]
    assert recorder.read(recorder.new_dumps(before)).keys() == {1}
    assert read_flight_recorder(recorder.new_dumps(before), "trace_").keys() == {1}


def test_the_flight_recorder_says_who_is_behind(tmp_path):
    """Dumps recorded on a 2xH200 node with NCCL, rank 1 asleep at step 6:
    rank 0 has two all-reduces scheduled that rank 1 never reached."""
    dumps = sorted((Path(__file__).parent / "data" / "flight-recorder").glob("rank_*"))
    traced = read_flight_recorder(dumps)
    assert traced[1].last_seq == 10 and traced[1].pending is None
    assert traced[0].last_seq == 12 and traced[0].pending == "nccl:all_reduce #11"
    # Only plain data is read from a dump: a pickle naming a class is refused.
    hostile = tmp_path / "rank_2"
    hostile.write_bytes(pickle.dumps({"entries": [Path("/")]}))
    assert read_flight_recorder([hostile]) == {}


@pytest.mark.root
@pytest.mark.slow
def test_a_stall_on_one_node_is_named_by_every_node(pyinit_bin, three_namespaces, tmp_path):
    """Three nodes (network namespaces on a bridge), a rank each; node 2's rank
    sleeps at step 5. Every node names it, within the timeout and seconds."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(NODES) + "\n")
    env = dict(os.environ, STALL_RANK="2")
    procs = []
    for ns in three_namespaces:
        command = ["ip", "netns", "exec", ns, pyinit_bin, "run", "--hostfile", hostfile,
                   "--nproc-per-node", "1", "--master-port", "29621", "--monitor-interval", "0",
                   "--stall-timeout", "8", "--run-dir", tmp_path / ns, "--", script,
                   "sleep"]  # fmt: skip
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, start_new_session=True))  # fmt: skip
    outputs = [p.communicate(timeout=240) for p in procs]
    for node, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == EXIT_STALLED, f"node {node}: {err[-3000:]}"
        log = run_events(tmp_path / three_namespaces[node])
        # Node 2 finds its own rank outside any collective; nodes 0 and 1 only see
        # their ranks waiting, and learn the cause from node 2's liveness port.
        named = {(e["node"], rank) for e in log if e["event"] == "stall" for rank in e["causes"]}
        named |= {(e["peer"]["node"], cause["rank"]) for e in log if e["event"] == "peer_stall"
                  for cause in e["peer"]["causes"]}  # fmt: skip
        assert (2, 2) in named, f"node {node} did not name rank 2: {log[-6:]}"
        assert "stall" in err
        end = next(e for e in log if e["event"] == "end")
        first = next(e for e in log if e["event"] in ("stall", "peer_stall"))
        assert end["boottime"] - first["boottime"] < 15
