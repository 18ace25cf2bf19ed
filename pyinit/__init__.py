"""pod-init: node runtime for GPU training machines."""

from pyinit._native import __version__
from pyinit.nccl import configure as configure_nccl
from pyinit.nvml import NvmlUnavailable, NvmlView, read_nvml
from pyinit.topology import Acs, Bar, Bar0, Device, Finding, Link, Matrix, Topology, scan

__all__ = [
    "Acs",
    "Bar",
    "Bar0",
    "Device",
    "Finding",
    "Link",
    "Matrix",
    "NvmlUnavailable",
    "NvmlView",
    "Topology",
    "__version__",
    "configure_nccl",
    "read_nvml",
    "scan",
]
