"""`pyinit run`: the example trains on CPU, exit codes and signals, bad input,
and three nodes in network namespaces joined by a bridge, one of which is
killed mid-run. Namespaces need root; CI runs as root."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import netns
import pytest
from conftest import EXAMPLE, NODES, TINY, node_addresses
from conftest import run_events as events
from test_hostile import children_of

from pyinit.run.agent import WorkerEnds

ROOT = Path(__file__).resolve().parent.parent


def pyinit_run(pyinit_bin, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([pyinit_bin, "run", *args], capture_output=True, text=True,
                          timeout=kwargs.pop("timeout", 240), **kwargs)  # fmt: skip


def test_the_example_trains_on_cpu_and_the_loss_falls(pyinit_bin, shards, tmp_path):
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "2", "--run-dir", tmp_path,
                        "--monitor-interval", "1", "--", EXAMPLE, "--data", shards,
                        "--steps", "40", *TINY)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all-reduce: sum 3 over 2 ranks, expected 3" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["ranks"] == 2
    assert summary["last_tenth_mean_loss"] < summary["first_tenth_mean_loss"] - 0.5, summary
    kinds = [e["event"] for e in events(tmp_path) if e["event"] != "phase"]
    # With GPUs NCCL's events (its files, the tuning used or not) come before the spawn.
    before = [k for k in kinds if not k.startswith("nccl")][:4]
    assert before == ["start", "preflight", "rendezvous", "spawn"]
    assert kinds[-1] == "end"
    spawn = next(e for e in events(tmp_path) if e["event"] == "spawn")
    # torchrun's agent (marked by pyinit.run.agent) forks the workers, torch imported once.
    assert spawn["command"][1:4] == ["-P", "-m", "pyinit.run.agent"]
    at = spawn["command"].index("--start-method")
    assert spawn["command"][at : at + 3] == ["--start-method", "fork", "--run-path"]
    assert spawn["command"][at + 3].endswith("pyinit/run/wrapper.py")
    samples = (tmp_path / "monitor.jsonl").read_text().splitlines()
    assert samples and "block" in json.loads(samples[-1])  # the monitor ran beside
    # Every phase of the run, in order, each rank's own; the forked workers found torch loaded.
    timeline = subprocess.run([pyinit_bin, "timeline", tmp_path, "--json", tmp_path / "t.json"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert timeline.returncode == 0, timeline.stderr
    document = json.loads((tmp_path / "t.json").read_text())
    assert document["missing"] == [] and document["origin"] == "pyinit run start"
    phases = [row["phase"] for row in document["rows"]]
    # The workers were forked with torch loaded: no "import torch" of theirs.
    expected = ["supervisor start", "preflight", "agent start", "agent import torch",
                "agent preload", "rendezvous", "worker start", "process group", "script setup",
                "first forward", "first step", "first backward", "first optimizer step",
                "steps"]  # fmt: skip
    import torch

    gpus = torch.cuda.device_count()
    if gpus:  # the NCCL files, and CUDA's start where each rank has a GPU (the example's order)
        expected[2:2] = ["nccl files"]
    if gpus >= 2:
        expected.insert(expected.index("script setup"), "device init")
    assert phases == expected
    starts = [row["start_s"] for row in document["rows"]]
    assert starts == sorted(starts)
    rows = {row["phase"]: row for row in document["rows"]}
    assert rows["worker start"]["ranks"] == [0, 1] and rows["steps"]["steps"] == 40
    assert rows["agent import torch"]["seconds"] > 0.1
    assert document["first_step_s"] == max(rows["first step"]["rank_ends_s"].values())
    assert "forked with torch loaded: no import" in timeline.stdout


# sys.exit(-1) is status 255 from Python: the launcher named it "exit status -1".
@pytest.mark.parametrize(("code", "status"), [(3, 3), (-1, 255)])
def test_a_script_s_exit_status_is_the_run_s(pyinit_bin, tmp_path, code, status):
    script = tmp_path / "exits.py"
    script.write_text(f"import sys\nsys.exit({code})\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--run-dir", tmp_path, "--", script,
                        env={**os.environ, "TMPDIR": str(scratch)})  # fmt: skip
    assert result.returncode == status, result.stderr[-2000:]
    assert f", exit status {status})\n" in result.stderr
    end = events(tmp_path)[-1]
    assert end["event"] == "end" and end["status"] == status and end["torchrun_status"] == 1
    # torchrun's folders of attempts are the run folder's, not a new one in TMPDIR per run.
    assert list(scratch.glob("torchelastic_*")) == []
    assert list((tmp_path / "torchrun").glob("*/attempt_0"))


# Rank 1 leaves after one all-reduce (status 0: torchrun keeps the group
# running); rank 0's next all-reduce fails in gloo's transport.
LEAVES = """\
import os, torch, torch.distributed as dist
dist.init_process_group('gloo')
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    os._exit(0)
dist.all_reduce(t)
"""


def test_a_rank_whose_peer_went_away_says_so_in_one_line(pyinit_bin, tmp_path):
    """Rank 0 is a casualty: one line on the terminal, its traceback in the
    run folder."""
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "2", "--run-dir", tmp_path, "--", script)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    saved = tmp_path / "status" / "traceback-rank0.txt"
    line = next(x for x in result.stderr.splitlines() if x.startswith("pyinit run: rank 0: "))
    assert re.fullmatch(r"pyinit run: rank 0: a collective failed because another rank is gone "
                        r"\([^)]*Connection (closed|reset) by peer[^)]*\); its traceback: "
                        + re.escape(str(saved)), line), line  # fmt: skip
    text = saved.read_text()
    assert text.startswith("Traceback") and "all_reduce" in text and "leaves.py" in text
    assert "pyinit run: rank 0 failed first (pid " in result.stderr


def test_each_line_of_ours_is_one_write_even_unbuffered(pyinit_bin, tmp_path):
    """With PYTHONUNBUFFERED, print() writes a line and its newline apart: a
    rank killed between them left its line open and the launcher's next line
    was glued to it. A packet pipe keeps each write apart, so the test sees
    every write of the ranks and the launcher as it was made."""
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    read_end, write_end = os.pipe2(os.O_DIRECT)
    writes: list[bytes] = []

    def drain() -> None:  # a packet pipe holds 16 writes: read them as they come
        while chunk := os.read(read_end, 65536):
            writes.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = subprocess.run([pyinit_bin, "run", "--nproc-per-node", "2", "--run-dir", tmp_path,
                               "--", script], stdout=subprocess.DEVNULL, stderr=write_end,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=240)  # fmt: skip
    finally:
        os.close(write_end)
        reader.join(60)
        os.close(read_end)
    assert proc.returncode == 1
    ours = [w.decode() for w in writes if b"pyinit run:" in w]
    assert any(w.startswith("pyinit run: rank 0: a collective failed") for w in ours), ours
    assert any(w.startswith("pyinit run: rank 0 failed first") for w in ours), ours
    for w in ours:
        assert w.startswith("pyinit run: ") and w.endswith("\n") and w.count("\n") == 1, ours


def test_only_a_backend_s_word_for_a_lost_peer_makes_a_rank_a_casualty(tmp_path):
    from pyinit.run.wrapper import peer_gone_line

    saved = tmp_path / "traceback.txt"
    nccl = RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:2000, remote process exited or "
                        "there was a network error, NCCL version 2.28.3")  # fmt: skip
    assert peer_gone_line(nccl, saved).startswith("a collective failed because another rank")
    assert saved.read_text().startswith("RuntimeError: NCCL error in")  # raised, not thrown here
    # The script's own errors keep their traceback on the terminal, whatever they say.
    for own in (RuntimeError("Connection reset by peer"), ConnectionResetError(104, "reset"),
                ValueError("gloo/transport/tcp/pair.cc: Connection closed by peer")):  # fmt: skip
        assert peer_gone_line(own, tmp_path / "not.txt") is None
    assert not (tmp_path / "not.txt").exists()


@pytest.mark.slow
def test_the_earliest_failure_is_the_root_cause_even_when_killed_by_a_signal(pyinit_bin, tmp_path):
    """Rank 1 is killed by SIGKILL (no record of its own) before rank 0 exits 7:
    the run names rank 1 and exits 137, not the lowest rank's 7."""
    script = tmp_path / "two.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(3)\nsys.exit(7)\n"
    )
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "2", "--monitor-interval", "0",
                        "--run-dir", tmp_path, "--", script)  # fmt: skip
    assert result.returncode == 137, result.stderr[-2000:]
    assert "pyinit run: rank 1 failed first (pid " in result.stderr
    assert "killed by SIGKILL)" in result.stderr
    end = events(tmp_path)[-1]
    assert end["failures"][0]["rank"] == 1 and end["failures"][0]["signal"] == "SIGKILL"


