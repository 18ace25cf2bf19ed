"""The second hostile sweep's fault cases, beside test_hostile.py's table:
crashes (a deep host list, a file shrinking under the page-cache reader, a
background save never waited for, a full disk under the run folder, a file
the user named on a full or read-only filesystem, a writer shared by
threads, a benchmark stopped by a plain kill), silent losses, injections
into nccl.env, and verdicts a hostile peer or log could once turn. Each
asserts the exit status, the one line, no traceback, nothing half-written
and nothing left running."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import fill, run
from test_hostile import children_of, kill_9_leaves_nothing, zombie

TRAIN_STEPS = """
import torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({steps}):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
print("trained", flush=True)
"""


def one_clean_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not any(c < " " and c not in "\n" for c in proc.stderr), repr(proc.stderr)
    return proc.stderr


@pytest.mark.parametrize("nodelist", ["10.0.0.1" + "[1]" * 20_000, "n[0-9]" * 6])
def test_a_hostile_slurm_node_list_is_one_line_not_a_crash(pyinit_bin, tmp_path, nodelist):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    env = {**os.environ, "SLURM_JOB_NODELIST": nodelist, "SLURM_NODEID": "0"}
    proc = run([pyinit_bin, "run", "--run-dir", tmp_path / "run", "--", script], env=env)
    assert proc.returncode == 2, proc.stderr  # once 139, a segfault
    assert "expands to" in one_clean_line(proc)
    assert len(proc.stderr) < 600 and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("env", "said"), [
    ({"SLURM_JOB_NODELIST": "a", "SLURM_STEP_TASKS_PER_NODE": "x" * 10_000}, "is not COUNT or"),
    ({"SLURM_JOB_NODELIST": "a", "SLURM_STEP_TASKS_PER_NODE": "1\x1b[31m"}, "\\x1b[31m"),
    ({"SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "8"}, "runs 8 tasks on"),
    ({"SLURM_JOB_NODELIST": "localhost,pyinit-no-such-node.invalid"}, "does not resolve"),
    ({"MASTER_ADDR": "10.1.0.5", "WORLD_SIZE": "2", "MASTER_PORT": "65535"}, "is not a port"),
    ({"MASTER_ADDR": "10.1.0.5", "PET_NNODES": "1:4"}, "a range of nodes"),
    ({"MASTER_ADDR": "10.1.0.5", "WORLD_SIZE": "2", "RANK": "5"}, "RANK=5 does not fit 2"),
])  # fmt: skip
def test_a_bad_node_environment_is_one_line(pyinit_bin, tmp_path, env, said):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))} | env
    proc = run([pyinit_bin, "run", "--run-dir", tmp_path / "run", "--", script], env=env)
    assert proc.returncode == 2, proc.stderr
    assert said in one_clean_line(proc) and proc.stderr.count("\n") == 1, proc.stderr
    assert len(proc.stderr) < 600 and not (tmp_path / "run").exists()


def test_control_bytes_of_a_node_list_are_escaped(pyinit_bin, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    env = {**os.environ, "SLURM_JOB_NODELIST": "a[1-2]\x1b[31m", "SLURM_NODEID": "0"}
    proc = run([pyinit_bin, "run", "--run-dir", tmp_path / "run", "--", script], env=env)
    assert proc.returncode == 2
    assert "\\x1b[31m" in one_clean_line(proc)


def test_the_page_cache_reader_survives_a_file_shrinking_under_it(tmp_path):
    """mincore() said resident, then the copy from the mapping met a page past
    the new end: SIGBUS. The copies are preads now: ENODATA, as page_cache=False."""
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1 << 20))
    code = f"""
import errno, os, threading, time
from pyinit.io import DirectReader
path = {str(data)!r}
open(path, "rb").read()  # resident
reader = DirectReader(path, page_cache=True)  # opened whole: every window below is valid
stop = time.monotonic() + 2
def shrink():
    fd = os.open(path, os.O_RDWR)
    while time.monotonic() < stop:
        os.ftruncate(fd, 4096)
        os.ftruncate(fd, 1 << 20)
