"""Every example in the README and in docs/ runs as written, on a CPU machine,
against the bundled fixture and the recorded NVML answers: each ```sh block
with bash (set -e), each ```python block with this interpreter, from the
repository root, README first (its quick start makes the files the others
use). Blocks meant for other machines are fenced as ```text; the install
commands are left out (they would change the environment the suite runs in)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```$", re.M | re.S)


def examples() -> list[tuple[str, str, str]]:
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, (language, code) in enumerate(BLOCK.findall(doc.read_text())):
            if "./bootstrap" in code or "pip install" in code:
                continue  # setting up is what the suite runs in, not an example to run in it
            found.append((f"{doc.relative_to(REPO)}#{number}", language, code))
    return found


@pytest.mark.slow
def test_every_example_runs_as_written():
    shutil.rmtree("/tmp/pod-init-demo", ignore_errors=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    ran = []
    for name, language, code in examples():
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "sh" else [
            sys.executable, "-c", code]  # fmt: skip
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert proc.returncode == 0, (
            f"{name} failed:\n{code}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
        ran.append(name)
    assert len(ran) >= 10 and any(n.startswith("docs/") for n in ran)
