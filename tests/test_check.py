"""`pyinit check`: Nagios' exit codes on the bundled fixtures, a deadline no
probe can overstay (a FIFO where a sysfs file should be, an NVML that never
answers), and the kernel log's Xids classified by NVIDIA's catalog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sysfs_fixtures

from pyinit.health.xid import CATALOG, classify, parse_kernel_line

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "tests" / "data" / "h200x2-nvml.json"

# Kernel log lines as the driver writes them (dmesg's text), one per Xid, then a
# number outside the catalog and a line that is not an Xid.
KERNEL_LOG = (ROOT / "tests" / "data" / "kernel-xids.log").read_text()
EXPECTED = {13: "restart_app", 31: "restart_app", 43: "restart_app", 45: "restart_app",
            48: "reset_gpu", 63: "reset_gpu", 64: "check_hardware", 74: "reset_gpu",
            79: "reboot_node", 92: "check_hardware", 94: "restart_app", 95: "reset_gpu",
            119: "reset_gpu", 999: "unknown"}  # fmt: skip


def check(pyinit_bin, *args, timeout=60):
    began = time.monotonic()
    done = subprocess.run([pyinit_bin, "check", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    return done, time.monotonic() - began


def test_xids_classify_as_the_catalog_says_and_unknown_ones_stay():
    events = [e for e in map(parse_kernel_line, KERNEL_LOG.splitlines()) if e is not None]
    assert {e.xid: e.action for e in events} == EXPECTED  # the nvme line is not an Xid
    assert len({e.xid for e in events if e.action != "unknown"}) >= 10
    fallen = next(e for e in events if e.xid == 79)
    assert fallen.device == "0000:9a:00" and fallen.text.endswith("GPU has fallen off the bus.")
    assert classify(999) == "unknown" and all(classify(x) == a for x, (_, a) in CATALOG.items())


def test_healthy_fixture_is_ok(pyinit_bin, h200x2_tree, tmp_path):
    (tmp_path / "dmesg.txt").write_text("[ 1.0] nothing to see\n")
    done, _ = check(pyinit_bin, "--sysfs-root", h200x2_tree, "--nvml-replay", REPLAY,
                    "--expect-gpus", "2", "--kmsg", tmp_path / "dmesg.txt")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("POD-INIT CHECK OK |") and len(done.stdout.splitlines()) == 1


def test_a_node_without_gpus_or_nvml_is_ok_and_says_what_it_skipped(
    pyinit_bin, tmp_path, monkeypatch
):
    tree = sysfs_fixtures.SysfsTree(tmp_path / "sys")  # no GPU: nothing bound to the nvidia driver
    (tmp_path / "dmesg.txt").write_text("")
    # The loader stops at the first libnvidia-ml it finds, this one, which is no
    # library: NVML cannot load here, even on a machine with the driver.
    (tmp_path / "libnvidia-ml.so.1").write_text("not a library\n" * 100)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    done, _ = check(pyinit_bin, "--sysfs-root", tree.root, "--kmsg", tmp_path / "dmesg.txt")
    assert done.returncode == 0, done.stdout + done.stderr
    first, *rest = done.stdout.splitlines()
    assert first.startswith("POD-INIT CHECK OK - skipped: nvml | seconds="), done.stdout
    assert rest and rest[0].startswith("OK nvml SKIPPED: no GPU bound to the nvidia driver; ")


def test_damaged_fixture_is_critical_with_the_reason_first(pyinit_bin, eightgpu_tree, tmp_path):
    (tmp_path / "dmesg.txt").write_text("")
    done, _ = check(pyinit_bin, "--sysfs-root", eightgpu_tree, "--kmsg", tmp_path / "dmesg.txt",
                    "--json")  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["state"] == "CRITICAL"
    assert document["summary"].startswith("POD-INIT CHECK CRITICAL - 4 critical")
    assert "LINK_WIDTH_DEGRADED 0000:83:00.0" in document["summary"]
    codes = {(p["probe"], p["code"], p["device"]) for p in document["problems"]}
    assert ("topology", "LINK_WIDTH_DEGRADED", "0000:83:00.0") in codes


def test_xids_in_the_kernel_log_are_shown_with_their_action(pyinit_bin, h200x2_tree, tmp_path):
    (tmp_path / "dmesg.txt").write_text(KERNEL_LOG)
    done, _ = check(pyinit_bin, "--sysfs-root", h200x2_tree, "--nvml-replay", REPLAY,
                    "--kmsg", tmp_path / "dmesg.txt")  # fmt: skip
    assert done.returncode == 2, done.stdout
    lines = done.stdout.splitlines()
    assert "CRITICAL xid XID_79 0000:9a:00: GPU has fallen off the bus: reboot the node" in lines
    assert "WARNING xid XID_13 0000:3b:00: graphics engine exception" in done.stdout
    assert any(line.startswith("CRITICAL xid XID_999 0000:cb:00: unknown Xid") for line in lines)


def test_a_probe_that_never_answers_is_unknown_within_the_deadline(pyinit_bin, tmp_path):
    tree = sysfs_fixtures.build_h200x2(tmp_path / "sys").root
    block = tree / "class" / "block" / "nvme0n1"
    block.mkdir(parents=True, exist_ok=True)
    os.mkfifo(block / "ro")  # a read that blocks: no writer, ever
    slow = json.loads(REPLAY.read_text())
    slow["delay_s"] = 3600  # an NVML that never answers
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    done, seconds = check(pyinit_bin, "--sysfs-root", tree, "--nvml-replay", tmp_path / "slow.json",
                          "--kmsg", "/dev/null", "--deadline", "1")  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert seconds < 4  # the deadline, and interpreter start-up; never the hung reads
    lines = done.stdout.splitlines()
    assert "UNKNOWN nvme PROBE_TIMEOUT: no answer within the 1 s deadline" in lines
    assert "UNKNOWN nvml PROBE_TIMEOUT: no answer within the 1 s deadline" in lines
    assert lines[0].startswith("POD-INIT CHECK UNKNOWN - 2 unknown")


@pytest.mark.parametrize("args", [["--deadline", "0"], ["--colour"], ["--expect-gpus", "x"]])
def test_bad_usage_is_unknown(pyinit_bin, args):
    done, _ = check(pyinit_bin, *args)
    assert done.returncode == 3 and "pyinit check:" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_kernel_log_is_read_without_blocking():
    """/dev/kmsg blocks a plain read at the end of its records; the reader
    stops there instead. Needs root (kernel.dmesg_restrict)."""
    from pyinit.health.xid import read_kernel_log

    if os.geteuid() != 0 or not Path("/dev/kmsg").exists():
        pytest.skip("reading /dev/kmsg needs root and the device")
    began = time.monotonic()
    events = read_kernel_log("/dev/kmsg")
    assert time.monotonic() - began < 5 and all(e.source == "kmsg" for e in events)


def test_a_drain_that_cannot_reach_slurm_is_one_line_and_keeps_the_status(pyinit_bin, tmp_path):
    import shutil

    if shutil.which("scontrol") is None:
        pytest.skip("no scontrol (./bootstrap test installs slurm-client)")
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    done = subprocess.run([pyinit_bin, "check", "--slurm-drain", "--slurm-node", "gpu-07",
                           "--expect-gpus", "8", "--kmsg", os.devnull], capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 2  # CRITICAL, as without --slurm-drain
    assert done.stdout.startswith("POD-INIT CHECK CRITICAL")
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyinit check: could not drain gpu-07: ")


class StandInGpus:
    """_native.NvmlGpus as a test sets it up: `initialise` runs in the thread
    that opens NVML, and its return value is open()'s ('' or a problem)."""

    initialise = None

    def open(self, library):
        return type(self).initialise()


