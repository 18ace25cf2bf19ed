"""
pod-init native core: PCIe topology scan
"""
from __future__ import annotations
import typing
__all__: list[str] = ['Topology', 'scan_topology']
class Topology:
    def to_json(self) -> str:
        """
        The document `pod-init topo --json` prints.
        """
    def to_text(self) -> str:
        """
        The matrix `pod-init topo` prints.
        """
    @property
    def has_errors(self) -> bool:
        """
        True when a finding has severity error.
        """
def scan_topology(sysfs_root: str = '/sys', expect_gpus: typing.SupportsInt | typing.SupportsIndex = -1, probe_bar0: bool = True) -> Topology:
    """
    Scans the PCI tree under sysfs_root. Raises OSError when it has no bus/pci/devices.
    """
__version__: str = '0.1.0'
