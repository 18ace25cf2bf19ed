"""What PID 1 left for this boot in ``/run/pod-init`` (see
``csrc/init/boot_state.hpp``): its topology scan, its NCCL files and the boot's
timeline, named by the boot id they describe. ``pyinit run`` reuses them
instead of scanning again when they describe this boot and the same tree."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinit.errors import InputError
from pyinit.jsonfile import read_input_text

DEFAULT_DIR = "/run/pod-init"


@dataclass(frozen=True)
class BootState:
    folder: Path
    boot_id: str
    sysfs_root: str
    topology_path: Path
    nccl_dir: Path | None
    nccl_env: dict[str, str]
    timeline: tuple[dict[str, Any], ...]


def current_boot_id(proc_root: str = "/proc") -> str:
    """This boot's id, read by the same code PID 1 writes node.json with."""
    from pyinit import _native

    return _native.read_boot_id(proc_root)


def read_boot_state(folder: str | os.PathLike[str] = DEFAULT_DIR) -> BootState | None:
    """The folder's state, or None when there is none (no ``node.json``).
    ``InputError`` naming the file when ``node.json`` is damaged; ``OSError``
    when it exists but cannot be read."""
    folder = Path(folder)
    manifest = folder / "node.json"
    try:
        text = read_input_text(manifest)
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
        nccl = raw["nccl"]
        return BootState(
            folder=folder,
            boot_id=str(raw["boot_id"]),
            sysfs_root=str(raw["sysfs_root"]),
            topology_path=folder / str(raw["topology"]),
            nccl_dir=None if nccl is None else Path(nccl["dir"]),
            nccl_env={} if nccl is None else {str(k): str(v) for k, v in nccl["env"].items()},
            timeline=tuple(raw["timeline"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"not a pod-init boot state: {e!r}", file=str(manifest)) from None


def reusable(state: BootState | None, sysfs_root: str, proc_root: str = "/proc") -> bool:
    """True when ``state`` describes this boot (the same boot id) and the same tree."""
    if state is None:
        return False
    boot_id = current_boot_id(proc_root)
    return bool(boot_id) and state.boot_id == boot_id and state.sysfs_root == sysfs_root