def test_options_come_from_the_environment_too(pyinit_bin, tmp_path):
    from pyinit.cli import build_parser
    from pyinit.run.config import config_from_args

    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    env = {"PYINIT_MAX_RESTARTS": "3", "PYINIT_STALL_TIMEOUT": "60", "PYINIT_STANDALONE": "1",
           "PYINIT_NPROC_PER_NODE": "2"}  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        argv = ["run", "--max-restarts", "1", "--", str(script)]
        args = build_parser(argv)[0].parse_args(argv)
        config = config_from_args(args)
    assert (config.max_restarts, config.stall_timeout, config.standalone, config.nproc) == (
        1, 60.0, True, 2)  # fmt: skip
    # A bad value from the environment is one line naming the variable, exit 2.
    refused = [("PYINIT_STANDALONE", "maybe", "PYINIT_STANDALONE='maybe'"),
               ("PYINIT_MAX_RESTARTS", "-1", "--max-restarts: must be"),
               ("PYINIT_WORKER_START", "thread", "--worker-start must be")]  # fmt: skip
    for key, value, message in refused:
        bad = pyinit_run(pyinit_bin, "--run-dir", tmp_path / "run", "--", script,
                         env={**os.environ, key: value})  # fmt: skip
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and not (tmp_path / "run").exists()


def test_an_exception_inside_the_run_still_ends_the_log(tmp_path, monkeypatch):
    """No try/finally once: an exception left no end event and an open log."""
    from pyinit.cli import build_parser
    from pyinit.run import launcher
    from pyinit.run.config import config_from_args

    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    argv = ["run", "--standalone", "--run-dir", str(tmp_path / "run"), "--preflight", "off",
            "--", str(script)]  # fmt: skip
    args = build_parser(argv)[0].parse_args(argv)

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug in launch")

    monkeypatch.setattr(launcher, "launch", broken)
    with pytest.raises(RuntimeError, match="a bug in launch"):
        launcher.run(config_from_args(args))
    end = events(tmp_path / "run")[-1]
    assert end["event"] == "end" and end["error"] == "RuntimeError: a bug in launch"


def test_a_program_worker_forwards_what_pod_init_forwards(tmp_path):
    """A --no-python program once got TERM, INT and HUP only, and its orphans
    went unreaped; it runs under the core's supervisor now, as pod-init's command."""
    program = tmp_path / "program.sh"
    program.write_text("#!/bin/sh\ntrap 'echo got-usr1; exit 9' USR1\necho ready\n"
                       "while :; do sleep 0.05; done\n")  # fmt: skip
    program.chmod(0o755)
    worker = subprocess.Popen([sys.executable, "-m", "pyinit.run.wrapper", tmp_path, "program",
                               program], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert worker.stdout.readline() == "ready\n"
    worker.send_signal(signal.SIGUSR1)
    out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 9 and "got-usr1" in out
    assert json.loads((tmp_path / "rank-0.json").read_text())["exit"] == 9


def test_a_worker_whose_agent_died_before_it_was_up_ends_before_the_script(tmp_path):
    """A spawned worker asked to die with its parent only after its imports:
    if torchrun's agent died meanwhile, the parent it then saw was the
    reaper of orphans, and the script ran on with no agent. The agent names
    itself in the environment; a worker whose parent is not that process ends."""
    from pyinit.torchrun import AGENT_PID_ENV

    script = tmp_path / "script.py"
    ran = tmp_path / "ran"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    gone = subprocess.Popen(["true"])  # the agent, already gone
    gone.wait()
    env = {**os.environ, AGENT_PID_ENV: str(gone.pid)}
    worker = subprocess.run([sys.executable, "-m", "pyinit.run.wrapper", tmp_path, "script",
                             script], env=env, timeout=60)  # fmt: skip
    assert worker.returncode == -signal.SIGKILL and not ran.exists()
    env[AGENT_PID_ENV] = str(os.getpid())  # the agent, alive: the script runs
    worker = subprocess.run([sys.executable, "-m", "pyinit.run.wrapper", tmp_path, "script",
                             script], env=env, timeout=60)  # fmt: skip
    assert worker.returncode == 0 and ran.exists()


def test_restarts_are_events(pyinit_bin, tmp_path):
    script = tmp_path / "flaky.py"
    # Fails on torchrun's first attempt, passes on its restart.
    script.write_text(
        "import os, sys\nsys.exit(0 if int(os.environ['TORCHELASTIC_RESTART_COUNT']) else 5)\n"
    )
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--max-restarts", "1",
                        "--run-dir", tmp_path, "--", script)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    log = events(tmp_path)
    assert [e["attempt"] for e in log if e["event"] == "restart"] == [1]
    assert log[-1]["status"] == 0


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_worker_s_end_is_seen_at_once_not_at_the_agent_s_next_look(pyinit_bin, tmp_path, start):
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\nsys.exit(0 if int(os.environ['TORCHELASTIC_RESTART_COUNT']) else 5)\n"
    )
    # torchrun's agent looks every 60 s here: the failure and then the end, each
    # seen only at a look, would take two minutes.
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "2", "--max-restarts", "1",
                        "--worker-start", start, "--torchrun", "--monitor-interval 60",
                        "--run-dir", tmp_path, "--", script, timeout=50)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert [e["attempt"] for e in events(tmp_path) if e["event"] == "restart"] == [1]


