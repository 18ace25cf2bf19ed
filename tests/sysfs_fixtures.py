"""Fixture sysfs trees: plain directories, files and relative symlinks laid
out the way the kernel lays out /sys, so the scanner runs on them unchanged.

Run as a script to write one: ``python tests/sysfs_fixtures.py h200x2 DIR``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

# PCIe port types (PCI Express Capabilities register, bits 7:4).
ENDPOINT, ROOT_PORT, SWITCH_UP, SWITCH_DOWN = 0, 4, 5, 6
# sysfs resource flags
MEM, PREFETCH, MEM64 = 0x200, 0x2000, 0x100000
SPEED_CODE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
ACS_RR, ACS_CR, ACS_UF, ACS_SV = 0x04, 0x08, 0x10, 0x01
GIB, MIB = 1 << 30, 1 << 20
HOPPER_BOOT0 = 0x180000A1


def config_space(
    port_type: int | None,
    link: tuple[float, int, float, int] | None = None,
    acs_control: int | None = None,
    size: int = 4096,
) -> bytes:
    """Config space with a PCIe capability at 0x60 and, when asked, ACS at 0x140.

    ``link`` is (max speed GT/s, max width, current speed GT/s, current width).
    ``size`` 64 is what an unprivileged reader gets.
    """
    cfg = bytearray(4096)
    struct.pack_into("<HH", cfg, 0, 0x10DE, 0x0000)
    if port_type is not None:
        struct.pack_into("<H", cfg, 0x06, 0x0010)  # status: capability list
        cfg[0x34] = 0x40
        cfg[0x40:0x42] = bytes([0x01, 0x60])  # power management, next 0x60
        cfg[0x60:0x62] = bytes([0x10, 0x00])  # PCI Express, last
        struct.pack_into("<H", cfg, 0x62, (port_type << 4) | 0x2)
        if link is not None:
            max_speed, max_width, speed, width = link
            struct.pack_into("<I", cfg, 0x6C, SPEED_CODE[max_speed] | (max_width << 4))
            struct.pack_into("<H", cfg, 0x72, SPEED_CODE[speed] | (width << 4))
        # AER first, then ACS: the walker has to follow a next pointer.
        next_cap = 0x140 if acs_control is not None else 0
        struct.pack_into("<I", cfg, 0x100, 0x0001 | (1 << 16) | (next_cap << 20))
        if acs_control is not None:
            struct.pack_into("<I", cfg, 0x140, 0x000D | (1 << 16))
            struct.pack_into("<HH", cfg, 0x144, 0x005F, acs_control)
    return bytes(cfg[:size])


def resource_lines(bars: dict[int, tuple[int, int, int]]) -> str:
    """``bars``: resource index -> (start, size, flags); 13 lines like the kernel's."""
    lines = []
    for index in range(13):
        if index in bars:
            start, size, flags = bars[index]
            lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}")
        else:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    return "\n".join(lines) + "\n"


def gpu_bars(n: int, bar1_size: int, vm_layout: bool) -> dict[int, tuple[int, int, int]]:
    """GPU ``n``'s BARs. Bare metal: 32-bit BAR0, BAR1 at resource1. VM: 64-bit
    BAR0, BAR1 at resource2."""
    pref64 = MEM | PREFETCH | MEM64 | 0xC
    high = 0x100000000000 + n * 0x10000000000
    if vm_layout:
        return {
            0: (high + 64 * GIB, 16 * MIB, pref64),
            2: (high, bar1_size, pref64),
            4: (high + 64 * GIB + 32 * MIB, 32 * MIB, pref64),
        }
    return {
        0: (0x90000000 + n * 0x2000000, 16 * MIB, MEM),
        1: (high, bar1_size, pref64),
        3: (high + 64 * GIB, 32 * MIB, pref64),
    }


@dataclass
class Link:
    speed: float
    width: int
    max_speed: float
    max_width: int