threading.Thread(target=shrink).start()
errors = set()
with reader:
    while time.monotonic() < stop:
        try:
            reader.read_batch([4096 * i for i in range(1, 200)], 4096)
        except OSError as e:
            errors.add(e.errno)
print(sorted(errors - {{errno.ENODATA}}))
"""
    proc = run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, f"status {proc.returncode}: {proc.stderr}"  # -7: SIGBUS
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_writer_changes_threads_but_is_never_used_by_two_at_once(tmp_path):
    from pyinit.io import DirectWriter

    # Made in one thread, used only in another: a hand-off, not a second user.
    handed = tmp_path / "handed.bin"
    writer = DirectWriter(handed, queue_depth=4)
    errors: list[BaseException] = []

    def use() -> None:
        try:
            writer.write(b"h" * (3 << 20))
            writer.commit()
        except BaseException as error:  # the test reports it
            errors.append(error)

    thread = threading.Thread(target=use)
    thread.start()
    thread.join()
    assert errors == [] and handed.read_bytes() == b"h" * (3 << 20)
    # Another thread while this one's writes are in flight on a ring of this
    # thread's (io_uring's single issuer, Linux 6.1): refused, whole.
    target = tmp_path / "out.bin"
    writer = DirectWriter(target, queue_depth=4)
    writer.write(b"x" * (2 << 20))  # whole staging blocks: written, in flight

    def other() -> None:
        for call in (lambda: writer.write(b"y" * 10), writer.commit, writer.abort):
            try:
                call()
            except ValueError as e:
                errors.append(e)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    if errors:
        assert len(errors) == 3
        assert all(f"{target}: " in str(e) and "writes of the thread that issued them are in "
                   "flight" in str(e) for e in errors)  # fmt: skip
        writer.commit()  # the owner's writes were never disturbed
        assert target.read_bytes() == b"x" * (2 << 20)
    else:  # a ring any thread may submit to (older kernels), or the pread pool
        assert target.read_bytes() == b"x" * (2 << 20) + b"y" * 10


def test_a_writer_hammered_from_threads_refuses_them_and_does_not_crash(tmp_path):
    code = f"""
import threading
from pyinit.io import DirectWriter
w = DirectWriter({str(tmp_path / "out.bin")!r}, queue_depth=2)
refused, written, committed = [], [], []
all_written, turn = threading.Barrier(5), threading.Lock()
def use(byte):
    for _ in range(200):
        try:
            w.write(byte * (1 << 16))
            written.append(byte)
        except ValueError:
            refused.append(byte)
    all_written.wait()  # every thread alive, so that the one whose writes are in flight commits
    with turn:  # one at a time: the thread whose ring holds the last writes commits
        try:
            w.commit()
            committed.append(byte)
        except ValueError:
            pass
threads = [threading.Thread(target=use, args=(b"z",)) for _ in range(4)]
for t in threads: t.start()
use(b"a")
for t in threads: t.join()
print(written.count(b"a"), written.count(b"z"), len(refused), len(committed))
"""
    proc = run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr  # once SIGSEGV or "free(): invalid pointer"
    mine, theirs, refused, committed = map(int, proc.stdout.split())
    assert mine + theirs + refused == 1000 and refused > 0 and committed == 1
    data = (tmp_path / "out.bin").read_bytes()
    # Whole calls, never torn: every accepted write's bytes, and only those.
    assert data.count(b"a") == mine << 16 and data.count(b"z") == theirs << 16
    assert all(data[i : i + (1 << 16)] in (b"a" * (1 << 16), b"z" * (1 << 16))
               for i in range(0, len(data), 1 << 16))  # fmt: skip


def save_script(path: Path, target: Path) -> None:
    path.write_text(f"""
import torch
from pyinit import checkpoint
checkpoint.save({{"w": torch.arange(1 << 20, dtype=torch.float32)}}, {str(target)!r},
                background=True)