def test_a_rank_that_returned_before_another_died_lets_the_group_restart(pyinit_bin, tmp_path):
    # Rank 0 returns and waits for the agent's word; rank 1 then dies. torch
    # kills rank 0 as it waits, and the agent's word, given as it stops the
    # group, once waited for rank 0 to wake: the run hung for good.
    returned = tmp_path / "returned"
    script = tmp_path / "late_death.py"
    script.write_text(f"""
import os, signal, time
from pathlib import Path
returned = Path({str(returned)!r})
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["RANK"] == "0":
        returned.touch()
    else:
        while not returned.exists():
            time.sleep(0.05)
        time.sleep(1)  # rank 0 is past its script and waiting by now
        os.kill(os.getpid(), signal.SIGKILL)
""")
    result = pyinit_run(pyinit_bin, "--cold", "--nproc-per-node", "2", "--max-restarts", "1",
                        "--run-dir", tmp_path / "run", "--", script, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert [e["attempt"] for e in events(tmp_path / "run") if e["event"] == "restart"] == [1]


def test_an_end_seen_once_no_longer_cuts_the_agent_s_wait_short():
    ends = WorkerEnds()
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ends.watch([quick.pid, slow.pid])
        began = time.monotonic()
        ends.wait(60)
        assert time.monotonic() - began < 50  # woken by the quick one's end
        assert quick.wait(timeout=10) == 0
        began = time.monotonic()
        ends.wait(0.3)  # the slow one still runs: the whole wait, not a busy loop
        assert time.monotonic() - began >= 0.29
    finally:
        slow.kill()
        slow.wait()
        ends.forget()


def test_sigterm_ends_the_workers_and_gives_143(pyinit_bin, tmp_path):
    script = tmp_path / "forever.py"
    pid_file = tmp_path / "worker.pid"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                      "while True:\n    time.sleep(0.1)\n")  # fmt: skip
    command = [pyinit_bin, "run", "--nproc-per-node", "1", "--run-dir", tmp_path, "--", script]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert not Path(f"/proc/{worker}").exists()
    # torch's SignalException tracebacks and logging errors are the agent's log's, not ours.
    said = err.decode()
    assert "Traceback" not in said and "Logging error" not in said, said[-3000:]
    assert said.rstrip().splitlines()[-1].startswith("pyinit run: exited with status 143")
    log = events(tmp_path)
    assert {"event": "signal", "signal": "SIGTERM"}.items() <= next(
        e for e in log if e["event"] == "signal"
    ).items()
    assert log[-1]["status"] == 143


SIGNALS_ITS_GROUP = """
import os, signal, subprocess
child = subprocess.Popen(["sleep", "60"])
print("child", child.pid, flush=True)
os.killpg(0, signal.SIGTERM)  # itself and its children, as a cleanup might
"""


def test_a_script_that_signals_its_process_group_reaches_only_its_own(pyinit_bin, tmp_path):
    """A worker leads its own process group, as torchrun's do: a script's
    killpg(0, ...) ends it and its children, not pyinit run and its agent."""
    script = tmp_path / "group.py"
    script.write_text(SIGNALS_ITS_GROUP)
    # In a session of its own: on a launcher whose workers share its group, the
    # signal ends the launcher's whole job, which must not be this test's.
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--run-dir", tmp_path / "run",
                        "--", script, start_new_session=True)  # fmt: skip
    child = int(result.stdout.split()[1])
    assert "rank 0 failed first" in result.stderr and "killed by SIGTERM" in result.stderr
    assert "forwarded TERM" not in result.stderr, result.stderr  # pod-init was not sent it
    assert not Path(f"/proc/{child}").exists()  # the script's child had it too, and was reaped


HELD_TEARDOWN = """\
import ctypes

import torch.distributed as dist


class HeldTeardown:
    # Blocks holding the GIL when freed, as torch's teardown of a DDP reducer
    # over a broken gloo group can.
    def __del__(self):
        ctypes.PyDLL(None).sleep(3600)


def main():
    dist.init_process_group("gloo")
    held = HeldTeardown()
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails")
    dist.barrier()  # rank 0 waits here until rank 1's sockets close


main()
"""


