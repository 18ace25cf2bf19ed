"""PCIe topology of the node, from the native scanner, as typed dataclasses.

The fields mirror ``pod-init topo --json``; hex strings there (vendor, device,
class, boot0) are integers here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyinit import _native
from pyinit.finding import Finding
from pyinit.jsonfile import read_input_text
from pyinit.pci_scan import scan_native

if TYPE_CHECKING:
    from pyinit.nvml import NvmlView


@dataclass(frozen=True)
class Link:
    speed_gts: float | None
    max_speed_gts: float | None
    width: int | None
    max_width: int | None
    generation: int
    max_generation: int
    source: str  # "sysfs" or "config"


@dataclass(frozen=True)
class Bar:
    index: int
    start: int
    size: int
    is_64bit: bool
    prefetchable: bool
    io: bool


@dataclass(frozen=True)
class Bar0:
    state: str  # mapped, denied, unavailable, failed
    errno: str | None
    boot0: int | None
    chip: str
    architecture: str


@dataclass(frozen=True)
class Acs:
    capability: int
    control: int
    redirect: bool


@dataclass(frozen=True)
class Device:
    bdf: str
    kind: str  # gpu, nic, nvme, bridge, other
    vendor: int
    device: int
    class_code: int
    driver: str
    numa_node: int
    local_cpulist: str
    iommu_group: int | None
    path: str
    root_bus: str
    upstream: tuple[str, ...]
    port_type: str | None
    config_readable: bool
    link: Link | None
    bars: tuple[Bar, ...]
    acs: Acs | None
    net: tuple[str, ...]
    infiniband: tuple[str, ...]
    nvme_controllers: tuple[str, ...]
    block_devices: tuple[str, ...]
    bar0: Bar0 | None = None
    bar1_size: int | None = None


@dataclass(frozen=True)
class Matrix:
    devices: tuple[str, ...]
    labels: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...] | None = None  # None: NVML did not say

    def level(self, a: str, b: str) -> str:
        """PCIe level between two BDFs: X, PIX, PXB, PHB, NODE or SYS."""
        return self.rows[self.devices.index(a)][self.devices.index(b)]

    def cell(self, a: str, b: str) -> str:
        """What ``nvidia-smi topo -m`` shows: ``NV#`` over NVLink, else the level."""
        i, j = self.devices.index(a), self.devices.index(b)
        links = self.nvlinks[i][j] if self.nvlinks else 0
        return f"NV{links}" if links else self.rows[i][j]


@dataclass(frozen=True)
class Topology:
    sysfs_root: str
    scan_seconds: float
    numa_nodes: int
    devices: tuple[Device, ...]
    matrix: Matrix
    findings: tuple[Finding, ...]
    _native: _native.Topology = field(repr=False, compare=False)

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == "gpu")

    @property
    def has_errors(self) -> bool:
        return self._native.has_errors

    def device(self, bdf: str) -> Device:
        for dev in self.devices:
            if dev.bdf == bdf:
                return dev
        raise KeyError(bdf)

    def to_json(self) -> str:
        return self._native.to_json()

    def to_text(self) -> str:
        return self._native.to_text()


def _optional(cls: type, value: dict[str, Any] | None) -> Any:
    return None if value is None else cls(**value)


def _device(raw: dict[str, Any]) -> Device:
    bar0 = raw.get("bar0")
    if bar0 is not None:
        bar0 = Bar0(**{**bar0, "boot0": None if bar0["boot0"] is None else int(bar0["boot0"], 16)})
    link = raw["link"]
    if link is not None:
        link = Link(
            **{
                **link,
                "speed_gts": _float(link["speed_gts"]),
                "max_speed_gts": _float(link["max_speed_gts"]),
            }
        )
    return Device(
        bdf=raw["bdf"],
        kind=raw["kind"],
        vendor=int(raw["vendor"], 16),
        device=int(raw["device"], 16),
        class_code=int(raw["class"], 16),
        driver=raw["driver"],
        numa_node=raw["numa_node"],
        local_cpulist=raw["local_cpulist"],
        iommu_group=raw["iommu_group"],
        path=raw["path"],
        root_bus=raw["root_bus"],
        upstream=tuple(raw["upstream"]),
        port_type=raw["port_type"],
        config_readable=raw["config_readable"],
        link=link,
        bars=tuple(Bar(**bar) for bar in raw["bars"]),
        acs=_optional(Acs, raw["acs"]),
        net=tuple(raw["net"]),
        infiniband=tuple(raw["infiniband"]),
        nvme_controllers=tuple(raw["nvme_controllers"]),
        block_devices=tuple(raw["block_devices"]),
        bar0=bar0,
        bar1_size=raw.get("bar1_size"),
    )


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def scan(
    sysfs_root: str = "/sys",
    expect_gpus: int | None = None,
    probe_bar0: bool = True,
    nvml: NvmlView | None = None,
) -> Topology:
    """Scans the PCI tree under ``sysfs_root``; with ``nvml`` (see
    :func:`pyinit.nvml.read_nvml`) the matrix also shows NVLinks.

    Raises ``FileNotFoundError`` (or another ``OSError``, with ``.filename``)
    when the tree has no readable ``bus/pci/devices``; everything else that is
    wrong with the tree is reported in ``findings``.
    """
    return from_native(scan_native(sysfs_root, expect_gpus, probe_bar0), nvml)


def load(path: str | os.PathLike[str], expect_gpus: int | None = None) -> Topology:
    """The topology a ``pod-init topo --json`` document describes (PID 1's
    ``topology.json``): a scan reused, not repeated. ``OSError`` when the file
    cannot be read, ``InputError`` naming it when it is not such a document."""
    path = os.fspath(path)
    native = _native.load_topology(read_input_text(path), path)
    if expect_gpus is not None:
        native.expect_gpus(expect_gpus)
    return from_native(native)


def from_native(native: _native.Topology, nvml: NvmlView | None = None) -> Topology:
    """The dataclasses over a native topology, with NVML's NVLinks merged in when given."""
    if nvml is not None:
        native.merge_nvlinks(nvml.details())
    raw = json.loads(native.to_json())
    matrix = raw["matrix"]
    return Topology(
        sysfs_root=raw["sysfs_root"],
        scan_seconds=raw["scan_seconds"],
        numa_nodes=raw["numa_nodes"],
        devices=tuple(_device(d) for d in raw["devices"]),
        matrix=Matrix(
            devices=tuple(matrix["devices"]),
            labels=tuple(matrix["labels"]),
            rows=tuple(tuple(r) for r in matrix["rows"]),
            nvlinks=None if matrix["nvlinks"] is None else tuple(map(tuple, matrix["nvlinks"])),
        ),
        findings=tuple(Finding(**f) for f in raw["findings"]),
        _native=native,
    )