print("left without waiting", flush=True)
""")


def test_a_background_save_never_waited_for_is_written_before_exit(tmp_path):
    script, target = tmp_path / "save.py", tmp_path / "ckpt" / "model.safetensors"
    target.parent.mkdir()
    save_script(script, target)
    proc = run([sys.executable, script], timeout=120)
    assert proc.returncode == 0, proc.stderr  # once 134: "terminate called ..."
    from pyinit import checkpoint

    assert checkpoint.load(target)["w"][-1].item() == (1 << 20) - 1


@pytest.mark.slow
def test_under_pyinit_run_a_background_save_is_written_or_its_failure_said(pyinit_bin, tmp_path):
    script, target = tmp_path / "save.py", tmp_path / "ckpt" / "model.safetensors"
    target.parent.mkdir()
    save_script(script, target)
    proc = run([pyinit_bin, "run", "--nproc-per-node", "1", "--monitor-interval", "0",
                "--run-dir", tmp_path / "run", "--", script], timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert target.is_file()  # once exit 0 and no file
    # A save that fails in its thread and is never waited for: one line, exit 1.
    save_script(script, tmp_path / "no-such-folder" / "model.safetensors")
    proc = run([pyinit_bin, "run", "--nproc-per-node", "1", "--monitor-interval", "0",
                "--run-dir", tmp_path / "run2", "--", script], timeout=180)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "model.safetensors: the background save failed: " in proc.stderr


@pytest.mark.root
@pytest.mark.slow
def test_a_full_disk_under_the_run_folder_does_not_stop_training(
    small_filesystem, pyinit_bin, tmp_path
):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_STEPS.format(steps=3000))
    run_dir = small_filesystem / "run"
    proc = subprocess.Popen([pyinit_bin, "run", "--nproc-per-node", "1", "--monitor-interval",
                             "0", "--run-dir", run_dir, "--", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    steps = run_dir / "steps" / "rank-0.bin"
    while not (steps.exists() and steps.stat().st_size > 0):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    fill(small_filesystem)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err  # once ENOSPC out of optimizer.step()
    assert "trained" in out
    assert "Traceback" not in err
    lost = [line for line in err.splitlines() if "step records of" in line]
    # A record the full disk cut is named too: "...device (a record cut at 32 bytes); ..."
    assert len(lost) == 1 and "No space left on device" in lost[0], err
    assert lost[0].endswith("; training goes on"), err
    assert len(steps.read_bytes()) % 40 == 0  # whole records only
    (small_filesystem / "filler").unlink()
    report = run([pyinit_bin, "report", run_dir, "--out", tmp_path / "report.html"])
    assert report.returncode == 0, report.stderr
    assert "rank 0's step records stop (attempt 0 from step" in report.stdout, report.stdout


# Commands that write a file the user names ({out}), on a full filesystem and
# a read-only one: the line names that file (not a temporary name, and a
# buffered write's error names none), and no part of it is left.
WRITES = {
    "timeline --json": (["pyinit", "timeline", "{events}", "--json", "{out}"], "{out}"),
    "monitor --out": (["pyinit", "monitor", "--once", "--interval", "0.1", "--out", "{out}"],
                      "{out}"),
    "nccl --out": (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{out}"], "{out}"),
    "bench io --loop": (["pyinit", "bench", "io", "--loop", "64M", "--loop-dir", "{dir}",
                         "--no-fio"], "{dir}"),
}  # fmt: skip


@pytest.mark.root
@pytest.mark.parametrize("command", WRITES)
@pytest.mark.parametrize("trouble", ["full", "read-only"])
def test_a_file_that_cannot_be_written_is_named_and_left_out(
    command, trouble, small_filesystem, pyinit_bin, eightgpu_tree, tmp_path
):
    from test_timeline import EVENTS

    argv, named = WRITES[command]
    if trouble == "full":
        fill(small_filesystem)
    else:
        subprocess.run(["mount", "-o", "remount,ro", small_filesystem], check=True)
    try:
        values = {"events": EVENTS, "sys": eightgpu_tree, "dir": small_filesystem,
                  "out": small_filesystem / "out.json"}  # fmt: skip
        words = [str(w).format(**values) for w in argv]
        words[0] = str(pyinit_bin.with_name(words[0]))
        proc = run(words, timeout=120)
        before = {"full": ["filler", "lost+found"], "read-only": ["lost+found"]}[trouble]
        left = sorted(os.listdir(small_filesystem))
    finally:
        if trouble != "full":
            subprocess.run(["mount", "-o", "remount,rw", small_filesystem], check=True)
    assert proc.returncode == 1, proc.stderr
    said = {"full": "No space left on device", "read-only": "Read-only file system"}[trouble]
    prefix = f"{Path(words[0]).name}: {named.format(**values)}: "
    lines = [line for line in one_clean_line(proc).splitlines() if line.startswith(prefix)]
    assert len(lines) == 1 and (said in lines[0] or "is free" in lines[0]), proc.stderr
    if command == "monitor --out" and trouble == "full":
        before = sorted([*before, "out.json"])  # its log, opened to append: empty
        assert (small_filesystem / "out.json").stat().st_size == 0
    assert left == before


ALLREDUCE_RANKS = torch.cuda.device_count() or 2  # what bench allreduce starts by default

# Commands that start processes or attach devices, stopped by a plain `kill`
# (SIGTERM to the command alone, as a scheduler's cancel or systemd's stop
# may send it) once what they start is up: (argv, when it is up).
STOPPED = {
    "bench checkpoint --dcp": (
        ["bench", "checkpoint", "--dir", "{dir}", "--size", "2G", "--rounds", "20",
         "--device", "cpu", "--no-files", "--dcp", "--ranks", "2"],
        lambda pid, folder: len(children_of(pid)) >= 2 and any(folder.iterdir())),
    "bench allreduce (torchrun)": (  # a rank per GPU, or two on the CPU
        ["bench", "allreduce", "-b", "64M", "-e", "64M", "--iters", "100000", "--out", "{dir}"],
        lambda pid, folder: len(children_of(pid)) >= 1 + ALLREDUCE_RANKS),  # torchrun, workers
    "bench io --loop": (
        ["bench", "io", "--loop", "256M", "--loop-dir", "{dir}", "--no-fio", "--runtime", "5",
         "--rounds", "3"],
        lambda pid, folder: str(folder) in loop_backing_files()),
}  # fmt: skip


def loop_backing_files() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("command", STOPPED)
def test_a_stopped_command_ends_what_it_started_and_removes_its_files(
    command, pyinit_bin, tmp_path
):
    argv, up = STOPPED[command]
    folder = tmp_path / "work"
    folder.mkdir()
    proc = subprocess.Popen([pyinit_bin, *(w.format(dir=folder) for w in argv)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not up(proc.pid, folder):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    started = children_of(proc.pid)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err  # ended by the signal it was sent
    assert one_clean_line(proc_result(proc, err)).strip().splitlines()[-1] == (
        "pyinit: stopped by SIGTERM"), err  # fmt: skip
    alive = {p for p in started if Path(f"/proc/{p}").exists() and not zombie(p)}
    assert not alive, f"still running after pyinit ended: {alive}"
    assert str(folder) not in loop_backing_files()
    assert [p.name for p in folder.iterdir() if p.suffix != ".png"] == []


def proc_result(proc: subprocess.Popen, err: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


LEAVER = """
import os, subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
subprocess.Popen(sleeper)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["script", "program"])
def test_kill_9_of_pyinit_run_leaves_no_child_of_the_script(pyinit_bin, tmp_path, kind):
    """A subprocess, a double-forked setsid daemon, a --no-python program:
    all re-parent to the pod-init between pyinit run and torchrun, which
    KILLs them when pyinit run dies."""
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    program = ["--no-python", "--", sys.executable, str(script)]
    target = program if kind == "program" else ["--", str(script)]
    proc = subprocess.Popen([pyinit_bin, "run", "--nproc-per-node", "1", "--monitor-interval",
                             "0", "--run-dir", tmp_path / "run", *target],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    # pod-init, torchrun, the worker (and the program), the script's two sleepers
    while sum("time.sleep(600)" in cmdline(p) for p in children_of(proc.pid)) < 2:
        assert time.monotonic() < deadline, "the script's children did not start"
        time.sleep(0.2)
    kill_9_leaves_nothing(proc)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_pod_init_ends_what_the_command_left_after_the_grace(pod_init_bin, tmp_path):
    """tini leaves a TERM-ignoring grandchild running after it exits; pod-init,
    its subreaper, ends it: TERM, the grace, KILL."""
    marker = tmp_path / "pid"
    script = f"""
import os, signal, time
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open({str(marker)!r}, "w").write(str(os.getpid()))
    time.sleep(600)
while not os.path.exists({str(marker)!r}):
    time.sleep(0.01)
"""
    began = time.monotonic()
    proc = run([pod_init_bin, "--grace", "1", "--", sys.executable, "-c", script], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 1 <= time.monotonic() - began < 10
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or zombie(pid)


def test_nccl_env_is_quoted_for_the_shell(pod_init_bin, h200x2_tree, tmp_path):
    pwned = tmp_path / "PWNED"
    out = tmp_path / f"run dir $(touch {pwned}) 'q'"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    made = run([pod_init_bin, "nccl", "--sysfs-root", h200x2_tree, "--out", out], env=env)
    assert made.returncode == 0, made.stderr
    shown = run(["sh", "-c", 'set -a; . "$1"; printf %s "$NCCL_TOPO_FILE"', "sh",
                 out / "nccl.env"], env=env)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert not pwned.exists(), "sourcing nccl.env ran a command"
    assert shown.stdout == str(out / "nccl-topo.xml")
    # Plain values stay bare, as NCCL's own reader of /etc/nccl.conf needs them.
    assert "NCCL_SOCKET_IFNAME==" in (out / "nccl.env").read_text()


@pytest.mark.parametrize("tool", ["pod-init", "pyinit"])
def test_a_newline_in_an_nccl_value_is_refused(tool, pod_init_bin, pyinit_bin, h200x2_tree,
                                               tmp_path):  # fmt: skip
    binary = pod_init_bin if tool == "pod-init" else pyinit_bin
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["NCCL_SOCKET_IFNAME"] = "eth0\nLD_PRELOAD=/tmp/evil.so"
    proc = run([binary, "nccl", "--sysfs-root", h200x2_tree, "--out", tmp_path / "out"], env=env)
    assert proc.returncode == 2, proc.stderr
    assert "the environment: NCCL_SOCKET_IFNAME holds a newline or NUL byte" in one_clean_line(
        proc)  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("answer", [b"stall {bad\n", b"stall [1, 2]\n", b'stall {"count": "x"}\n',
                                    b"stall \xff\n", b"alive\n", b""])  # fmt: skip
def test_a_peer_answering_garbage_is_no_stall(answer):
    from pyinit.run.liveness import Liveness

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    own = Liveness("127.0.0.1", 0)
    own.port = port
    try:
        assert own.new_peer_stalls(["127.0.0.2", "127.0.0.1"], 0) == []
    finally:
        own.close()
        server.close()


def test_the_liveness_port_outlives_resets_and_askers_that_never_read():
    """Anyone on the network may connect to a node's liveness port. A
    connection reset before its answer (a port scan's) ended the thread that
    answers, with a traceback, and the node then looked gone to every other.
    Answers are sent one at a time: an asker that never read a stall verdict
    larger than its window held the port for 2 s, and a few in a row held it
    long enough for the other nodes to count this node as lost."""
    from pyinit.run.liveness import ANSWER_TIMEOUT_S, MAX_ANSWER, Liveness, stall_verdict

    own = Liveness("127.0.0.1", 0)
    address = own._sock.getsockname()
    own.start()
    silent = []
    try:
        for _ in range(20):
            conn = socket.create_connection(address)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset, not a close
        # 512 ranks stalled in frames of 10,000 characters: a verdict of 5 MB, more
        # than the kernel buffers for a connection.
        causes = [{"rank": rank, "where": f"train.py:{rank} in " + "f" * 10_000}
                  for rank in range(512)]  # fmt: skip
        own.report_stall({"count": 1, "node": 0, "causes": causes})
        for _ in range(3):
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect(address)
            silent.append(conn)
        began = time.monotonic()
        with socket.create_connection(address, timeout=60) as conn:
            line = conn.makefile("rb").readline()
        assert time.monotonic() - began < ANSWER_TIMEOUT_S  # none of the three held it
        assert len(line) <= MAX_ANSWER
        verdict = stall_verdict(line)
        assert verdict is not None and verdict["count"] == 1
        kept = len(verdict["causes"])
        assert 0 < kept < 512 and verdict["causes_left_out"] == 512 - kept
        assert verdict["causes"] == causes[:kept]
    finally:
        for conn in silent:
            conn.close()
        own.close()


def test_a_peer_sending_a_byte_at_a_time_is_no_answer():
    """Whatever listens on a peer's liveness port may answer a byte at a time.
    The socket's timeout was per read: the ask waited for 64 KiB of them, and
    with it the watch over every node and the end of the run, which asks
    who is gone."""
    from pyinit.run.liveness import Liveness

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):
            while not stop.wait(0.2):
                conn.sendall(b"a")

    threading.Thread(target=drip, daemon=True).start()
    own = Liveness("127.0.0.1", 0)
    own.port = server.getsockname()[1]
    try:
        began = time.monotonic()
        assert own.unreachable(["127.0.0.2", "127.0.0.1"], 0) == [1]  # no whole answer in 2 s
        assert time.monotonic() - began < 20
    finally:
        stop.set()
        own.close()
        server.close()


def test_silent_hosts_are_asked_at_once_beside_the_others():
    """A node asked the others one after the other, each for up to its
    limit: every host that was down (silence, no reset) added a whole limit
    to each round, delaying the watch over every node and the run's end."""
    from pyinit.run.liveness import Liveness

    live = Liveness("127.0.0.1", 0)
    port = live.port = live._sock.getsockname()[1]
    live.start()
    # Two hosts whose port takes the connection and never answers, and one refusing.
    silent = [socket.create_server((f"127.0.0.{n}", port)) for n in (2, 3)]
    own = Liveness("127.0.0.5", port)
    try:
        addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
        began = time.monotonic()
        assert own.unreachable(addresses, 4) == [1, 2, 3]  # within 2 s for all
        assert time.monotonic() - began < 3.5  # one after the other: 4 s and more
        assert own._ask_peers(addresses, 4, 2.0)[0] == b"alive\n"
    finally:
        for server in silent:
            server.close()
        own.close()
        live.close()


def test_a_peer_stall_verdict_is_taken():
    from pyinit.run.liveness import stall_verdict

    assert stall_verdict(b'stall {"count": 2, "causes": []}\n') == {"count": 2, "causes": []}


def test_the_liveness_port_binds_ipv6():
    from pyinit.run.liveness import Liveness

    if not socket.has_ipv6:
        pytest.skip("this kernel has no IPv6")
    try:
        own = Liveness("::1", 0)
    except OSError as e:
        pytest.skip(f"no ::1 here: {e}")
    own.close()


def test_check_says_critical_over_unknown(pyinit_bin, tmp_path):
    """One probe hung and an Xid 79: the node is drained (2), not UNKNOWN (3)."""
    import sysfs_fixtures

    tree = sysfs_fixtures.build_h200x2(tmp_path / "sys").root
    block = tree / "class" / "block" / "nvme0n1"
    block.mkdir(parents=True, exist_ok=True)
    os.mkfifo(block / "ro")  # the NVMe probe blocks in its read
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "NVRM: Xid (PCI:0000:9a:00): " + "9" * 5000 + ", pid=1, bogus\n"
        "NVRM: Xid (PCI:0000:9a:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    replay = Path(__file__).parent / "data" / "h200x2-nvml.json"
    proc = run([pyinit_bin, "check", "--sysfs-root", tree, "--nvml-replay", replay, "--kmsg", log,
                "--deadline", "1"])  # fmt: skip
    lines = proc.stdout.splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert lines[0].startswith("POD-INIT CHECK CRITICAL"), lines[0]
    assert any("XID_79" in line for line in lines)
    assert any("PROBE_TIMEOUT" in line for line in lines)


@pytest.mark.parametrize(
    ("command", "status", "said"),
    [(["nvml"], 1, "pyinit: NVML unavailable: GPU 1: nvmlDeviceGetPciInfo_v3: GPU is lost\n"),
     (["nvml", "--json"], 1,
      "pyinit: NVML unavailable: GPU 1: nvmlDeviceGetPciInfo_v3: GPU is lost\n"),
     (["topo", "--sysfs-root", "TREE"], 0, "pyinit: NVML unavailable (GPU 1: "
      "nvmlDeviceGetPciInfo_v3: GPU is lost); working from sysfs alone\n"),
     (["monitor", "--once", "--json"], 0, "")],
)  # fmt: skip
def test_a_gpu_lost_in_the_driver_s_nvml_is_one_line(pyinit_bin, h200x2_tree, nvml_stand_in,
                                                     tmp_path, command, status, said):  # fmt: skip
    """A GPU that fell off the bus answers NVML with "GPU is lost": each
    command names it in one line and carries on where it can; the monitor
    samples the other GPU."""
    from test_nvml_driver import RECORDING, replay_lines

    (tmp_path / "replay.txt").write_text(replay_lines(RECORDING, ["lost 1"]))
    env = {**os.environ, "NVML_REPLAY_FILE": str(tmp_path / "replay.txt"),
           "LD_LIBRARY_PATH": str(nvml_stand_in.parent / "driver")}  # fmt: skip
    words = [str(h200x2_tree) if word == "TREE" else word for word in command]
    proc = subprocess.run([pyinit_bin, *words], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert (proc.returncode, one_clean_line(proc)) == (status, said), proc.stdout[-2000:]
    if command[0] == "monitor":
        gpus = json.loads(proc.stdout)["gpus"]
        assert gpus[1] == {"gpu": 1, "error": "GPU 1: nvmlDeviceGetUUID: GPU is lost", "xid": []}
        assert gpus[0]["pci_bus_id"] == "0000:00:06.0"


def test_read_batch_past_the_end_is_a_value_error_not_a_huge_allocation(tmp_path):
    from pyinit.io import DirectReader

    data = tmp_path / "data"
    data.write_bytes(bytes(8192))
    with DirectReader(data) as reader, pytest.raises(ValueError, match="past the end"):
        reader.read_batch([0], 2**62)


def test_a_shard_whose_header_disagrees_with_its_set_is_refused(tmp_path):
    from pyinit.data import TokenShardDataset, shard
    from pyinit.data.shard_format import _LAYOUT

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"doc {i} " * 30}) + "\n" for i in range(200)))
    shard([str(source)], str(tmp_path / "s"), 3)
    victim = tmp_path / "s" / "shard-00001-of-00003.tok"
    raw = bytearray(victim.read_bytes())
    fields = list(_LAYOUT.unpack_from(raw))
    assert fields[8:10] == [1, 3]  # shard_index, shard_count
    fields[9] = 5
    _LAYOUT.pack_into(raw, 0, *fields)
    victim.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="says the set has 5 shards"):
        TokenShardDataset(tmp_path / "s", 8, 0, 1)


