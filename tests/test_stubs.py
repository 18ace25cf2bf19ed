"""The committed type stub is generated from the module; it must not drift."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import run

REPO = Path(__file__).resolve().parent.parent


def test_native_stub_is_current(tmp_path):
    stubgen = Path(sys.executable).parent / "pybind11-stubgen"
    if not stubgen.exists():
        stubgen = shutil.which("pybind11-stubgen")
    if stubgen is None:
        pytest.skip("pybind11-stubgen is not installed (the test command installs it)")
    proc = run([stubgen, "pyinit._native", "-o", tmp_path], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    generated = (tmp_path / "pyinit/_native.pyi").read_text()
    committed = (REPO / "pyinit/_native.pyi").read_text()
    assert generated == committed, (
        "pyinit/_native.pyi is stale: regenerate with `pybind11-stubgen pyinit._native -o .`"
    )