def test_a_failed_rank_whose_teardown_hangs_is_ended_and_named(pyinit_bin, tmp_path):
    script = tmp_path / "held.py"
    script.write_text(HELD_TEARDOWN)
    began = time.monotonic()
    result = pyinit_run(pyinit_bin, "--nproc-per-node", "2", "--run-dir", tmp_path / "run",
                        "--", script, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    # Rank 0 waits in its barrier until rank 1 has exited: gloo's own timeout is 30 minutes.
    assert time.monotonic() - began < 100
    teardown = tmp_path / "run" / "status" / "teardown-rank1.txt"
    # Rank 0 may have heard of rank 1's end in its all-reduce first: a casualty's line;
    # on a node of several GPUs, the run may say first why it uses no NCCL tuning.
    lines = [line for line in result.stderr.splitlines() if line.startswith("pyinit run:")
             and "because another rank is gone" not in line
             and not line.startswith("pyinit run: NCCL tuning not used")]  # fmt: skip
    assert lines[0].startswith("pyinit run: rank 1 failed first"), result.stderr[-3000:]
    assert lines[1] == (f"pyinit run: rank 1 failed and its interpreter did not end within 10 s; "
                        f"it was ended (its threads then: {teardown})")  # fmt: skip
    assert "in __del__" in teardown.read_text()
    end = events(tmp_path / "run")[-1]
    assert end["teardown_hung"] == [1] and end["status"] == 1


BOUNDED_WITHOUT_A_FILE = """\
import ctypes, sys
from pathlib import Path
from pyinit.run import wrapper
wrapper.TEARDOWN_S = 0.5
wrapper._bound_teardown(Path(sys.argv[1]), "1")
ctypes.PyDLL(None).sleep(60)  # a teardown that holds the GIL
"""


def test_a_teardown_is_bounded_where_its_stacks_cannot_be_written(tmp_path):
    """A status folder that takes no file (a full disk, here one that is
    missing) loses the stacks' file, not the bound: they go to stderr."""
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", BOUNDED_WITHOUT_A_FILE, tmp_path / "missing"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and time.monotonic() - began < 30, proc.stderr
    assert "Timeout (0:00:00.500000)!" in proc.stderr and "<string>" in proc.stderr


def test_bad_input_is_one_clear_line_and_exit_2(pyinit_bin, tmp_path, shards):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    duplicate = tmp_path / "duplicate"
    duplicate.write_text("127.0.0.1\n10.9.9.9\n127.0.0.1\n")
    malformed = tmp_path / "malformed"
    malformed.write_text("127.0.0.1\n10.0.0.[1-\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("10.9.9.1\n10.9.9.2\n")
    cases = [
        (["--hostfile", duplicate, "--", script], f"{duplicate}:3: "),
        (["--hostfile", malformed, "--", script], f"{malformed}:2: "),
        (["--hostfile", elsewhere, "--", script], f"{elsewhere}"),
        (["--", tmp_path / "missing.py"], "missing.py: no such script"),
        (["--nproc-per-node", "0", "--", script], "--nproc-per-node must be from 1 to 1024"),
        ([], "no script"),
    ]
    for args, message in cases:
        result = pyinit_run(pyinit_bin, "--run-dir", tmp_path / "bad", *args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def training(steps: int, shards: Path) -> list:
    """The example's command line, for start_nodes."""
    return [EXAMPLE, "--data", shards, "--steps", str(steps), *TINY]


def start_nodes(pyinit_bin, names, hostfile, tmp_path, script: list,
                envs: list[dict[str, str]] | None = None) -> list[subprocess.Popen]:  # fmt: skip
    """A pyinit run in each namespace: from the hostfile, or without one from
    each node's `envs` (MASTER_ADDR and the rest)."""
    procs = []
    for number, ns in enumerate(names):
        nodes = ["--hostfile", hostfile, "--master-port", "29611"] if hostfile else []
        command = ["ip", "netns", "exec", ns, pyinit_bin, "run", *nodes, "--nproc-per-node", "1",
                   "--run-dir", tmp_path / ns, "--", *script]  # fmt: skip
        env = {**os.environ, **envs[number]} if envs else None
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True, env=env))  # fmt: skip
    return procs


@pytest.fixture
def node_runs(pyinit_bin) -> Iterator[Callable[..., list[subprocess.Popen]]]:
    """start_nodes, whose nodes are killed and reaped after the test however it
    ended: a failed one leaves no process or open pipe behind."""
    started: list[subprocess.Popen] = []

    def start(names, *args) -> list[subprocess.Popen]:
        procs = start_nodes(pyinit_bin, names, *args)
        started.extend(procs)
        return procs

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            proc.communicate(timeout=30)


def ended(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each node's output once all have ended; when one has not within
    `timeout`, every node's last words, so a hang says where it was."""
    deadline = time.monotonic() + timeout
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            stacks = python_stacks(proc.pid)
            for other in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            said = [f"node {i}: {last_words(p)}" for i, p in enumerate(procs)]
            raise AssertionError(f"node {procs.index(proc)} did not end within {timeout:g} s\n"
                                 + "\n".join(said) + stacks) from None  # fmt: skip
    return outputs


def python_stacks(root: int) -> str:
    """Every Python stack under a hung node's process, native frames too,
    taken before it is killed: what a hang seen once in CI needs to be found."""
    if not shutil.which("py-spy"):
        return "\n(no py-spy: no stacks)"
    dumps = []
    for pid in [root, *sorted(children_of(root))]:
        done = subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        said = done.stdout.strip() or (done.stderr.strip().splitlines() or ["no answer"])[0]
        dumps.append(f"--- {pid}: {said}")
    return "\n" + "\n".join(dumps)


def last_words(proc: subprocess.Popen) -> str:
    """The end of a killed node's stderr (its workers, in sessions of their
    own, may hold the pipe a while longer)."""
    try:
        return proc.communicate(timeout=30)[1][-1500:]
    except subprocess.TimeoutExpired as error:
        return (error.stderr or b"")[-1500:].decode(errors="replace")


@pytest.mark.root
def test_three_nodes_in_namespaces_train_together(node_runs, three_namespaces, tmp_path, shards):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(NODES) + "\n")
    procs = node_runs(three_namespaces, hostfile, tmp_path, training(15, shards))
    outputs = ended(procs, 300)
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        # What torch's C++ side says in the agent (the store's warning for each
        # connection from an address without a name) is the agent's log's.
        assert "[c10d]" not in err, err[-3000:]
    assert "[c10d]" in (tmp_path / three_namespaces[0] / "agent.log").read_text()
    assert "all-reduce: sum 6 over 3 ranks, expected 6" in outputs[0][0]
    assert "step    15" in outputs[0][0]
    for rank, ns in enumerate(three_namespaces):
        start = events(tmp_path / ns)[0]
        assert start["nodes"]["rank"] == rank and start["nodes"]["source"] == "hostfile"
        spawn = next(e for e in events(tmp_path / ns) if e["event"] == "spawn")
        endpoint = spawn["command"][spawn["command"].index("--rdzv-endpoint") + 1]
        assert endpoint == f"{NODES[0]}:29611"  # the master's own address, not the wildcard
        rendezvous = next(e for e in events(tmp_path / ns) if e["event"] == "rendezvous")
        assert rendezvous["serving"] == (rank == 0)


@pytest.mark.root
def test_nodes_described_as_kubernetes_describes_pods_train_together(node_runs,
                                                                     three_namespaces,
                                                                     tmp_path, shards):  # fmt: skip
    """A PyTorchJob's pods: MASTER_ADDR and MASTER_PORT, WORLD_SIZE pods,
    each its RANK. On the code before, every node took itself for node 0."""
    envs = [{"MASTER_ADDR": NODES[0], "MASTER_PORT": "23456", "WORLD_SIZE": "3",
             "RANK": str(rank), "PYINIT_JOIN_TIMEOUT": "60"} for rank in range(3)]  # fmt: skip
    procs = node_runs(three_namespaces, None, tmp_path, training(10, shards), envs)
    outputs = ended(procs, 300)
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    assert "all-reduce: sum 6 over 3 ranks, expected 6" in outputs[0][0]
    for rank, ns in enumerate(three_namespaces):
        start = events(tmp_path / ns)[0]
        assert start["nodes"]["rank"] == rank and start["nodes"]["source"] == "environment"
        rendezvous = next(e for e in events(tmp_path / ns) if e["event"] == "rendezvous")
        assert rendezvous["endpoint"] == f"{NODES[0]}:23456", rendezvous


@pytest.mark.root
def test_a_killed_node_ends_the_others_and_is_named(node_runs, three_namespaces, tmp_path, shards):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(NODES) + "\n")
    procs = node_runs(three_namespaces, hostfile, tmp_path, training(100000, shards))
    deadline = time.monotonic() + 180
    progress = tmp_path / three_namespaces[0] / "events.jsonl"
    # Wait until training runs: rank 0 prints steps.
    line = ""
    while "step " not in line:
        assert time.monotonic() < deadline, "training did not start"
        line = procs[0].stdout.readline()
    netns.kill_all(three_namespaces[2])
    ended(procs[:2], 120)
    assert all(proc.returncode != 0 for proc in procs[:2])
    ended(procs[2:], 60)
    for ns in three_namespaces[:2]:
        end = events(tmp_path / ns)[-1]
        assert end["event"] == "end" and end["status"] != 0
        assert end["unreachable_nodes"] == [{"rank": 2, "name": NODES[2], "address": NODES[2]}]
    assert progress.exists()