def test_printable_escapes_what_a_terminal_would_act_on():
    from pyinit.errors import printable

    assert printable("a\x1b[31mb\tc\x7f") == "a\\x1b[31mb\\x09c\\x7f"
    assert printable(os.fsdecode(b"x\xffy")) == "x\\xffy"
    assert printable("ünïcode ✓") == "ünïcode ✓"


# Each way a process with the core's reader threads can end: the threads are
# joined (or never outlive their owner) on every path, so none ends it with
# std::terminate ("terminate called without an active exception", SIGABRT).
THREAD_EXITS = {
    "a reader left open at exit": "r = DirectReader(PATH, queue_depth=32, backend='pread')\n"
                                  "r.read(0, 4096)\n",
    "a reader closed by the collector at exit": "rs = [DirectReader(PATH, backend='pread')]\n"
                                                "rs.append(rs)\n",
    "a reader open at sys.exit in a thread's run": (
        "import threading\nr = DirectReader(PATH, queue_depth=64, backend='pread')\n"
        "t = threading.Thread(target=lambda: [r.read(0, 4096) for _ in range(10**6)], "
        "daemon=True)\nt.start()\nsys.exit(0)\n"),
    "a reader open at os._exit": "r = DirectReader(PATH, backend='pread')\nos._exit(0)\n",
    # The interpreter's own thread closes it as it finalises: it takes the GIL back.
    "a stream in a generator left part-way at exit": (
        "def rows():\n    r = DirectReader(PATH, queue_depth=32)\n"
        "    with r.stream(list(range(0, 1 << 20, 4096)), 4096) as s:\n        yield from s\n"
        "g = rows()\nnext(g)\n"),
}  # fmt: skip