def test_nvml_starts_early_in_its_own_thread_and_open_waits_for_it(monkeypatch):
    """`pyinit check` starts nvmlInit before its imports; the backend's open()
    must take that init once finished, and report it when it failed."""
    import threading

    from pyinit import _native, nvml

    calls = []
    released = threading.Event()

    def initialise():
        calls.append(threading.current_thread().name)
        released.wait(5)  # the driver's slow first init
        return "nvmlInit: Driver Not Loaded"

    monkeypatch.setattr(StandInGpus, "initialise", staticmethod(initialise))
    monkeypatch.setattr(_native, "NvmlGpus", StandInGpus)
    monkeypatch.setattr(nvml, "_early_init", None)
    nvml.begin_driver_init()
    opened = []
    opener = threading.Thread(target=lambda: opened.append(_open_error(nvml)))
    opener.start()
    opener.join(0.3)
    assert opener.is_alive() and calls == ["nvml-init"]  # open() waits for the early init
    released.set()
    opener.join(5)
    assert calls == ["nvml-init"]  # taken, not started again
    assert opened == ["NVML did not initialise: nvmlInit: Driver Not Loaded"]
    assert _open_error(nvml) == opened[0] and calls == ["nvml-init"] * 2  # the next one inits


def test_an_early_init_no_open_took_is_waited_for_before_the_command_ends(monkeypatch):
    """A command that ends before it opens NVML (its --help, a usage error)
    waits for the early init first: the process's exit would run the
    library's destructors under a thread still inside nvmlInit."""
    import threading

    from pyinit import _native, cli, nvml

    finished = threading.Event()

    def initialise():
        time.sleep(0.3)  # the driver's slow first init
        finished.set()
        return ""

    monkeypatch.setattr(StandInGpus, "initialise", staticmethod(initialise))
    monkeypatch.setattr(_native, "NvmlGpus", StandInGpus)
    monkeypatch.setattr(nvml, "_early_init", None)
    for argv in (["run", "--no-such-option"], ["check", "--help"]):
        finished.clear()
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert finished.is_set(), argv
        assert nvml._early_init is None