# Joins the group, then never calls a collective: a rank busy on its own, or one in
# an NCCL collective, which waits for a dead peer for NCCL's whole timeout.
WAITS_ALONE = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("joined", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.root
def test_a_killed_node_ends_ranks_that_never_hear_of_it(node_runs, three_namespaces, tmp_path):
    """Ranks outside any collective never learn from torch that a node
    went away: the launcher's own watch of the other nodes ends them."""
    from pyinit.run.liveness import LOST_AFTER_S

    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(NODES) + "\n")
    script = tmp_path / "waits_alone.py"
    script.write_text(WAITS_ALONE)
    procs = node_runs(three_namespaces, hostfile, tmp_path, [script])
    deadline = time.monotonic() + 180
    while procs[0].stdout.readline() != "joined\n":
        assert time.monotonic() < deadline and procs[0].poll() is None, "no rank joined"
    netns.kill_all(three_namespaces[2])
    killed = time.monotonic()
    outputs = ended(procs[:2], 120)
    # The watch's wait, torchrun's end of its workers, the linger: well under
    # torch's own timeouts (30 minutes for gloo, 10 for NCCL).
    assert time.monotonic() - killed < LOST_AFTER_S + 60
    for proc, (_, err), ns in zip(procs[:2], outputs, three_namespaces, strict=False):
        assert proc.returncode == 1, err[-3000:]
        assert f"pyinit run: node 2 ({NODES[2]}) has not answered for" in err, err[-3000:]
        assert "failed first" not in err, err[-3000:]
        log = events(tmp_path / ns)
        lost = [e for e in log if e["event"] == "node lost"]
        assert [(e["rank"], e["address"]) for e in lost] == [(2, NODES[2])], log
        assert lost[0]["silent_s"] >= LOST_AFTER_S and not lost[0]["run_failed"]
        assert log[-1]["unreachable_nodes"] == [{"rank": 2, "name": NODES[2], "address": NODES[2]}]


