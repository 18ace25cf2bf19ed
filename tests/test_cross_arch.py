"""The code written for the other architecture pod-init runs on (aarch64, as
on Grace nodes), cross-built and run under QEMU's user-mode emulation: this
machine cannot run it otherwise."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_crc_on_aarch64_is_the_definition_by_every_method(tmp_path):
    compiler, emulator = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not (compiler and emulator):
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (./bootstrap test installs them)")
    program = tmp_path / "crc32c_check"
    # The warnings the project's own build treats as errors.
    warnings = re.search(r"set\(POD_INIT_WARNINGS ([^)]*)\)", (REPO / "CMakeLists.txt").read_text())
    subprocess.run(
        [compiler, "-O2", "-static", "-std=c++17", *warnings.group(1).split(),
         f"-I{REPO / 'csrc'}", "-o", program,
         REPO / "csrc/common/tests/crc32c_check.cpp", REPO / "csrc/common/crc32c.cpp"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    done = subprocess.run([emulator, program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The table, and the CRC extension's lanes (QEMU's CPU has the extension).
    assert done.stdout.split(":")[1].split() == ["0", "1"], done.stdout
