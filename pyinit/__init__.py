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
    "DirectReader",
    "Finding",
    "Link",
    "Matrix",
    "NvmlUnavailable",
    "NvmlView",
    "TokenShardDataset",
    "Topology",
    "__version__",
    "aligned_empty",
    "configure_nccl",
    "read_nvml",
    "scan",
]

# The reader pulls in numpy and the dataset torch; load them on first use so
# `import pyinit` stays quick.
_LAZY = {
    "DirectReader": "pyinit.io",
    "aligned_empty": "pyinit.io",
    "TokenShardDataset": "pyinit.data",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pyinit' has no attribute {name!r}")