@pytest.mark.parametrize("how", sorted(THREAD_EXITS))
def test_the_readers_threads_never_abort_an_exit(tmp_path, how):
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1 << 20))
    script = ("import os, sys\nfrom pyinit.io import DirectReader\n"
              f"PATH = {str(data)!r}\n{THREAD_EXITS[how]}")  # fmt: skip
    for _ in range(5):
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        assert (result.returncode, result.stderr) == (0, ""), how


def pids_cgroup(tmp_name: str) -> Path | None:
    """A fresh cgroup of the pids controller (v2 or v1), or None without one."""
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids")):
        group = root / tmp_name
        try:
            group.mkdir()
        except OSError:
            continue
        if (group / "pids.max").exists():
            return group
        group.rmdir()
    return None


def test_a_reader_that_cannot_start_its_threads_is_an_error_not_an_abort(tmp_path):
    """Thread creation failing half-way (a pids cgroup's limit) once left
    the threads already started joinable as the constructor unwound."""
    group = pids_cgroup(f"pod-init-test-{os.getpid()}")
    if group is None:
        pytest.skip("no pids cgroup can be made here (cgroup pids controller)")
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1 << 16))
    script = (
        "import os, sys\nfrom pyinit.io import DirectReader\n"
        f"open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        f"open({str(group / 'pids.max')!r}, 'w').write('12')\n"
        "try:\n"
        f"    DirectReader({str(data)!r}, queue_depth=64, backend='pread')\n"
        "except OSError as error:\n"
        "    print(error.errno, error)\n"
    )  # fmt: skip
    try:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=60)  # fmt: skip
    finally:
        group.rmdir()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{errno.EAGAIN} ") and "pthread_create" in result.stdout


def test_a_block_stat_of_two_fields_is_no_device_not_a_crash(tmp_path):
    from pyinit.monitor import BlockStats

    for name, text in (("sda", "1 2\n"), ("nvme0n1", "10 0 80 3 0 0 0 0 0 4 3\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stat").write_text(text)
    stats = BlockStats(str(tmp_path))
    assert stats.read() == []  # a first reading: the baseline
    assert [row["device"] for row in stats.read()] == ["nvme0n1"]
