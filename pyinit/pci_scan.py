"""The core's scan of the PCI tree, without the tree's Python view
(``pyinit.topology``, a dozen dataclasses to import and build): for what
reads no more than the scan as it is, a node's NCCL plan and a health
check's findings (``pyinit.finding``)."""

from __future__ import annotations

import os

from pyinit import _native


def scan_native(sysfs_root: str = "/sys", expect_gpus: int | None = None,
                probe_bar0: bool = True) -> _native.Topology:  # fmt: skip
    """The core's scan of the tree under ``sysfs_root`` (what it raises:
    :func:`pyinit.topology.scan`)."""
    if expect_gpus is not None and expect_gpus < 0:
        raise ValueError(f"expect_gpus must be >= 0, got {expect_gpus}")
    # Bytes: a path that is not UTF-8 (argv decodes it with surrogate escapes) still names it.
    expected = -1 if expect_gpus is None else expect_gpus
    return _native.scan_topology(os.fsencode(sysfs_root), expected, probe_bar0)
