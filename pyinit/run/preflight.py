"""The checks before a run starts: the node's topology, scanned once per boot
(PID 1's scan reused when it describes this boot), its findings, and NVML's
view of the GPUs' health. The topology findings come from the C++ core, the
same code PID 1 logs at boot; what NVML alone knows comes from
``pyinit.health``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinit.boot_state import BootState, read_boot_state, reusable
from pyinit.health import gpu_health
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
        problems += gpu_health(view, problems)
    if mode == "off":
        problems = []
    return NodeView(topo, "boot state" if state else "scan", state, tuple(problems), gpus, view)
