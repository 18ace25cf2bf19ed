"""Both command lines: usage errors, exit codes, and that they print the same."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from conftest import run


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["bogus"],
        ["topo", "--frobnicate"],
        ["topo", "--expect-gpus"],
        ["topo", "--expect-gpus", "-1"],
        ["topo", "--expect-gpus", "many"],
        ["topo", "--sysfs-root"],
    ],
)
def test_usage_errors_exit_2(pod_init_bin, pyinit_bin, args):
    for tool in (pod_init_bin, pyinit_bin):
        proc = run([tool, *args])
        assert proc.returncode == 2, (tool, args, proc.stderr)
        assert proc.stdout == ""
        assert "usage:" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_help_exits_0(pod_init_bin, pyinit_bin):
    for tool in (pod_init_bin, pyinit_bin):
        proc = run([tool, "topo", "--help"])
        assert proc.returncode == 0 and "--sysfs-root" in proc.stdout


def test_both_commands_print_the_same(pod_init_bin, pyinit_bin, eightgpu_tree):
    outputs = {}
    for tool in (pod_init_bin, pyinit_bin):
        for fmt in ([], ["--json"]):
            extra = ["--no-nvml"] if tool.name == "pyinit" else []
            proc = run([tool, "topo", "--sysfs-root", eightgpu_tree, *extra, *fmt])
            assert proc.returncode == 1
            outputs[(tool.name, bool(fmt))] = proc.stdout
    native_doc = json.loads(outputs[("pod-init", True)])
    python_doc = json.loads(outputs[("pyinit", True)])
    native_doc.pop("scan_seconds"), python_doc.pop("scan_seconds")
    assert python_doc.pop("nvml") is None  # --no-nvml: pyinit adds nothing
    assert native_doc == python_doc

    def without_timing(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if not line.startswith("Scanned"))

    assert without_timing(outputs[("pod-init", False)]) == without_timing(
        outputs[("pyinit", False)]
    )


def test_human_output_has_matrix_legend_and_findings(pod_init_bin, eightgpu_tree):
    text = run([pod_init_bin, "topo", "--sysfs-root", eightgpu_tree]).stdout
    header = text.splitlines()[0].split()
    assert header[:3] == ["GPU0", "GPU1", "GPU2"] and header[-4:] == [
        "CPU",
        "Affinity",
        "NUMA",
        "Affinity",
    ]
    assert text.splitlines()[1].split()[:3] == ["GPU0", "X", "PIX"]
    assert "PIX  = Connection traversing at most one PCIe switch" in text
    assert "error   BAR1_SMALL           0000:84:00.0" in text
    assert "GPU5   0000:84:00.0  10de:2335  x16 @ 32 GT/s (max x16 @ 32 GT/s)  BAR1 256 MiB" in text


def test_pod_init_is_fully_static(pod_init_bin):
    data = pod_init_bin.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # 64-bit
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    pt_interp, pt_dynamic = 3, 2
    assert pt_interp not in types and pt_dynamic not in types


def test_closed_pipe_is_quiet(pyinit_bin, eightgpu_tree):
    # `true` has exited long before Python starts writing: the write meets EPIPE.
    proc = subprocess.run(
        f"'{pyinit_bin}' topo --no-nvml --json --sysfs-root '{eightgpu_tree}' | true",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stderr == ""


def test_every_help_page_ends_with_its_exit_statuses(pyinit_bin, pod_init_bin):
    from pyinit.cli import COMMANDS
    from pyinit.commands.check import NAGIOS_STATUS
    from pyinit.errors import EXIT_STATUS_HELP, exit_status_help

    pages = [[], *([n] for n in COMMANDS), *(["bench", k] for k in COMMANDS["bench"][0]),
             *(["warm", k] for k in COMMANDS["warm"][0])]  # fmt: skip
    plain = exit_status_help("0", "1", "2")
    tables = {(): EXIT_STATUS_HELP, ("check",): NAGIOS_STATUS,
              ("run",): exit_status_help("0", "1", "2", "N", "124")}  # fmt: skip
    for page in pages:
        text = run([pyinit_bin, *page, "--help"]).stdout
        table = tables.get(tuple(page), plain)
        assert text.rstrip().endswith(table), page
        assert not any(line.count("(default") > 1 for line in text.splitlines()), page
        assert "(default: )" not in text, page
    for page in (["warm"], ["shard"], ["report"]):  # they stall no run and supervise nothing
        assert "124" not in run([pyinit_bin, *page, "--help"]).stdout
    for page in ([], ["topo"], ["nccl"], ["read"], ["modules"], ["params"], ["bringup"], ["-v"]):
        assert run([pod_init_bin, *page, "--help"]).stdout.rstrip().endswith(EXIT_STATUS_HELP)


def test_version_goes_to_stdout(pyinit_bin):
    done = run([pyinit_bin, "--version"])
    assert done.returncode == 0 and done.stdout.startswith("pyinit ") and done.stderr == ""


def test_a_quick_end_runs_atexit_and_flushes_what_is_buffered():
    """exit_now skips the interpreter's teardown, not what a program expects
    of its end: atexit's functions and the block-buffered output to a pipe."""
    script = """
import atexit, sys
from pyinit.process_end import exit_now
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("buffered line\\n")
sys.stderr.write("to stderr\\n")
exit_now(3)
print("not reached")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == "buffered line\natexit ran\n"
    assert proc.stderr == "to stderr\n"


def test_commands_that_end_at_once_print_everything_into_a_pipe(pyinit_bin, eightgpu_tree):
    """topo ends without the teardown; its output to a pipe (block-buffered) is whole."""
    args = ["topo", "--sysfs-root", str(eightgpu_tree), "--no-bar0", "--no-nvml", "--json"]
    proc = run([pyinit_bin, *args])
    assert proc.returncode in (0, 1), proc.stderr
    gpus = [d for d in json.loads(proc.stdout)["devices"] if d.get("kind") == "gpu"]
    assert len(gpus) == 8
