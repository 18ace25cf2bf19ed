"""NCCL configuration for this node: the native core builds the topology file,
the ring graph, the env file and the hosts lines; this layer adds what only
NVML knows (NVLinks, compute capability) when a driver is there."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyinit import _native
from pyinit.nvml import NvmlView


def configure(
    sysfs_root: str = "/sys",
    *,
    hints: str | None = None,
    hostfile: str | None = None,
    out_dir: str = ".",
    socket_ifname: str | None = None,
    force_rings: bool = False,
    channels: int | None = None,
    nvml: NvmlView | None = None,
    environment: Mapping[str, str] | None = None,
    proc_root: str = "/proc",
) -> _native.NcclConfig:
    """Builds the configuration without writing it; call ``.write()`` for that.

    ``environment`` (default ``os.environ``): ``NCCL_*`` values set there win
    over pod-init's and are reported. Raises ``ValueError``
    (``_native.InputError``, naming the file and line) for bad input and
    ``OSError`` when sysfs cannot be read.
    """
    env = os.environ if environment is None else environment
    return _native.nccl_config(
        sysfs_root=str(sysfs_root),
        proc_root=str(proc_root),
        hints=str(hints or ""),
        hostfile=str(hostfile or ""),
        out_dir=str(out_dir),
        socket_ifname=socket_ifname or "",
        force_rings=force_rings,
        channels=channels or 0,
        details=nvml.details() if nvml is not None else {},
        environment={k: v for k, v in env.items() if k.startswith("NCCL_")},
    )
