"""pyinit.termination: a stop signal unwinds a command (its cleanup runs),
is held while a process is being started, and a second one ends it at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from test_hostile import children_of, kill_9_leaves_nothing

HELD = """
import os, signal
from pyinit.termination import Terminated, end_on_signals, held_back
end_on_signals()
try:
    with held_back():
        os.kill(os.getpid(), signal.SIGTERM)
        print("the block went on", flush=True)
except Terminated as stop:
    print("then:", stop, flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # the second one: the process ends at once
print("not reached", flush=True)
"""


def test_a_stop_while_starting_is_raised_after_and_a_second_ends_the_process():
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout == "the block went on\nthen: stopped by SIGTERM\n", done.stderr
    assert done.returncode == -signal.SIGTERM and done.stderr == ""


IGNORED = """
import signal
from pyinit.termination import end_on_signals
end_on_signals()
print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,
      signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_a_signal_the_command_was_started_ignoring_stays_ignored():
    done = subprocess.run(["nohup", sys.executable, "-c", IGNORED], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout == "True False\n", done.stderr  # nohup's SIGHUP ignored; TERM taken


def test_a_torchrun_worker_never_outlives_its_agent(tmp_path):
    """pyinit.torchrun's workers run in sessions of their own, out of reach
    of a signal to its process group; a torchrun that ends without stopping
    them (KILLed here; in one CI run, a TERM that came while it started
    them) takes them with it, instead of leaving them in the rendezvous."""
    command = [sys.executable, "-m", "pyinit.torchrun", "--standalone", "--nproc-per-node", "2",
               "--log-dir", str(tmp_path / "logs"), "--no-python", sys.executable, "-P", "-m",
               "pyinit.bench.collectives", "all_reduce", "--sizes", "4K", "--iterations",
               "1000000000", "--warmup", "1", "--rounds", "1",
               "--out", str(tmp_path / "rows")]  # fmt: skip
    agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(children_of(agent.pid)) < 2:
        assert agent.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    kill_9_leaves_nothing(agent)
