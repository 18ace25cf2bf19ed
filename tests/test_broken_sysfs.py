"""Broken and hostile sysfs trees: every problem is a finding naming the path,
never a crash."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run, run_json

import pyinit


def scan_json(pod_init_bin, root) -> tuple[int, dict]:
    return run_json([pod_init_bin, "topo", "--json", "--sysfs-root", root])


def finding(doc, code: str) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == code]


def test_missing_class_file(pod_init_bin, fresh_8gpu):
    (fresh_8gpu.paths["0000:04:00.0"] / "class").unlink()
    _rc, doc = scan_json(pod_init_bin, fresh_8gpu.root)
    [f] = finding(doc, "SYSFS_UNREADABLE")
    assert f["device"] == "0000:04:00.0"
    assert f["message"].endswith("0000:04:00.0/class: No such file or directory")
    dev = next(d for d in doc["devices"] if d["bdf"] == "0000:04:00.0")
    assert dev["kind"] == "other"  # cannot be called a GPU without its class


def test_garbage_content(pod_init_bin, fresh_8gpu):
    paths = fresh_8gpu.paths
    (paths["0000:03:00.0"] / "vendor").write_text("zzz\n")
    (paths["0000:05:00.0"] / "numa_node").write_text("banana\n")
    (paths["0000:06:00.0"] / "current_link_width").write_text("wide\n")
    (paths["0000:1c:00.0"] / "resource").write_text("0x1000 nonsense\n")
    (paths["0000:1d:00.0"] / "max_link_speed").write_text("fast\n")
    _rc, doc = scan_json(pod_init_bin, fresh_8gpu.root)
    malformed = {
        (f["device"], f["message"].split(": ")[0].rsplit("/", 1)[1])
        for f in finding(doc, "SYSFS_MALFORMED")
    }
    assert malformed == {
        ("0000:03:00.0", "vendor"),
        ("0000:05:00.0", "numa_node"),
        ("0000:06:00.0", "current_link_width"),
        ("0000:1c:00.0", "resource"),
        ("0000:1d:00.0", "max_link_speed"),
    }
    assert any("'zzz'" in f["message"] for f in finding(doc, "SYSFS_MALFORMED"))
    # A GPU whose BARs could not be read is not also called small-BAR.
    assert {f["device"] for f in finding(doc, "BAR1_SMALL")} == {"0000:84:00.0"}


def test_dangling_and_escaping_links(pod_init_bin, fresh_8gpu):
    bus = fresh_8gpu.root / "bus/pci/devices"
    os.symlink("../../../devices/pci0000:00/0000:99:00.0", bus / "0000:99:00.0")
    os.symlink("/etc", bus / "0000:98:00.0")
    (bus / "not-a-device").write_text("")
    _rc, doc = scan_json(pod_init_bin, fresh_8gpu.root)
    [dangling] = finding(doc, "SYSFS_DANGLING_LINK")
    assert dangling["device"] == "0000:99:00.0"
    assert "bus/pci/devices/0000:99:00.0" in dangling["message"]
    messages = [f["message"] for f in finding(doc, "SYSFS_MALFORMED")]
    assert any("0000:98:00.0: resolves outside the sysfs root" in m for m in messages)
    assert any(m.endswith("not-a-device: not a PCI address") for m in messages)
    assert len(doc["devices"]) == 37


def test_truncated_and_looping_config_space(pod_init_bin, fresh_8gpu):
    paths = fresh_8gpu.paths
    (paths["0000:02:00.0"] / "config").write_bytes(b"\x86\x80" * 5)
    cfg = bytearray((paths["0000:02:01.0"] / "config").read_bytes())
    cfg[0x41] = 0x40  # capability list points at itself
    (paths["0000:02:01.0"] / "config").write_bytes(bytes(cfg))
    _rc, doc = scan_json(pod_init_bin, fresh_8gpu.root)
    devices = {d["bdf"]: d for d in doc["devices"]}
    assert devices["0000:02:00.0"]["config_readable"] is False
    assert devices["0000:02:01.0"]["port_type"] is None
    assert finding(doc, "CONFIG_UNREADABLE")[0]["message"].startswith("config space of 2 bridge(s)")


def test_unreadable_directory_entry(pod_init_bin, fresh_8gpu):
    # A directory where a file should be: read() fails with EISDIR.
    cpulist = fresh_8gpu.paths["0000:03:00.0"] / "local_cpulist"
    cpulist.unlink()
    cpulist.mkdir()
    _rc, doc = scan_json(pod_init_bin, fresh_8gpu.root)
    [f] = finding(doc, "SYSFS_UNREADABLE")
    assert f["message"].endswith("local_cpulist: Is a directory")


def test_empty_tree_has_no_devices(pod_init_bin, tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    rc, doc = scan_json(pod_init_bin, tmp_path)
    assert rc == 0 and doc["devices"] == [] and doc["matrix"]["rows"] == []
    text = run([pod_init_bin, "topo", "--sysfs-root", tmp_path]).stdout
    assert "(no GPU, NIC or NVMe device found)" in text


def test_missing_root_is_a_clear_error(pod_init_bin, pyinit_bin, tmp_path):
    missing = tmp_path / "nothing"
    for tool in (pod_init_bin, pyinit_bin):
        proc = run([tool, "topo", "--sysfs-root", missing])
        assert proc.returncode == 1
        assert proc.stdout == ""
        assert proc.stderr.strip().endswith(
            f"{missing}/bus/pci/devices: list: No such file or directory"
        )
        assert "Traceback" not in proc.stderr
    with pytest.raises(FileNotFoundError) as raised:
        pyinit.scan(missing)
    assert raised.value.filename == f"{missing}/bus/pci/devices"
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        pyinit.scan(tmp_path / "file")


def test_every_broken_tree_still_gives_valid_json(pod_init_bin, fresh_8gpu):
    # Everything at once, including a device with no files at all.
    bare = fresh_8gpu.root / "devices/pci0000:00/0000:00:09.0"
    bare.mkdir()
    os.symlink(
        "../../../devices/pci0000:00/0000:00:09.0", fresh_8gpu.root / "bus/pci/devices/0000:00:09.0"
    )
    for path in fresh_8gpu.paths.values():
        (path / "resource").write_text("garbage\n")
    proc = run([pod_init_bin, "topo", "--json", "--sysfs-root", fresh_8gpu.root])
    assert proc.returncode in (0, 1) and proc.stderr == ""
    doc = json.loads(proc.stdout)
    bare_findings = [f for f in doc["findings"] if f["device"] == "0000:00:09.0"]
    assert {f["message"].rsplit("/", 1)[1].split(":")[0] for f in bare_findings} == {
        "vendor",
        "device",
        "class",
        "resource",
    }
