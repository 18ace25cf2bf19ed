from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sysfs_fixtures

BIN_DIR = Path(sys.executable).parent


@pytest.fixture(scope="session")
def pod_init_bin() -> Path:
    path = BIN_DIR / "pod-init"
    assert path.exists(), f"{path} missing: install the package with pip first"
    return path


@pytest.fixture(scope="session")
def pyinit_bin() -> Path:
    path = BIN_DIR / "pyinit"
    assert path.exists(), f"{path} missing: install the package with pip first"
    return path


@pytest.fixture(scope="session")
def h200x2_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sysfs") / "h200x2"
    sysfs_fixtures.build_h200x2(root)
    return root


@pytest.fixture(scope="session")
def eightgpu_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sysfs") / "8gpu"
    sysfs_fixtures.build_8gpu(root)
    return root


@pytest.fixture
def fresh_8gpu(tmp_path) -> sysfs_fixtures.SysfsTree:
    """An 8-GPU tree a test may damage."""
    return sysfs_fixtures.build_8gpu(tmp_path / "8gpu")


def run(cmd: list[str | os.PathLike], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=60, **kwargs
    )


def run_json(cmd: list[str | os.PathLike]) -> tuple[int, dict]:
    proc = run(cmd)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, json.loads(proc.stdout)
