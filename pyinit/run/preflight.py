"""The checks before a run starts: the node's topology, scanned once per boot
(PID 1's scan reused when it describes this boot), its findings, and NVML's
view of the GPUs' health. The topology findings come from the C++ core, the
same code PID 1 logs at boot; NVML's part exists only in Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinit.boot_state import BootState, read_boot_state, reusable
from pyinit.topology import Finding, Topology, load, scan


@dataclass(frozen=True)
class NodeView:
    """What the run knows of this node, each part found once."""

    topology: Topology
    source: str  # "boot state" (PID 1's scan) or "scan"
    boot_state: BootState | None  # PID 1's folder when it describes this boot
    problems: tuple[Finding, ...]
    gpus: int
    nvml: Any  # the NVML view, or None


def node_topology(
    sysfs_root: str, expect_gpus: int | None, rescan: bool, state_dir: str
) -> tuple[Topology, BootState | None]:
    """PID 1's topology when its folder describes this boot and tree (and not
    ``rescan``), else a fresh scan."""
    state = None if rescan else read_boot_state(state_dir)
    if reusable(state, sysfs_root):
        return load(state.topology_path, expect_gpus), state
    return scan(sysfs_root, expect_gpus=expect_gpus, probe_bar0=False), None


def preflight(
    mode: str,
    *,
    sysfs_root: str = "/sys",
    expect_gpus: int | None = None,
    rescan: bool = False,
    state_dir: str = "/run/pod-init",
    nvml_backend: Any = None,
) -> NodeView:
    """The node's topology and its problems (none with ``mode`` off)."""
    from pyinit.nvml import NvmlUnavailable, read_nvml

    topo, state = node_topology(sysfs_root, expect_gpus, rescan, state_dir)
    problems = list(topo.findings)
    gpus = len(topo.gpus)
    try:
        view = read_nvml(nvml_backend)
    except NvmlUnavailable as e:
        view = None
        if gpus:
            problems.append(Finding("warning", "NVML_UNAVAILABLE", "", str(e)))
    if view is not None:
        problems += gpu_health(view)
    if mode == "off":
        problems = []
    return NodeView(topo, "boot state" if state else "scan", state, tuple(problems), gpus, view)


def gpu_health(view: Any) -> list[Finding]:
    found = []
    for gpu in view.gpus:
        h = gpu.health
        if h.get("ecc_enabled") is False:
            found.append(Finding("warning", "ECC_DISABLED", gpu.bdf, "ECC is off"))
        if h.get("ecc_uncorrected_volatile"):
            found.append(Finding("error", "ECC_UNCORRECTED", gpu.bdf,
                                 f"{h['ecc_uncorrected_volatile']} uncorrected ECC errors "
                                 "since the driver loaded"))  # fmt: skip
        if h.get("remap_failed"):
            found.append(Finding("error", "ROW_REMAP_FAILED", gpu.bdf,
                                 "a memory row remap failed: the GPU needs service"))  # fmt: skip
        if h.get("remap_pending"):
            found.append(Finding("warning", "ROW_REMAP_PENDING", gpu.bdf,
                                 "a memory row remap waits for a GPU reset"))  # fmt: skip
        if gpu.pcie_width and gpu.pcie_width < gpu.pcie_max_width:
            found.append(Finding("error", "PCIE_WIDTH_DEGRADED", gpu.bdf,
                                 f"PCIe x{gpu.pcie_width} of x{gpu.pcie_max_width}"))  # fmt: skip
        if gpu.pcie_generation and gpu.pcie_generation < gpu.pcie_max_generation:
            found.append(Finding("info", "PCIE_GEN_IDLE", gpu.bdf,
                                 f"PCIe gen {gpu.pcie_generation} of {gpu.pcie_max_generation}: "
                                 "idle GPUs lower it; check under load"))  # fmt: skip
        if gpu.bar1_total and gpu.bar1_total < gpu.memory_total:
            found.append(Finding("warning", "BAR1_SMALL", gpu.bdf,
                                 f"BAR1 {gpu.bar1_total >> 20} MiB < memory "
                                 f"{gpu.memory_total >> 20} MiB"))  # fmt: skip
    return found
