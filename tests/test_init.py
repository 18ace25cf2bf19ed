"""pod-init as a supervisor (tini's job) and as PID 1 of a PID namespace:
exit codes, signals, orphans, the grace period, commands that cannot start.
The namespace tests need root (unshare); CI runs as root."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ctrl_c_at_a_terminal

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")


def in_namespace(pod_init_bin: Path, *command: str, grace: int | None = None) -> list[str]:
    """pod-init as PID 1 of a new PID namespace with its own /proc."""
    options = ["--grace", str(grace)] if grace is not None else []
    return ["unshare", "--fork", "--pid", "--mount-proc", str(pod_init_bin), *options, "--",
            *command]  # fmt: skip


def pod_init_pid(unshare: subprocess.Popen) -> int:
    """pod-init's PID outside the namespace: unshare's only child."""
    for _ in range(200):
        children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("pod-init did not start")


@pytest.mark.root
@needs_root
def test_exit_codes_pass_through(pod_init_bin):
    for code in range(256):
        result = subprocess.run(in_namespace(pod_init_bin, "sh", "-c", f"exit {code}"))
        assert result.returncode == code


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGUSR1])
def test_a_command_killed_by_signal_n_gives_128_plus_n(pod_init_bin, sig):
    result = subprocess.run(in_namespace(pod_init_bin, "sh", "-c", f"kill -{sig.name[3:]} $$"))
    assert result.returncode == 128 + sig


ORPHANS = (
    "i=0; while [ $i -lt 2000 ]; do (sleep 0.2 &); i=$((i+1)); done; sleep 2; "
    "echo zombies=$(grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l)"
)


@pytest.mark.root
@needs_root
def test_thousands_of_orphans_are_all_reaped(pod_init_bin):
    result = subprocess.run(
        in_namespace(pod_init_bin, "sh", "-c", ORPHANS), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "zombies=0"
    # The control: a PID 1 that waits only for its own child (Python's subprocess)
    # leaves the orphans as zombies. (A shell would not do: it waits for any child.)
    starter = f"import subprocess; subprocess.run(['sh', '-c', {ORPHANS!r}])"
    control = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, "-c", starter],
        capture_output=True, text=True,
    )  # fmt: skip
    assert int(control.stdout.strip().split("=")[1]) > 1000


@pytest.mark.root
@needs_root
def test_sigterm_reaches_the_command(pod_init_bin):
    script = 'trap "echo got TERM; exit 42" TERM; echo ready; while :; do sleep 0.05; done'
    unshare = subprocess.Popen(
        in_namespace(pod_init_bin, "sh", "-c", script), stdout=subprocess.PIPE, text=True
    )
    assert unshare.stdout.readline() == "ready\n"
    os.kill(pod_init_pid(unshare), signal.SIGTERM)
    out, _ = unshare.communicate(timeout=10)
    assert unshare.returncode == 42 and "got TERM" in out


COUNT_INTS = """
import signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *_: got.append(1))
print("ready", flush=True)
while not got:
    time.sleep(0.05)
time.sleep(1.0)  # a second INT, had one been sent, would be here by now
print("INT", len(got), flush=True)
"""


def test_a_terminals_ctrl_c_reaches_the_command_once(pod_init_bin):
    """The terminal sends Ctrl-C's INT to its whole foreground job, the command
    beside pod-init: pod-init does not send it a second copy."""
    ran = ctrl_c_at_a_terminal([str(pod_init_bin), "--", sys.executable, "-c", COUNT_INTS],
                               "ready")  # fmt: skip
    assert "INT 1\n" in ran.output and ran.status == 0, ran
    assert "the terminal sent INT to the command as well" in ran.output


@pytest.mark.root
@needs_root
def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(pod_init_bin):
    script = 'trap "" TERM; echo ready; while :; do sleep 0.05; done'
    unshare = subprocess.Popen(
        in_namespace(pod_init_bin, "sh", "-c", script, grace=1),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert unshare.stdout.readline() == "ready\n"
    start = time.monotonic()
    os.kill(pod_init_pid(unshare), signal.SIGTERM)
    _, err = unshare.communicate(timeout=10)
    elapsed = time.monotonic() - start
    assert unshare.returncode == 128 + signal.SIGKILL
    assert 0.9 < elapsed < 5, elapsed
    assert "did not end within the grace period" in err


def test_commands_that_cannot_start(pod_init_bin, tmp_path):
    missing = subprocess.run([pod_init_bin, "--", "/nonexistent/command"], capture_output=True,
                             text=True)  # fmt: skip
    assert missing.returncode == 127
    assert "cannot run '/nonexistent/command': No such file or directory" in missing.stderr
    script = tmp_path / "script.sh"
    script.write_text("echo hi\n")
    script.chmod(0o644)
    denied = subprocess.run([pod_init_bin, "--", script], capture_output=True, text=True)
    assert denied.returncode == 126 and "Permission denied" in denied.stderr
    usage = subprocess.run([pod_init_bin, "--grace", "x", "--", "true"], capture_output=True,
                           text=True)  # fmt: skip
    assert usage.returncode == 2 and "--grace needs seconds" in usage.stderr
    assert subprocess.run([pod_init_bin, "--"], capture_output=True).returncode == 2


def test_a_child_that_fails_before_its_exec_says_why():
    """The child once exited 126 without a word when PR_SET_PDEATHSIG failed."""
    from pyinit import _native

    lines: list[str] = []
    code = _native.supervise(["true"], {}, parent_death_signal=999, on_log=lines.append)
    assert code == 126
    assert lines == ["prctl(PR_SET_PDEATHSIG) before running 'true': Invalid argument"]


SELF_TERM = """
import os, signal, sys
from pyinit import _native
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
said, sent = [], []
def on_tick():
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
answers = {"outside": lambda sig: True, "own": lambda sig: False, "none": lambda sig: None,
           "raises": lambda sig: 1 / 0}
