"""The node's health: what NVML alone knows of each GPU (``gpu_health``),
the kernel log's Xids (``xid``) and ``pyinit check`` (``check``), which runs
every probe under one deadline. Link width and speed and BAR1's size are the
C++ scan's findings (sysfs sees them, and caps a link by its slot), so none
is said again here under another code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyinit.finding import Finding


def gpu_health(view: Any, scanned: Sequence[Finding] = ()) -> list[Finding]:
    """NVML's findings: ECC, row remapping, and a BAR1 smaller than the GPU's
    memory (which needs the memory size NVML reports), unless the scan
    (`scanned`) already found that GPU's BAR1 too small for a large BAR."""
    small_bar1 = {f.device for f in scanned if f.code == "BAR1_SMALL"}
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
        if gpu.bar1_total and gpu.bar1_total < gpu.memory_total and gpu.bdf not in small_bar1:
            text = (
                f"BAR1 {gpu.bar1_total >> 20} MiB < memory {gpu.memory_total >> 20} MiB: "
                "not all of it can be mapped"
            )
            found.append(Finding("warning", "BAR1_BELOW_MEMORY", gpu.bdf, text))
    return found