@pytest.mark.root
def test_a_node_whose_run_failed_ends_the_others_and_is_not_named_gone(node_runs,
                                                                       three_namespaces,
                                                                       tmp_path):  # fmt: skip
    """Node 2's rank exits 3 after joining while the others' ranks wait
    alone: its run fails and says so before it goes quiet, so the others
    end their workers once it is silent, saying it failed, and name it in
    no `unreachable_nodes` (on the code before, it was named gone)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(NODES) + "\n")
    script = tmp_path / "fails_on_node_2.py"
    joined = 'print("joined", flush=True)\n'
    script.write_text(WAITS_ALONE.replace(joined, joined + "if dist.get_rank() == 2:\n"
                                          "    raise SystemExit(3)\n"))  # fmt: skip
    procs = node_runs(three_namespaces, hostfile, tmp_path, [script])
    outputs = ended(procs, 180)
    assert procs[2].returncode == 3, outputs[2][1][-3000:]
    for proc, (_, err), ns in zip(procs[:2], outputs, three_namespaces, strict=False):
        assert proc.returncode == 1, err[-3000:]
        assert f"pyinit run: node 2 ({NODES[2]}), whose run failed, has not answered for" in err
        assert f"node 2 ({NODES[2]}) is gone" not in err, err[-3000:]
        log = events(tmp_path / ns)
        lost = [e for e in log if e["event"] == "node lost"]
        assert [(e["rank"], e["run_failed"]) for e in lost] == [(2, True)], log
        assert log[-1]["unreachable_nodes"] == [], log[-1]


def test_a_closed_liveness_port_answers_no_more():
    """close() ends the accept() its thread is blocked in: the next ask is
    refused, not answered once more by a thread that held the socket open."""
    from pyinit.run import liveness

    port_owner = liveness.Liveness("127.0.0.2", 0)
    port = port_owner._sock.getsockname()[1]
    port_owner.start()
    try:
        assert liveness._ask_all({1: "127.0.0.2"}, port, 10.0) == {1: b"alive\n"}
    finally:
        port_owner.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=10).close()


def test_a_node_is_gone_once_silent_after_the_workers_started_unless_it_ended_well(monkeypatch):
    """The watch over the other nodes' liveness ports (127.0.0.2 to .4 as
    three more nodes): one silent before this node's workers started is not
    gone yet (it may be started again before --join-timeout); once they
    have, each silent one is handed on once, unless it said its run ended
    well (rank 0 may still be saving when the others are done)."""
    from pyinit.run import liveness

    monkeypatch.setattr(liveness, "PEER_POLL_S", 0.1)
    monkeypatch.setattr(liveness, "LOST_AFTER_S", 1.0)
    addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    own = liveness.Liveness(addresses[0], 0)
    own.port = port = own._sock.getsockname()[1]
    peers = [liveness.Liveness(address, port) for address in addresses[1:]]
    lost: list[tuple[int, float]] = []
    try:
        for peer in peers:
            peer.start()
        own.watch_peers(addresses, 0, None, lambda rank, silent_s: lost.append((rank, silent_s)))
        deadline = time.monotonic() + 30
        while len(own._answered_at) < 3:
            assert time.monotonic() < deadline, "the other nodes did not answer"
            time.sleep(0.05)
        peers[2].close()
        time.sleep(2.0)
        assert lost == []  # this node's workers have not started
        own.workers_started()
        began = time.monotonic()
        peers[0].end_well(1, 30.0)
        assert time.monotonic() - began < 10  # it waited for one ask, not its limit
        peers[0].close()
        peers[1].close()
        while len(lost) < 2:
            assert time.monotonic() < deadline, f"found gone: {lost}"
            time.sleep(0.05)
        time.sleep(1.5)  # the watch goes on: nothing more is handed on
        assert sorted(rank for rank, _ in lost) == [2, 3], lost
        assert all(silent_s >= 1.0 for _, silent_s in lost)
    finally:
        own.close()
        for peer in peers:
            peer.close()


def test_a_node_whose_run_failed_first_is_not_named_gone_nor_joined_unless_it_had(
    monkeypatch, tmp_path
):
    """Nodes whose run failed say so while they linger, and whether their
    agent had joined. Once they are silent, a node that ends later names
    neither as gone (a node that never answered, nothing listening at its
    address, it still names); and while nodes wait to join, one that failed
    before it joined is named as not joined, one that failed after is not."""
    from pyinit.run import liveness
    from pyinit.run.nodes import Nodes

    monkeypatch.setattr(liveness, "PEER_POLL_S", 0.1)
    addresses = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
    own = liveness.Liveness(addresses[0], 0)
    own.port = port = own._sock.getsockname()[1]
    after_joining, before_joining = (liveness.Liveness(a, port) for a in addresses[1:3])
    after_joining.joined = lambda: True
    nodes = Nodes(4, 0, addresses[0], "hostfile", addresses, addresses)
    joins = liveness.JoinWatch(tmp_path / "joined", own, nodes, 60.0, lambda line: None)
    try:
        for peer in (after_joining, before_joining):
            peer.start()
            peer.end_failed()
        assert joins.not_joined() == ([3], [2])
        own.watch_peers(addresses, 0, None, lambda rank, silent_s: None)
        deadline = time.monotonic() + 30
        while len(own._failed_peers) < 2:
            assert time.monotonic() < deadline, "the watch did not hear the failed nodes"
            time.sleep(0.05)
        after_joining.close()
        before_joining.close()
        assert own.unreachable(addresses, 0) == [3]
    finally:
        own.close()
        after_joining.close()
        before_joining.close()


@pytest.mark.root
@pytest.mark.slow
def test_eight_nodes_join_sum_and_name_a_killed_one(node_runs, eight_namespaces, tmp_path, shards):
    """The reference deployment's width, a worker per node on this machine: all
    eight join one rendezvous, the all-reduce sums over all, and when node 7 is
    killed the other seven end and name it."""
    addresses = node_addresses(8)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(addresses) + "\n")
    procs = node_runs(eight_namespaces, hostfile, tmp_path, training(100000, shards))
    deadline = time.monotonic() + 400
    seen = ""
    while "step " not in seen:
        assert time.monotonic() < deadline, "training did not start"
        line = procs[0].stdout.readline()
        assert line or procs[0].poll() is None, procs[0].stderr.read()[-3000:]
        seen += line
    assert "all-reduce: sum 36 over 8 ranks, expected 36" in seen
    netns.kill_all(eight_namespaces[7])
    ended(procs[:7], 180)
    assert all(proc.returncode != 0 for proc in procs[:7])
    ended(procs[7:], 60)
    for ns in eight_namespaces[:7]:
        end = events(tmp_path / ns)[-1]
        assert end["event"] == "end" and end["status"] != 0
        assert end["unreachable_nodes"] == [
            {"rank": 7, "name": addresses[7], "address": addresses[7]}
        ], end


def test_nodes_from_slurm_and_from_the_environment(monkeypatch):
    import socket

    from pyinit.run import nodes
    from pyinit.run.nodes import find_nodes

    with pytest.raises(ValueError, match=r"the master 'pyinit-no-such-node\.invalid' does not"):
        find_nodes(None, {"SLURM_JOB_NODELIST": "pyinit-no-such-node.invalid"})
    with pytest.raises(ValueError, match=r"node 1 'pyinit-no-such-node\.invalid' does not"):
        find_nodes(None, {"SLURM_JOB_NODELIST": "localhost,pyinit-no-such-node.invalid"})
    table = {b"gpu07": "10.9.0.7", b"gpu08": "10.9.0.8", b"gpu09": "10.9.0.9"}
    resolved = []

    def getaddrinfo(name, *args, **kwargs):
        resolved.append(name)
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[name], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu09")
    slurm = find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NODEID": "2",
                              "SLURM_NNODES": "3"})  # fmt: skip
    # Every node, once, up front (this host's name for gloo's sake): the watches that
    # ask every node each second ask no name server.
    assert sorted(resolved) == [b"gpu07", b"gpu08", b"gpu09", b"gpu09"]
    assert (slurm.count, slurm.rank, slurm.master, slurm.source) == (3, 2, "10.9.0.7", "slurm")
    assert slurm.names == ("gpu07", "gpu08", "gpu09")
    assert slurm.addresses == ("10.9.0.7", "10.9.0.8", "10.9.0.9")
    assert (slurm.listen, slurm.interface) == ("10.9.0.9", "")  # gloo finds its own
    assert slurm.port is None  # no job: torchrun's 29500
    # A job's own port (jobs that share a node must not both take 29500), unless
    # MASTER_PORT names one.
    job = {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_JOB_ID": "123456"}
    assert find_nodes(None, job).port == 15000 + 2 * 3456
    assert find_nodes(None, {**job, "MASTER_PORT": "29600"}).port == 29600
    assert find_nodes(None, {**job, "SLURM_NNODES": "1"}).port is None  # a free one
    # Debian's "127.0.1.1 HOSTNAME": every address for this node's sockets, and the
    # interface of the route to the master for gloo.
    table[b"gpu09"] = "127.0.1.1"
    monkeypatch.setattr(nodes._native, "route_to", lambda to: ("ib0", "10.9.0.9"))
    slurm = find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NODEID": "2"})
    assert (slurm.listen, slurm.interface) == ("", "ib0")
    with pytest.raises(ValueError, match=r"node 2 'gpu09' resolves to 127\.0\.1\.1 here, a "):
        find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NODEID": "0"})
    with pytest.raises(ValueError, match=r"SLURM_NNODES=4, but SLURM_JOB_NODELIST names 3 nodes"):
        find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NNODES": "4"})
    # A job step on part of the job's nodes: SLURM_NNODES and SLURM_NODEID count the step's.
    table[b"gpu09"] = "10.9.0.9"
    step = find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_STEP_NODELIST":
                             "gpu[08-09]", "SLURM_NNODES": "2", "SLURM_NODEID": "0"})  # fmt: skip
    assert (step.count, step.rank, step.master, step.names) == (2, 0, "10.9.0.8",
                                                                ("gpu08", "gpu09"))  # fmt: skip
    # srun's compressed counts: node 2 is the first with two tasks.
    crowded = {"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_STEP_TASKS_PER_NODE": "1(x2),2"}
    with pytest.raises(ValueError, match=r"runs 2 tasks on node 2 \(gpu09\) \(SLURM_STEP_TASKS"):
        find_nodes(None, crowded)
    with pytest.raises(ValueError, match=r"'1\(x2\)\+2' is not COUNT or COUNT\(xNODES\)"):
        find_nodes(None, {**crowded, "SLURM_STEP_TASKS_PER_NODE": "1(x2)+2"})
    with pytest.raises(ValueError, match=r"SLURM_STEP_NODELIST: node 1 'gpu10' does not resolve"):
        find_nodes(None, {"SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_STEP_NODELIST": "gpu[09-10]"})
    table[b"10.1.0.5"] = "10.1.0.5"
    table[b"gpu-master"] = "127.0.1.1"
    master = find_nodes(None, {"MASTER_ADDR": "gpu-master", "NODE_RANK": "0", "NNODES": "2"})
    assert (master.master, master.listen) == ("gpu-master", "")
    master = find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "NODE_RANK": "0", "NNODES": "2"})
    assert (master.master, master.listen) == ("10.1.0.5", "10.1.0.5")
    # Kubernetes' PyTorchJob: WORLD_SIZE pods, each its RANK, and the master's port.
    pod = find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "MASTER_PORT": "23456", "WORLD_SIZE": "3",
                            "RANK": "2"})  # fmt: skip
    assert (pod.count, pod.rank, pod.master, pod.port) == (3, 2, "10.1.0.5", 23456)
    # A newer operator: torchrun's variables, and WORLD_SIZE counting processes.
    newer = {"MASTER_ADDR": "10.1.0.5", "MASTER_PORT": "23456", "WORLD_SIZE": "16", "RANK": "1",
             "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8"}  # fmt: skip
    assert (find_nodes(None, newer).count, find_nodes(None, newer).rank) == (2, 1)
    with pytest.raises(ValueError, match=r"PET_NNODES='1:4': a range of nodes is torchrun's elas"):
        find_nodes(None, {**newer, "PET_NNODES": "1:4"})
    # RANK numbers processes beside NNODES; one node takes a free port.
    assert find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "NNODES": "4", "RANK": "2"}).rank == 0
    assert find_nodes(None, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12355"}).port is None
    with pytest.raises(ValueError, match=r"RANK=3 does not fit 3 nodes"):
        find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "WORLD_SIZE": "3", "RANK": "3"})
    with pytest.raises(ValueError, match=r"MASTER_PORT='70000' is not a port"):
        find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "WORLD_SIZE": "2", "MASTER_PORT": "70000"})
    env = find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "NODE_RANK": "1", "NNODES": "4"})
    assert (env.count, env.rank, env.master, env.source) == (4, 1, "10.1.0.5", "environment")
    operator = find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "GROUP_RANK": "3", "WORLD_SIZE": "4"})
    assert (operator.count, operator.rank) == (4, 3)
    assert find_nodes(None, {}).source == "single"
    with pytest.raises(ValueError, match="SLURM_NODEID=5 does not fit 3 nodes"):
        find_nodes(None, {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NODEID": "5"})
    with pytest.raises(ValueError, match="NNODES='two' is not a whole number"):
        find_nodes(None, {"MASTER_ADDR": "10.1.0.5", "NNODES": "two"})


def test_a_master_address_this_host_does_not_hold_is_listened_for_on_every_address():
    """MASTER_ADDR as a Kubernetes service's address, or one the network
    translates: the other nodes reach this node there, so the store listens
    on every address (as torch's does), and workers still connect to it."""
    import socket

    from pyinit.run import store
    from pyinit.run.nodes import Nodes

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    elsewhere = "203.0.113.77"  # TEST-NET-3: held by no host
    nodes = Nodes(2, 0, elsewhere, "environment", listen=elsewhere)
    served = store.bind(nodes, port)
    try:
        assert served.listening is not None
        assert served.listening.getsockname()[0] in ("::", "0.0.0.0")
        assert served.endpoint == f"{elsewhere}:{port}"
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        served.close()
    # A name that does not resolve is not taken for one: one line, naming it.
    nodes = Nodes(2, 0, "pyinit-no-such-node.invalid", "environment",
                  listen="pyinit-no-such-node.invalid")  # fmt: skip
    with pytest.raises(OSError, match=r"cannot listen on pyinit-no-such-node\.invalid:\d+ for"):
        store.bind(nodes, port)


def test_the_route_to_an_address_names_its_interface_and_source_address():
    from pyinit import _native

    assert _native.route_to("127.0.0.1") == ("lo", "127.0.0.1")
    assert _native.route_to("127.0.1.1") == ("lo", "127.0.0.1")
    with pytest.raises(ValueError, match="not an IP address: gpu07"):
        _native.route_to("gpu07")


def test_strict_preflight_refuses_to_start(pyinit_bin, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    result = pyinit_run(pyinit_bin, "--expect-gpus", "8", "--preflight", "strict",
                        "--run-dir", tmp_path, "--", script)  # fmt: skip
    assert result.returncode == 1
    assert "GPU_COUNT" in result.stderr or "expected 8" in result.stderr, result.stderr
    assert "not starting (--preflight strict)" in result.stderr
    assert [e["event"] for e in events(tmp_path) if e["event"] != "phase"] == [
        "start",
        "preflight",
        "end",
    ]
    warned = pyinit_run(pyinit_bin, "--expect-gpus", "8", "--nproc-per-node", "1",
                        "--run-dir", tmp_path / "warn", "--", script)  # fmt: skip
    assert warned.returncode == 0 and "preflight error" in warned.stderr


def test_nvml_health_errors_are_preflight_errors():
    from pyinit.health import gpu_health
    from pyinit.nvml import FakeNvml, read_nvml
    from pyinit.topology import Finding

    spec = json.loads((ROOT / "tests" / "data" / "h200x2-nvml.json").read_text())
    assert gpu_health(read_nvml(FakeNvml(spec))) == []  # the machine measured: healthy
    spec["gpus"][1]["health"] = {"ecc_enabled": True, "ecc_uncorrected_volatile": 2,
                                 "remap_pending": True, "remap_failed": False}  # fmt: skip
    # A x16 GPU in a x8 slot: the scan caps the width by the slot, and NVML
    # says nothing of links (it once failed --preflight strict in Python only).
    spec["gpus"][0]["pcie"] = [5, 5, 8, 16]
    spec["gpus"][0]["bar1_total"] = 1 << 30  # smaller than the memory
    spec["gpus"][1]["bar1_total"] = 1 << 28  # and what the scan calls BAR1_SMALL
    view = read_nvml(FakeNvml(spec))
    first, second = view.gpus[0].bdf, view.gpus[1].bdf
    scanned = [Finding("error", "BAR1_SMALL", second, "BAR1 is 256 MiB")]
    found = {(f.severity, f.code, f.device) for f in gpu_health(view, scanned)}
    assert found == {
        ("error", "ECC_UNCORRECTED", second),
        ("warning", "ROW_REMAP_PENDING", second),
        ("warning", "BAR1_BELOW_MEMORY", first),
    }


def test_a_module_a_program_standalone_and_torchrun_options(pyinit_bin, tmp_path):
    (tmp_path / "mymodule.py").write_text("import sys\nsys.exit(len(sys.argv) + 3)\n")
    as_module = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--run-dir", tmp_path / "m",
                           "-m", "mymodule", "--", "a", cwd=tmp_path)  # fmt: skip
    assert as_module.returncode == 5, as_module.stderr[-2000:]  # argv: [module, "a"]
    program = tmp_path / "program.sh"
    program.write_text("#!/bin/sh\nexit 6\n")
    program.chmod(0o755)
    as_program = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--run-dir", tmp_path / "p",
                            "--no-python", "--", program)  # fmt: skip
    assert as_program.returncode == 6, as_program.stderr[-2000:]
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    logs = tmp_path / "torchrun-logs"
    env = {**os.environ, "SLURM_JOB_NODELIST": "elsewhere[1-4]", "SLURM_NODEID": "2"}
    alone = pyinit_run(pyinit_bin, "--nproc-per-node", "1", "--run-dir", tmp_path / "s",
                       "--standalone", "--torchrun", f"--log-dir {logs}", "--", script,
                       env=env)  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-2000:]
    # torchrun took the passed-on option, over pyinit run's own folder for it
    assert logs.is_dir() and not (tmp_path / "s" / "torchrun").exists()
    assert events(tmp_path / "s")[0]["nodes"]["source"] == "single"
    for args, message in (
        (["--torchrun", "--nnodes 2", "--", script], "pyinit run sets --nnodes itself"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["--no-python", "--", tmp_path / "nothing"], "no such program"),
        (["-m", "mymodule", "--no-python"], "-m and --no-python: give one"),
    ):
        refused = pyinit_run(pyinit_bin, "--run-dir", tmp_path / "x", *args, cwd=tmp_path)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert not (tmp_path / "x").exists()


