"""Where measured tunings are kept between runs: one table per kind of node
(``NodeKind.id``), found again by the next ``pyinit nccl --tune`` and by
``pyinit run``, or named as stale when the NCCL or driver moved on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyinit.nccl.tuning import (
    NodeKind,
    Tuning,
    installed_nccl_version,
    node_kind,
    read_table,
    write_table,
)

CACHE_ENV = "POD_INIT_CACHE"
DEFAULT_CACHE = "/var/cache/pod-init"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(CACHE_ENV) or DEFAULT_CACHE) / "nccl-tuning"


def cached(key: NodeKind, directory: Path) -> Tuning | None:
    """The cached table for exactly this kind of node, or None. A cache file
    that cannot be read or parsed is treated as absent (measured again)."""
    path = directory / f"{key.id}.json"
    try:
        tuning = read_table(path)
    except (OSError, ValueError):
        return None
    return tuning if tuning.key == key else None


def cached_for_hardware(topology: Any, nvml: Any, directory: Path) -> Tuning | None:
    """For a node whose NCCL version is unknown: the cached table written
    last for exactly this hardware (every field of its kind but NCCL's
    version), or None."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            table, written = read_table(path), path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if table.key == node_kind(topology, nvml, table.key.nccl_version):
            found.append((written, path.name, table))
    return max(found, key=lambda item: item[:2])[2] if found else None


def store(tuning: Tuning, directory: Path) -> Path:
    return write_table(directory / f"{tuning.key.id}.json", tuning)


def find(key: NodeKind, directory: Path) -> tuple[Tuning | None, str]:
    """The cached table for this node, or None and why not: nothing cached,
    or the nearest cached table and what differs (a new NCCL or driver
    makes a table stale, not wrong: measure again)."""
    hit = cached(key, directory)
    if hit is not None:
        return hit, f"{directory / key.id}.json"
    nearest: list[str] | None = None
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            other = read_table(path)
        except (OSError, ValueError):
            continue
        differences = other.key.differences(key)
        same_hardware = other.key.gpu_model == key.gpu_model and other.key.topology == key.topology
        if same_hardware and (nearest is None or len(differences) < len(nearest)):
            nearest = differences
    if nearest is None:
        return None, f"no NCCL tuning for this kind of node in {directory} (pyinit nccl --tune)"
    return None, "the cached NCCL tuning is stale: " + ", ".join(nearest) + " (pyinit nccl --tune)"


def for_run(topology: Any, nvml: Any, directory: Path) -> tuple[Tuning | None, str]:
    """The cached tuning that fits this node and the NCCL a run will load,
    with its file; or None and the one line that says why not."""
    version = installed_nccl_version()
    if version is None:
        return None, "NCCL's version is unknown here (no nvidia-nccl-cu* package)"
    return find(node_kind(topology, nvml, version), directory)
