"""The node is scanned once per run: `pyinit run` reads each PCI config file
once (its preflight and its NCCL files share one scan), and none at all when
PID 1's folder describes this boot. Reads are counted with strace."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run, run_events

from pyinit import _native
from pyinit.boot_state import current_boot_id

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


def config_opens(command: list, tree: Path, tmp_path: Path) -> int:
    """How many times `command` and its children open a config file under `tree`.
    With --seccomp-bpf only openat stops the tracee: the imports run at full speed."""
    log = tmp_path / "strace.log"
    proc = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=openat", "-o", log,
                           *map(str, command)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    pattern = re.compile(rf'openat\(.*"{re.escape(str(tree))}/[^"]*/config"')
    return sum(1 for line in log.read_text().splitlines() if pattern.search(line))


def pyinit_run(pyinit_bin: Path, tree: Path, tmp_path: Path, *extra) -> list:
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    return [pyinit_bin, "run", "--sysfs-root", tree, "--nproc-per-node", "1",
            "--monitor-interval", "0", "--run-dir", tmp_path / "run", *extra,
            "--", script]  # fmt: skip


def write_boot_state(folder: Path, tree: Path, pod_init_bin: Path, boot_id: str) -> None:
    folder.mkdir()
    topo = run([pod_init_bin, "topo", "--json", "--no-bar0", "--sysfs-root", tree])
    (folder / "topology.json").write_text(topo.stdout)
    state = {"boot_id": boot_id, "sysfs_root": str(tree), "topology": "topology.json",
             "nccl": None, "timeline": []}  # fmt: skip
    (folder / "node.json").write_text(json.dumps(state))


@pytest.mark.slow
def test_a_run_scans_once_and_not_at_all_after_pid1(pod_init_bin, pyinit_bin, h200x2_tree,
                                                    tmp_path):  # fmt: skip
    one_scan = config_opens([pod_init_bin, "topo", "--sysfs-root", h200x2_tree],
                            h200x2_tree, tmp_path)  # fmt: skip
    assert one_scan > 0
    state = tmp_path / "state"
    command = pyinit_run(pyinit_bin, h200x2_tree, tmp_path, "--boot-state", state)
    # Preflight, GPU count and the NCCL files (the fixture has two GPUs) from one scan.
    assert config_opens(command, h200x2_tree, tmp_path) == one_scan
    nccl_env = (tmp_path / "run" / "nccl" / "nccl.env").read_text()
    assert "NCCL_TOPO_FILE=" in nccl_env

    write_boot_state(state, h200x2_tree, pod_init_bin, current_boot_id())
    assert config_opens(command, h200x2_tree, tmp_path) == 0
    events = run_events(tmp_path / "run")
    assert [e["topology"] for e in events if e["event"] == "preflight"] == ["scan", "boot state"]
    # The NCCL files built from PID 1's scan are the ones a scan gives.
    assert (tmp_path / "run" / "nccl" / "nccl.env").read_text() == nccl_env

    # Another boot's folder, or --rescan, is not trusted.
    (state / "node.json").write_text(
        (state / "node.json").read_text().replace(current_boot_id(), "another-boot")
    )
    assert config_opens(command, h200x2_tree, tmp_path) == one_scan
    write_boot_state(tmp_path / "state2", h200x2_tree, pod_init_bin, current_boot_id())
    rescan = pyinit_run(pyinit_bin, h200x2_tree, tmp_path, "--boot-state", tmp_path / "state2",
                        "--rescan")  # fmt: skip
    assert config_opens(rescan, h200x2_tree, tmp_path) == one_scan


@pytest.mark.parametrize("tree", ["h200x2_tree", "eightgpu_tree"])
def test_a_loaded_topology_is_the_scanned_one(tree, request, tmp_path):
    root = request.getfixturevalue(tree)
    scanned = _native.scan_topology(str(root), 8, False)
    loaded = _native.load_topology(scanned.to_json(), "topology.json")
    assert loaded.to_json() == scanned.to_json()
    assert loaded.to_text() == scanned.to_text()
    made = [_native.nccl_config(t, out_dir=str(tmp_path)).files for t in (scanned, loaded)]
    assert made[0] == made[1]


def test_a_damaged_topology_document_names_the_file(tmp_path):
    from pyinit.errors import InputError
    from pyinit.topology import load

    damaged = tmp_path / "topology.json"
    damaged.write_text('{"sysfs_root": "/sys",\n "devices": [}')
    with pytest.raises(InputError, match=rf"^{re.escape(str(damaged))}:2: malformed JSON"):
        load(damaged)
    damaged.write_text("[" * 100_000)
    with pytest.raises(InputError, match="nested deeper than 64"):
        load(damaged)
    damaged.write_text('{"sysfs_root": 3}')
    with pytest.raises(InputError, match="expected a string, found a number"):
        load(damaged)
    os.chmod(damaged, 0)
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            load(damaged)
