"""Topology discovery through the real `pod-init` binary and the Python API."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile

import pytest
from conftest import run, run_json

import pyinit

# Written from the fixture's drawing (sysfs_fixtures.build_8gpu), not from the code.
EIGHT_GPU_LABELS = [
    "GPU0",
    "GPU1",
    "GPU2",
    "GPU3",
    "GPU4",
    "GPU5",
    "GPU6",
    "GPU7",
    "NIC0",
    "NIC1",
    "NIC2",
    "NIC3",
    "NVME0",
    "NVME1",
]
EIGHT_GPU_MATRIX = """
X    PIX  NODE NODE SYS  SYS  SYS  SYS  PIX  NODE NODE SYS  PIX  SYS
PIX  X    NODE NODE SYS  SYS  SYS  SYS  PIX  NODE NODE SYS  PIX  SYS
NODE NODE X    PIX  SYS  SYS  SYS  SYS  NODE PXB  PXB  SYS  NODE SYS
NODE NODE PIX  X    SYS  SYS  SYS  SYS  NODE PXB  PXB  SYS  NODE SYS
SYS  SYS  SYS  SYS  X    PIX  NODE NODE SYS  SYS  SYS  PIX  SYS  PIX
SYS  SYS  SYS  SYS  PIX  X    NODE NODE SYS  SYS  SYS  PIX  SYS  PIX
SYS  SYS  SYS  SYS  NODE NODE X    PIX  SYS  SYS  SYS  NODE SYS  NODE
SYS  SYS  SYS  SYS  NODE NODE PIX  X    SYS  SYS  SYS  NODE SYS  NODE
PIX  PIX  NODE NODE SYS  SYS  SYS  SYS  X    NODE NODE SYS  PIX  SYS
NODE NODE PXB  PXB  SYS  SYS  SYS  SYS  NODE X    PIX  SYS  NODE SYS
NODE NODE PXB  PXB  SYS  SYS  SYS  SYS  NODE PIX  X    SYS  NODE SYS
SYS  SYS  SYS  SYS  PIX  PIX  NODE NODE SYS  SYS  SYS  X    SYS  PIX
PIX  PIX  NODE NODE SYS  SYS  SYS  SYS  PIX  NODE NODE SYS  X    SYS
SYS  SYS  SYS  SYS  PIX  PIX  NODE NODE SYS  SYS  SYS  PIX  SYS  X
"""


def expected_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def codes(findings) -> set[tuple[str, str, str]]:
    return {(f["severity"], f["code"], f["device"]) for f in findings}


def test_8gpu_matrix_matches_the_drawing(pod_init_bin, eightgpu_tree):
    _rc, doc = run_json([pod_init_bin, "topo", "--json", "--sysfs-root", eightgpu_tree])
    assert doc["matrix"]["labels"] == EIGHT_GPU_LABELS
    assert doc["matrix"]["rows"] == expected_rows(EIGHT_GPU_MATRIX)
    gpus = [d["bdf"] for d in doc["devices"] if d["kind"] == "gpu"]
    assert doc["matrix"]["devices"][:8] == gpus == sorted(gpus)


def test_8gpu_findings_and_exit_code(pod_init_bin, eightgpu_tree):
    rc, doc = run_json([pod_init_bin, "topo", "--json", "--sysfs-root", eightgpu_tree])
    assert rc == 1
    assert codes(doc["findings"]) == {
        ("error", "LINK_WIDTH_DEGRADED", "0000:83:00.0"),
        ("error", "BAR1_SMALL", "0000:84:00.0"),
        ("error", "ACS_REDIRECT", "0000:c2:00.0"),
        ("error", "ACS_REDIRECT", "0000:c2:01.0"),
    }
    acs = [f for f in doc["findings"] if f["code"] == "ACS_REDIRECT"]
    # Only the pair that would stay inside the switch is diverted by ACS.
    assert all("0000:c3:00.0<->0000:c4:00.0" in f["message"] for f in acs)
    assert all("1 GPU pair" in f["message"] for f in acs)
    width = next(f for f in doc["findings"] if f["code"] == "LINK_WIDTH_DEGRADED")
    assert "x8" in width["message"] and "x16" in width["message"]


def test_expect_gpus(pod_init_bin, h200x2_tree):
    rc, doc = run_json(
        [pod_init_bin, "topo", "--json", "--sysfs-root", h200x2_tree, "--expect-gpus", "2"]
    )
    assert rc == 0
    rc, doc = run_json(
        [pod_init_bin, "topo", "--json", "--sysfs-root", h200x2_tree, "--expect-gpus", "8"]
    )
    assert rc == 1
    low = [f for f in doc["findings"] if f["code"] == "GPU_COUNT_LOW"]
    assert len(low) == 1 and low[0]["severity"] == "error"
    assert "found 2 GPU(s), expected 8" in low[0]["message"]


def test_h200x2_reproduces_the_lent_machine(pod_init_bin, h200x2_tree):
    rc, doc = run_json([pod_init_bin, "topo", "--json", "--sysfs-root", h200x2_tree])
    assert rc == 0
    assert doc["matrix"]["labels"] == ["GPU0", "GPU1", "NIC0"]
    # NVML reported 30 (host bridge) for GPU0-GPU1 on that machine.
    assert doc["matrix"]["rows"] == [["X", "PHB", "PHB"], ["PHB", "X", "PHB"], ["PHB", "PHB", "X"]]
    devices = {d["bdf"]: d for d in doc["devices"]}
    gpu = devices["0000:00:06.0"]
    assert gpu["link"] == {
        "speed_gts": 32,
        "max_speed_gts": 32,
        "width": 16,
        "max_width": 16,
        "generation": 5,
        "max_generation": 5,
        "source": "sysfs",
    }
    assert gpu["bar1_size"] == 256 << 30
    assert [b["index"] for b in gpu["bars"]] == [0, 2, 4]
    assert gpu["numa_node"] == -1 and gpu["driver"] == "nvidia"
    assert devices["0000:00:03.0"]["net"] == ["eth0"]  # behind virtio2/
    assert devices["0000:00:01.0"]["block_devices"] == ["vda"]
    assert devices["0000:00:01.0"]["kind"] == "other"
    assert devices["0000:00:00.0"]["kind"] == "bridge"
    assert codes(doc["findings"]) == {
        ("info", "NUMA_UNKNOWN", b) for b in ("0000:00:03.0", "0000:00:06.0", "0000:00:07.0")
    }


def test_names_of_nics_and_nvme(eightgpu_tree):
    topo = pyinit.scan(eightgpu_tree)
    assert topo.device("0000:05:00.0").infiniband == ("mlx5_0",)
    assert topo.device("0000:05:00.0").net == ("ibp5s0",)
    assert topo.device("0000:1e:00.1").infiniband == ("mlx5_2",)
    plain = topo.device("0000:06:00.0")
    assert (plain.kind, plain.nvme_controllers, plain.block_devices) == (
        "nvme",
        ("nvme0",),
        ("nvme0n1",),
    )
    multipath = topo.device("0000:86:00.0")
    assert (multipath.nvme_controllers, multipath.block_devices) == (("nvme1",), ("nvme1n1",))


def test_nvme_multipath_head_with_two_controllers(fresh_8gpu):
    # A second controller (on another PCI function) reaches the same namespace head.
    ctrl = fresh_8gpu.paths["0000:06:00.0"] / "nvme/nvme0"
    leg = ctrl / "nvme0c0n1"
    leg.mkdir()
    head = fresh_8gpu.root / "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1"
    (head / "multipath" / leg.name).symlink_to(os.path.relpath(leg, head / "multipath"))
    topo = pyinit.scan(fresh_8gpu.root)
    assert "nvme1n1" in topo.device("0000:06:00.0").block_devices
    assert topo.device("0000:86:00.0").block_devices == ("nvme1n1",)


def test_bars_bare_metal_layout_and_chip(eightgpu_tree):
    gpu = pyinit.scan(eightgpu_tree).device("0000:03:00.0")
    assert [(b.index, b.is_64bit, b.prefetchable) for b in gpu.bars] == [
        (0, False, False),
        (1, True, True),
        (3, True, True),
    ]
    assert gpu.bar1_size == 128 << 30
    assert gpu.bar0 == pyinit.Bar0(
        state="mapped", errno=None, boot0=0x180000A1, chip="GH100", architecture="Hopper"
    )
    assert gpu.upstream == ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0")
    assert gpu.iommu_group == 40


def test_switch_ports_and_acs_from_config(eightgpu_tree):
    topo = pyinit.scan(eightgpu_tree)
    assert topo.device("0000:00:01.0").port_type == "root_port"
    assert topo.device("0000:1a:00.0").port_type == "switch_upstream"
    port = topo.device("0000:c2:00.0")
    assert port.port_type == "switch_downstream"
    assert port.acs == pyinit.Acs(capability=0x5F, control=0x1D, redirect=True)
    assert topo.device("0000:02:00.0").acs is None


def test_unprivileged_config_falls_back_to_position_heuristic(pod_init_bin, tmp_path):
    import sysfs_fixtures

    sysfs_fixtures.build_8gpu(tmp_path / "t", config_size=64)
    _rc, doc = run_json([pod_init_bin, "topo", "--json", "--sysfs-root", tmp_path / "t"])
    assert doc["matrix"]["rows"] == expected_rows(EIGHT_GPU_MATRIX)
    blind = [f for f in doc["findings"] if f["code"] == "CONFIG_UNREADABLE"]
    assert len(blind) == 1 and blind[0]["severity"] == "info"
    assert "23 bridge(s)" in blind[0]["message"]  # 4 root ports, 19 switch ports
    # Without extended config space, ACS cannot be seen: no ACS finding, said so above.
    assert not [f for f in doc["findings"] if f["code"] == "ACS_REDIRECT"]


def test_link_speed_below_max(pod_init_bin, fresh_8gpu):
    gpu = fresh_8gpu.paths["0000:03:00.0"]
    nic = fresh_8gpu.paths["0000:05:00.0"]
    (gpu / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    (nic / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    _rc, doc = run_json([pod_init_bin, "topo", "--json", "--sysfs-root", fresh_8gpu.root])
    found = {f["device"]: f for f in doc["findings"] if f["code"] == "LINK_SPEED_DEGRADED"}
    assert found["0000:03:00.0"]["severity"] == "info"  # idle GPUs downclock their link
    assert "check under load" in found["0000:03:00.0"]["message"]
    assert found["0000:05:00.0"]["severity"] == "warning"
    assert set(found) == {"0000:03:00.0", "0000:05:00.0"}


def test_link_registers_used_when_sysfs_has_no_link_files(fresh_8gpu):
    gpu = fresh_8gpu.paths["0000:83:00.0"]
    for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"):
        (gpu / name).unlink()
    topo = pyinit.scan(fresh_8gpu.root)
    link = topo.device("0000:83:00.0").link
    assert (link.width, link.max_width, link.speed_gts, link.source) == (8, 16, 32.0, "config")
    assert any(
        f.code == "LINK_WIDTH_DEGRADED" and f.device == "0000:83:00.0" for f in topo.findings
    )


def test_width_255_is_an_unknown_link_not_malformed(fresh_8gpu):
    # PCIE_LNK_WIDTH_UNKNOWN: what QEMU's q35 devices on the root bus show.
    nic = fresh_8gpu.paths["0000:05:00.0"]
    for name in ("current_link_width", "max_link_width"):
        (nic / name).write_text("255\n")
    topo = pyinit.scan(fresh_8gpu.root)
    assert not [f for f in topo.findings if f.code == "SYSFS_MALFORMED"]


def test_numa_unknown_is_a_warning_on_multi_socket(fresh_8gpu):
    (fresh_8gpu.paths["0000:03:00.0"] / "numa_node").write_text("-1\n")
    topo = pyinit.scan(fresh_8gpu.root)
    numa = [f for f in topo.findings if f.code == "NUMA_UNKNOWN"]
    assert [(f.severity, f.device) for f in numa] == [("warning", "0000:03:00.0")]
    # A crossing cannot be proven without NUMA: different host bridges read NODE.
    assert topo.matrix.level("0000:03:00.0", "0000:83:00.0") == "NODE"


@pytest.mark.parametrize(
    ("boot0", "state", "chip", "finding"),
    [
        (0x170000A1, "mapped", "GA100", None),
        (0x1F5000A1, "mapped", "", None),
        (0xFFFFFFFF, "mapped", "", ("error", "GPU_NOT_RESPONDING")),
    ],
)
def test_bar0_register_values(fresh_8gpu, boot0, state, chip, finding):
    resource0 = fresh_8gpu.paths["0000:03:00.0"] / "resource0"
    resource0.write_bytes(struct.pack("<I", boot0) + bytes(4092))
    topo = pyinit.scan(fresh_8gpu.root)
    bar0 = topo.device("0000:03:00.0").bar0
    assert (bar0.state, bar0.boot0, bar0.chip) == (state, boot0, chip)
    got = [(f.severity, f.code) for f in topo.findings if f.device == "0000:03:00.0"]
    assert got == ([finding] if finding else [])


def test_bar0_states_without_a_mapping(fresh_8gpu):
    paths = fresh_8gpu.paths
    (paths["0000:03:00.0"] / "resource0").unlink()
    (paths["0000:04:00.0"] / "resource0").unlink()
    os.mkfifo(paths["0000:04:00.0"] / "resource0")  # opens, but cannot be mapped
    (paths["0000:1c:00.0"] / "resource0").write_bytes(b"")  # too short to read: no SIGBUS
    topo = pyinit.scan(fresh_8gpu.root)
    assert topo.device("0000:03:00.0").bar0.state == "unavailable"
    fifo = topo.device("0000:04:00.0").bar0
    assert (fifo.state, fifo.errno) == ("failed", "ENODEV")
    short = topo.device("0000:1c:00.0").bar0
    assert (short.state, short.errno) == ("failed", "ENXIO")
    failed = {f.device for f in topo.findings if f.code == "BAR0_FAILED"}
    assert failed == {"0000:04:00.0", "0000:1c:00.0"}


def test_no_bar0_flag_skips_the_mapping(eightgpu_tree):
    topo = pyinit.scan(eightgpu_tree, probe_bar0=False)
    assert all(gpu.bar0 is None for gpu in topo.gpus)


@pytest.mark.root
def test_bar0_denied_for_unprivileged_users(pod_init_bin):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop privileges")
    import sysfs_fixtures

    # pytest's own temporary folders are private to root; nobody must reach this one.
    top = tempfile.mkdtemp(prefix="pod-init-nobody-")
    try:
        os.chmod(top, 0o755)
        sysfs_fixtures.build_8gpu(os.path.join(top, "t"))
        proc = run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                pod_init_bin,
                "topo",
                "--json",
                "--sysfs-root",
                os.path.join(top, "t"),
            ]
        )
    finally:
        shutil.rmtree(top)
    doc = json.loads(proc.stdout)
    states = {d["bar0"]["state"] for d in doc["devices"] if d["kind"] == "gpu"}
    assert states == {"denied"}
    denied = [f for f in doc["findings"] if f["code"] == "BAR0_DENIED"]
    assert len(denied) == 8 and all("EACCES" in f["message"] for f in denied)


def test_scan_is_fast_enough_to_report_its_time(eightgpu_tree):
    topo = pyinit.scan(eightgpu_tree)
    assert 0 < topo.scan_seconds < 5  # a sanity bound, not the benchmark (bench/topo_scan.py)


def test_live_sysfs_matches_lspci(pod_init_bin):
    if not os.path.isdir("/sys/bus/pci/devices"):
        pytest.skip("this machine has no PCI bus in sysfs")
    rc, doc = run_json([pod_init_bin, "topo", "--json"])
    assert rc in (0, 1)
    assert {d["bdf"] for d in doc["devices"]} == set(os.listdir("/sys/bus/pci/devices"))
    lspci = shutil.which("lspci")
    if lspci is None:
        pytest.skip("lspci is not installed (the test command installs pciutils)")
    out = run([lspci, "-Dn"]).stdout
    classes = {}
    for line in out.splitlines():
        bdf, cls, ids = line.split()[:3]
        classes[bdf] = (cls.rstrip(":"), ids)
    ours = {
        d["bdf"]: (d["class"][2:6], f"{d['vendor'][2:]}:{d['device'][2:]}") for d in doc["devices"]
    }
    assert ours == classes