code = _native.supervise(["sleep", "60"], {}, grace_s=30, tick_s=0.1, on_tick=on_tick,
                         on_signal=answers[sys.argv[1]], on_log=said.append)
print(code, said)
"""


@pytest.mark.parametrize("sender", ["outside", "own", "none", "raises"])
def test_a_signal_the_caller_calls_its_own_is_forwarded_without_a_line(sender):
    """pyinit run ends its agent with a TERM of its own (at --join-timeout, for a
    node that went away) and says why; the supervisor also called it a
    forwarded stop. Only an explicit False keeps the line unsaid: a callback
    that returns nothing, or fails (reported as unraisable), leaves it said."""
    result = subprocess.run([sys.executable, "-c", SELF_TERM, sender], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = ["forwarded TERM to the command; KILL in 30000 ms if it has not ended"]
    assert result.stdout == f"143 {[] if sender == 'own' else said}\n"
    assert ("ZeroDivisionError" in result.stderr) == (sender == "raises"), result.stderr


def test_not_pid_1_it_is_a_subreaper_for_orphans(pod_init_bin, tmp_path):
    # The orphan's parent once its own parent has exited: pod-init, not the system's init.
    pid_file = tmp_path / "orphan.pid"
    script = (
        f"sh -c 'sleep 2 & echo $! > {pid_file}'; sleep 0.3; "
        f"grep ^PPid: /proc/$(cat {pid_file})/status"
    )
    proc = subprocess.Popen(
        [pod_init_bin, "--", "sh", "-c", script], stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out.split() == ["PPid:", str(proc.pid)]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare")
def test_pid_1_of_a_namespace_is_not_the_machine_init(pod_init_bin):
    """Without --, as PID 1 of a namespace pod-init must not try to boot the machine."""
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    result = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", pod_init_bin, "topo", "--no-bar0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "started as the machine's init" not in result.stdout
    assert result.returncode in (0, 1)


def test_tini_flags_remap_an_exit_status_and_signal_the_group(pod_init_bin, tmp_path):
    assert subprocess.run([pod_init_bin, "-e", "3", "--", "sh", "-c", "exit 3"]).returncode == 0
    assert subprocess.run([pod_init_bin, "-e", "3", "--", "sh", "-c", "exit 4"]).returncode == 4
    # -g: a TERM reaches the grandchild too, which a plain forward to the shell would not.
    marker = tmp_path / "grandchild-got-term"
    script = f"trap 'touch {marker}; exit 0' TERM; while :; do sleep 0.05; done"
    proc = subprocess.Popen([pod_init_bin, "-g", "-v", "--", "sh", "-c", f"sh -c \"{script}\"; :"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert marker.exists(), err
    assert err.count("forwarded TERM") == 1, err  # one line per signal, with -v too
    assert "forwarded TERM to the command's process group; KILL in" in err
    bad = subprocess.run([pod_init_bin, "-e", "300", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 2 and "-e needs an exit status from 0 to 255" in bad.stderr


def test_version_and_per_command_help(pod_init_bin):
    version = subprocess.run([pod_init_bin, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("pod-init ")
    for command in ("topo", "nccl", "read", "modules", "params", "bringup"):
        proc = subprocess.run([pod_init_bin, command, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0
        assert proc.stdout.startswith(f"usage: pod-init {command} "), proc.stdout
        assert "exit status:" in proc.stdout
