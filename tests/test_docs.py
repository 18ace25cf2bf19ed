"""Every example in the README and in docs/ runs as written, on a CPU machine,
against the bundled fixture and the recorded NVML answers: each ```sh block
with bash (set -e), each ```python block with this interpreter, from the
repository root, README first (its quick start makes the files the others
use). Blocks meant for other machines are fenced as ```text; the install
commands are left out (they would change the environment the suite runs in)."""

from __future__ import annotations

import os
import re
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


DEMO = "/tmp/pod-init-demo"  # where the docs' examples write


@pytest.mark.slow
def test_the_readme_runs_in_one_fresh_shell_twice_then_every_doc_example(tmp_path):
    """The README as a reader runs it: one shell, the blocks in order, no
    environment activated beforehand (its first block does that), then all of
    it again; then each docs/ example, which uses what the README made."""
    if not (REPO / ".venv/bin/activate").exists():
        pytest.skip("no .venv here: ./bootstrap makes the one the README activates")
    # In a folder of this run's own: another user's or job's demo folder is theirs.
    demo = tmp_path / "demo"
    readme = [(n, lang, code) for n, lang, code in examples() if n.startswith("README.md#")]
    assert readme and all(language == "sh" for _, language, _ in readme)
    script = "\n".join(code for _, _, code in readme).replace(DEMO, str(demo))
    venv_bin = str(REPO / ".venv/bin")
    fresh = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    fresh["PATH"] = ":".join(p for p in os.environ["PATH"].split(":") if p not in (venv_bin, ""))
    for attempt in (1, 2):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=fresh,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"pass {attempt}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    ran = []
    for name, language, written in examples():
        if name.startswith("README.md#"):
            continue
        code = written.replace(DEMO, str(demo))
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "sh" else [
            sys.executable, "-c", code]  # fmt: skip
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert proc.returncode == 0, (
            f"{name} failed:\n{code}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
        ran.append(name)
    assert len(ran) >= 5


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "initramfs/README.md"]


def test_the_extras_named_anywhere_exist():
    import tomllib

    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                   ["optional-dependencies"])  # fmt: skip
    texts = [p.read_text() for p in DOCS] + [p.read_text() for p in (REPO / "pyinit").rglob("*.py")]
    named = {m for text in texts for m in re.findall(r"pod-init\[([a-z,]+)\]", text)}
    unknown = {e for group in named for e in group.split(",")} - declared
    assert not unknown, f"extras named but not in pyproject.toml: {sorted(unknown)}"


def command_lines(program: str) -> list[str]:
    """Every `program ...` the docs show, in code spans and blocks, up to a
    ` -- ` (the rest is the script's)."""
    found = []
    for doc in DOCS:
        for code in re.findall(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", doc.read_text(), re.S):
            for line in "".join(code).splitlines():
                line = re.sub(r"\([^)]*\)", "", line)  # asides in parentheses are not options
                for m in re.finditer(rf"(?:^|[\s(|;&]){re.escape(program)} ([^|;&#]*)", line):
                    words = re.sub(r"'[^']*'|\"[^\"]*\"", "", m.group(1))  # quoted: values
                    words = words.split(" -- ")[0]
                    found.append(words)
    return found


def test_the_pyinit_options_in_the_docs_exist():
    from pyinit.cli import COMMANDS, build_parser

    wrong = []
    for words in command_lines("pyinit"):
        parts = words.split()
        if not parts or parts[0] not in COMMANDS:
            continue
        argv = parts[:2] if parts[0] == "bench" and len(parts) > 1 else parts[:1]
        _, parser = build_parser(argv)
        if parser is None:
            continue
        known = set(parser._option_string_actions)
        for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(parts[len(argv) :])):
            if option not in known:
                wrong.append(f"pyinit {' '.join(argv)} {option}")
    assert not wrong, "options the docs name that pyinit does not have: " + ", ".join(
        sorted(set(wrong)))  # fmt: skip


def test_the_pod_init_options_in_the_docs_exist(pod_init_bin):
    pages = {}
    wrong = []
    for words in command_lines("pod-init"):
        parts = words.split()
        command = parts[0] if parts and not parts[0].startswith("-") else ""
        if command and command not in ("topo", "nccl", "read", "modules", "params", "bringup"):
            continue
        if command not in pages:
            pages[command] = subprocess.run(
                [pod_init_bin, *([command] if command else []), "--help"],
                capture_output=True,
                text=True,
            ).stdout
        for option in re.findall(
            r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(parts[1 if command else 0 :])
        ):
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", pages[command]):
                wrong.append(f"pod-init {command} {option}".replace("  ", " "))
    assert not wrong, "options the docs name that pod-init does not have: " + ", ".join(
        sorted(set(wrong)))  # fmt: skip