class SysfsTree:
    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.paths: dict[str, Path] = {}
        (self.root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def numa_nodes(self, count: int) -> None:
        for node in range(count):
            (self.root / f"devices/system/node/node{node}").mkdir(parents=True, exist_ok=True)

    def device(
        self,
        bdf: str,
        parent: str,
        vendor: int,
        device: int,
        class_code: int,
        *,
        numa: int | None = -1,
        cpulist: str = "",
        driver: str | None = None,
        link: Link | None = None,
        port_type: int | None = ENDPOINT,
        acs: int | None = None,
        config_size: int = 4096,
        bars: dict[int, tuple[int, int, int]] | None = None,
        boot0: int | None = None,
        iommu_group: int | None = None,
    ) -> Path:
        """Adds a function below ``parent``: a bridge's BDF or a host bridge like pci0000:00."""
        base = self.paths[parent] if parent in self.paths else self.root / "devices" / parent
        path = base / bdf
        path.mkdir(parents=True)
        self.paths[bdf] = path
        self._link(self.root / "bus/pci/devices" / bdf, path)
        (path / "vendor").write_text(f"0x{vendor:04x}\n")
        (path / "device").write_text(f"0x{device:04x}\n")
        (path / "class").write_text(f"0x{class_code:06x}\n")
        if numa is not None:
            (path / "numa_node").write_text(f"{numa}\n")
        (path / "local_cpulist").write_text(f"{cpulist}\n")
        if driver:
            self._link(path / "driver", self.root / "bus/pci/drivers" / driver)
            (self.root / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        if iommu_group is not None:
            group = self.root / "kernel/iommu_groups" / str(iommu_group)
            group.mkdir(parents=True, exist_ok=True)
            self._link(path / "iommu_group", group)
        if link is not None:
            (path / "current_link_speed").write_text(f"{link.speed} GT/s PCIe\n")
            (path / "max_link_speed").write_text(f"{link.max_speed} GT/s PCIe\n")
            (path / "current_link_width").write_text(f"{link.width}\n")
            (path / "max_link_width").write_text(f"{link.max_width}\n")
        regs = (link.max_speed, link.max_width, link.speed, link.width) if link else None
        (path / "config").write_bytes(config_space(port_type, regs, acs, config_size))
        (path / "resource").write_text(resource_lines(bars or {}))
        if boot0 is not None:
            (path / "resource0").write_bytes(struct.pack("<I", boot0) + bytes(4092))
            (path / "resource0").chmod(0o600)
        return path

    def net(self, bdf: str, name: str, via: str = "") -> None:
        path = self.paths[bdf] / via / "net" / name if via else self.paths[bdf] / "net" / name
        path.mkdir(parents=True)
        self._link(self.root / "class/net" / name, path)

    def infiniband(self, bdf: str, name: str) -> None:
        path = self.paths[bdf] / "infiniband" / name
        path.mkdir(parents=True)
        self._link(self.root / "class/infiniband" / name, path)

    def block(self, bdf: str, name: str, via: str) -> None:
        path = self.paths[bdf] / via / "block" / name
        path.mkdir(parents=True)
        self._link(self.root / "block" / name, path)

    def nvme(self, bdf: str, controller: int, namespaces: int = 1, multipath: bool = False):
        ctrl = self.paths[bdf] / "nvme" / f"nvme{controller}"
        ctrl.mkdir(parents=True)
        self._link(self.root / "class/nvme" / f"nvme{controller}", ctrl)
        for ns in range(1, namespaces + 1):
            disk = f"nvme{controller}n{ns}"
            if not multipath:
                (ctrl / disk / "queue").mkdir(parents=True)
                (ctrl / disk / "queue/logical_block_size").write_text("4096\n")
                self._link(self.root / "block" / disk, ctrl / disk)
                continue
            # Native multipath: the disk is a virtual head; the controller holds the path.
            leg = ctrl / f"nvme{controller}c{controller}n{ns}"
            leg.mkdir()
            head = self.root / f"devices/virtual/nvme-subsystem/nvme-subsys{controller}/{disk}"
            (head / "multipath").mkdir(parents=True)
            self._link(head / "multipath" / leg.name, leg)
            self._link(self.root / "block" / disk, head)


def build_h200x2(root: Path | str) -> SysfsTree:
    """A 2xH200 Firecracker VM (as its sysfs reads): one
    flat root bus, NUMA -1, VM BAR layout with a 256 GiB BAR1."""
    t = SysfsTree(root)
    t.numa_nodes(1)
    host = "pci0000:00"
    t.device("0000:00:00.0", host, 0x8086, 0x0D57, 0x060000, port_type=None, cpulist="0-31")
    for fn, (dev, cls, _virtio) in enumerate(
        [
            (0x1042, 0x018000, 0),
            (0x1042, 0x018000, 1),
            (0x1041, 0x020000, 2),
            (0x1053, 0xFFFF00, 3),
            (0x1044, 0xFFFF00, 4),
        ],
        start=1,
    ):
        t.device(
            f"0000:00:0{fn}.0",
            host,
            0x1AF4,
            dev,
            cls,
            port_type=None,
            driver="virtio-pci",
            cpulist="0-31",
            bars={1: (0xC000 + fn * 0x100, 0x80, 0x101)},
        )
    t.block("0000:00:01.0", "vda", "virtio0")
    t.block("0000:00:02.0", "vdb", "virtio1")
    t.net("0000:00:03.0", "eth0", via="virtio2")
    gen5 = Link(32.0, 16, 32.0, 16)
    for i, fn in enumerate((6, 7)):
        t.device(
            f"0000:00:0{fn}.0",
            host,
            0x10DE,
            0x2335,
            0x030200,
            link=gen5,
            cpulist="0-31",
            driver="nvidia",
            bars=gpu_bars(i, 256 * GIB, True),
            boot0=HOPPER_BOOT0,
        )
    return t


def build_8gpu(root: Path | str, config_size: int = 4096, faults: bool = True) -> SysfsTree:
    """A two-socket 8-GPU PCIe box with Gen5 switches:

    pci0000:00 (socket 0): root port 00:01.0 -> switch 01:00.0
        -> GPU0 03:00.0, GPU1 04:00.0, NIC0 05:00.0 (mlx5_0), NVMe 06:00.0
    pci0000:17 (socket 0): root port 17:01.0 -> switch 18:00.0
        -> switch 1a:00.0 (second level) -> GPU2 1c:00.0, GPU3 1d:00.0
        -> dual-port NIC 1e:00.0 / 1e:00.1
    pci0000:80 (socket 1): root port 80:01.0 -> switch 81:00.0
        -> GPU4 83:00.0 (trained x8), GPU5 84:00.0 (256 MiB BAR1), NIC 85:00.0,
           NVMe 86:00.0 (native multipath)
    pci0000:c0 (socket 1): root port c0:01.0 -> switch c1:00.0, ACS redirect on its ports
        -> GPU6 c3:00.0, GPU7 c4:00.0

    Without `faults`: every link at x16, every BAR1 128 GiB, no ACS redirect.
    """
    t = SysfsTree(root)
    t.numa_nodes(2)
    gen5 = Link(32.0, 16, 32.0, 16)
    cpus = {0: "0-55,112-167", 1: "56-111,168-223"}
    acs_redirect = ACS_SV | ACS_RR | ACS_CR | ACS_UF

    def root_port(host: str, bdf: str, numa: int) -> None:
        t.device(
            bdf,
            host,
            0x8086,
            0x352A,
            0x060400,
            numa=numa,
            cpulist=cpus[numa],
            link=gen5,
            port_type=ROOT_PORT,
            config_size=config_size,
        )

    def gpu(bdf: str, parent: str, numa: int, n: int, link: Link = gen5, bar1: int = 128 * GIB):
        t.device(
            bdf,
            parent,
            0x10DE,
            0x2335,
            0x030200,
            numa=numa,
            cpulist=cpus[numa],
            link=link,
            driver="nvidia",
            bars=gpu_bars(n, bar1, False),
            boot0=HOPPER_BOOT0,
            iommu_group=40 + n,
        )

    def nic(bdf: str, parent: str, numa: int, ib: str, netdev: str) -> None:
        t.device(
            bdf,
            parent,
            0x15B3,
            0x1021,
            0x020700,
            numa=numa,
            cpulist=cpus[numa],
            link=gen5,
            driver="mlx5_core",
            bars={0: (0x3000000000 + int(bdf[5:7], 16) * GIB, 32 * MIB, MEM | PREFETCH | MEM64)},
        )
        t.infiniband(bdf, ib)
        t.net(bdf, netdev)

    def nvme(bdf: str, parent: str, numa: int, controller: int, multipath: bool) -> None:
        t.device(
            bdf,
            parent,
            0x144D,
            0xA824,
            0x010802,
            numa=numa,
            cpulist=cpus[numa],
            link=Link(16.0, 4, 16.0, 4),
            driver="nvme",
            bars={0: (0xE0000000, 16384, MEM)},
        )
        t.nvme(bdf, controller, multipath=multipath)

    root_port("pci0000:00", "0000:00:01.0", 0)

    def switch(parent: str, upstream: str, downstream: list[str], numa: int, acs=None) -> None:
        t.device(
            upstream,
            parent,
            0x1000,
            0xC030,
            0x060400,
            numa=numa,
            link=gen5,
            port_type=SWITCH_UP,
            config_size=config_size,
        )
        for bdf in downstream:
            t.device(
                bdf,
                upstream,
                0x1000,
                0xC030,
                0x060400,
                numa=numa,
                link=gen5,
                port_type=SWITCH_DOWN,
                acs=acs,
                config_size=config_size,
            )

    switch("0000:00:01.0", "0000:01:00.0", [f"0000:02:0{d}.0" for d in range(4)], 0)
    gpu("0000:03:00.0", "0000:02:00.0", 0, 0)
    gpu("0000:04:00.0", "0000:02:01.0", 0, 1)
    nic("0000:05:00.0", "0000:02:02.0", 0, "mlx5_0", "ibp5s0")
    nvme("0000:06:00.0", "0000:02:03.0", 0, 0, multipath=False)

    root_port("pci0000:17", "0000:17:01.0", 0)
    switch("0000:17:01.0", "0000:18:00.0", ["0000:19:00.0", "0000:19:01.0"], 0)
    switch("0000:19:00.0", "0000:1a:00.0", ["0000:1b:00.0", "0000:1b:01.0"], 0)
    gpu("0000:1c:00.0", "0000:1b:00.0", 0, 2)
    gpu("0000:1d:00.0", "0000:1b:01.0", 0, 3)
    nic("0000:1e:00.0", "0000:19:01.0", 0, "mlx5_1", "ens2f0np0")
    nic("0000:1e:00.1", "0000:19:01.0", 0, "mlx5_2", "ens2f1np1")

    root_port("pci0000:80", "0000:80:01.0", 1)
    switch("0000:80:01.0", "0000:81:00.0", [f"0000:82:0{d}.0" for d in range(4)], 1)
    gpu("0000:83:00.0", "0000:82:00.0", 1, 4, link=Link(32.0, 8, 32.0, 16) if faults else gen5)
    gpu("0000:84:00.0", "0000:82:01.0", 1, 5, bar1=256 * MIB if faults else 128 * GIB)
    nic("0000:85:00.0", "0000:82:02.0", 1, "mlx5_3", "ibp133s0")
    nvme("0000:86:00.0", "0000:82:03.0", 1, 1, multipath=True)

    root_port("pci0000:c0", "0000:c0:01.0", 1)
    acs = acs_redirect if faults else None
    switch("0000:c0:01.0", "0000:c1:00.0", ["0000:c2:00.0", "0000:c2:01.0"], 1, acs=acs)
    gpu("0000:c3:00.0", "0000:c2:00.0", 1, 6)
    gpu("0000:c4:00.0", "0000:c2:01.0", 1, 7)
    return t


NVSWITCHES = ["0000:e1:00.0", "0000:e2:00.0", "0000:e3:00.0", "0000:e4:00.0"]


def build_hgx(root: Path | str) -> SysfsTree:
    """The 8-GPU box of build_8gpu, without its faults, with an HGX board's four
    NVSwitches (NVIDIA 0x22a3, class 0x068000, "other bridge"), each on a root
    port of its own below pci0000:e0."""
    t = build_8gpu(root, faults=False)
    for n, bdf in enumerate(NVSWITCHES):
        port = f"0000:e0:0{n + 1}.0"
        t.device(port, "pci0000:e0", 0x8086, 0x352A, 0x060400, numa=1, port_type=ROOT_PORT,
                 link=Link(16.0, 2, 16.0, 2))  # fmt: skip
        t.device(bdf, port, 0x10DE, 0x22A3, 0x068000, numa=1, link=Link(16.0, 2, 16.0, 2),
                 driver="nvidia-nvswitch")  # fmt: skip
    return t


BUILDERS = {"h200x2": build_h200x2, "8gpu": build_8gpu, "hgx": build_hgx}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BUILDERS))
    parser.add_argument("dir", type=Path, help="directory to create")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    args = parser.parse_args(argv)
    if args.dir.exists():
        if not args.force:
            parser.error(f"{args.dir} already exists (--force replaces it)")
        shutil.rmtree(args.dir)
    BUILDERS[args.name](args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