def test_the_driver_s_threads_take_no_signal_sent_to_the_process(monkeypatch):
    """nvmlInit (driver 580) starts a thread of libcuda's, which inherits the
    caller's signal mask: open there, it took the TERM and Ctrl-C meant for
    pyinit run's sigtimedwait (on an H200 node). Here nvmlInit starts a
    thread as the driver's does, through both ways NVML is initialised."""
    import signal
    import threading

    from pyinit import _native, nvml

    masks, callers = [], []
    caller = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    as_it_was = sum(1 << (sig - 1) for sig in caller)
    caller_status = f"/proc/self/task/{threading.get_native_id()}/status"  # this thread's

    def caller_mask() -> int:
        with open(caller_status) as status:
            return int(next(line for line in status if line.startswith("SigBlk:")).split()[1], 16)

    def initialise():
        driver = threading.Thread(target=lambda: masks.append(
            signal.pthread_sigmask(signal.SIG_BLOCK, [])))  # fmt: skip
        driver.start()
        driver.join()
        # A driver that hangs here leaves the caller's mask as it was (TERM and
        # Ctrl-C open in a command's main thread): it is back while this init runs.
        deadline = time.monotonic() + 10
        while caller_mask() != as_it_was and time.monotonic() < deadline:
            time.sleep(0.01)
        callers.append(caller_mask())
        return ""

    monkeypatch.setattr(StandInGpus, "initialise", staticmethod(initialise))
    monkeypatch.setattr(_native, "NvmlGpus", StandInGpus)
    monkeypatch.setattr(nvml, "_early_init", None)
    nvml.begin_driver_init()
    nvml.DriverNvml().open()  # takes the early init
    nvml.DriverNvml().open()  # initialises again, in a thread of its own
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == caller  # the caller's mask is back
    process_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                       signal.SIGCHLD, signal.SIGUSR1}  # fmt: skip
    assert len(masks) == 2 and all(process_signals <= mask for mask in masks), masks
    assert not any(signal.SIGSEGV in mask for mask in masks)  # a fault is still the thread's
    assert callers == [as_it_was] * 2, (callers, caller)


def _open_error(nvml):
    try:
        nvml.DriverNvml().open()
    except nvml.NvmlUnavailable as e:
        return str(e)
    return None


def test_the_check_imports_no_view_of_the_tree(eightgpu_tree, tmp_path):
    """The scan's findings are all the check reads of it: the dataclasses
    over the tree (pyinit.topology) took 11 ms of a check on an H200 host."""
    code = ("import sys, pyinit.cli as c\n"
            "status = c.main(sys.argv[1:])\n"
            "print(status, 'pyinit.topology' in sys.modules)")  # fmt: skip
    argv = ["check", "--sysfs-root", eightgpu_tree, "--kmsg", os.devnull, "--no-nvml"]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("POD-INIT CHECK CRITICAL"), done.stdout + done.stderr
    assert lines[-1] == "2 False"