def test_device_init_is_timed_once_while_torch_reenters_it(tmp_path):
    """torch calls torch.cuda._lazy_init from inside itself while CUDA starts
    (its queued calls); the worker's timing hook must pass those through, not
    recurse (seen on H200 nodes). Without a GPU here, a stand-in for
    _lazy_init re-enters by name as torch's does."""
    program = f"""
import torch, torch.cuda
state = {{"initialized": False, "inside": False}}
def lazy_init():
    if state["initialized"] or state["inside"]:
        return
    state["inside"] = True
    torch.cuda._lazy_init()  # a queued call, by name: the hook again
    torch.cuda._lazy_init()
    state["initialized"], state["inside"] = True, False
torch.cuda._lazy_init = lazy_init
torch.cuda.is_initialized = lambda: state["initialized"]
from pathlib import Path
from pyinit.runlog.events import EventLog
from pyinit.runlog.progress import ProgressWriter
from pyinit.run.wrapper import Marks
progress = ProgressWriter(Path({str(tmp_path / "progress.bin")!r}))
Marks(EventLog({str(tmp_path / "events.jsonl")!r}, rank=0), progress, None).instrument_torch()
torch.cuda._lazy_init()
torch.cuda._lazy_init()
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    phases = [e["name"] for e in events(tmp_path) if e["event"] == "phase"]
    # torch was imported before the hooks: no import phase, CUDA's start once.
    assert phases == ["device init"]
