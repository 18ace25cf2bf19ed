"""
pod-init native core: PCIe topology scan and NCCL configuration
"""
from __future__ import annotations
import collections.abc
import typing
__all__: list[str] = ['InputError', 'NcclConfig', 'Topology', 'expand_nodelist', 'nccl_config', 'scan_topology']
class InputError(ValueError):
    pass
class Topology:
    def merge_nvlinks(self, details: collections.abc.Mapping[str, tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, collections.abc.Sequence[tuple[str, str, typing.SupportsInt | typing.SupportsIndex]]]]) -> None:
        """
        Adds NVLink counts (NV#) to the matrix from NVML's view.
        """
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
class NcclConfig:
    def summary(self) -> str:
        """
        What `pod-init nccl` prints.
        """
    def write(self) -> None:
        """
        Writes every file under out_dir, each whole or not at all.
        """
    @property
    def env(self) -> dict[str, str]:
        """
        The env file's settings (the environment's values where it had them).
        """
    @property
    def files(self) -> dict[str, str]:
        """
        File name -> content, as write() puts them in out_dir.
        """
    @property
    def node_rank(self) -> int:
        ...
    @property
    def out_dir(self) -> str:
        ...
    @property
    def ring(self) -> list[int]:
        """
        GPU indices in ring order.
        """
def expand_nodelist(nodelist: str) -> list[str]:
    """
    node[01-03],gpu-a -> [node01, node02, node03, gpu-a] (SLURM style).
    """
def nccl_config(sysfs_root: str = '/sys', proc_root: str = '/proc', hints: str = '', hostfile: str = '', hostfile_text: str = '', out_dir: str = '.', socket_ifname: str = '', force_rings: bool = False, channels: typing.SupportsInt | typing.SupportsIndex = 0, details: collections.abc.Mapping[str, tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, collections.abc.Sequence[tuple[str, str, typing.SupportsInt | typing.SupportsIndex]]]] = {}, environment: collections.abc.Mapping[str, str] = {}) -> NcclConfig:
    """
    Builds the NCCL configuration (nothing is written until write()). Raises InputError for bad input, OSError when sysfs cannot be read.
    """
def scan_topology(sysfs_root: str = '/sys', expect_gpus: typing.SupportsInt | typing.SupportsIndex = -1, probe_bar0: bool = True) -> Topology:
    """
    Scans the PCI tree under sysfs_root. Raises OSError when it has no bus/pci/devices.
    """
__version__: str = '0.1.0'
