"""pod-init: node runtime for GPU training machines."""

from pyinit._native import __version__
from pyinit.topology import Acs, Bar, Bar0, Device, Finding, Link, Matrix, Topology, scan

__all__ = [
    "Acs",
    "Bar",
    "Bar0",
    "Device",
    "Finding",
    "Link",
    "Matrix",
    "Topology",
    "__version__",
    "scan",
]
