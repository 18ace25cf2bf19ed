"""The Python package's shape: imports go down the layers (or stay within
their own package), no module reaches into another package's private module,
and docs/layout.md names every module of each package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyinit"
# Lowest first; the longest prefix names a module's layer.
LAYERS = [
    ["pyinit", "pyinit._native", "pyinit.errors", "pyinit.extras", "pyinit.argtypes",
     "pyinit.jsonfile", "pyinit.phases", "pyinit.plotting"],
    ["pyinit.nvml", "pyinit.io", "pyinit.boot_state", "pyinit.health.xid", "pyinit.finding",
     "pyinit.pci_scan"],
    ["pyinit.topology"],
    ["pyinit.health", "pyinit.data", "pyinit.checkpoint", "pyinit.nccl", "pyinit.monitor",
     "pyinit.runlog"],
    ["pyinit.run", "pyinit.worker", "pyinit.analysis"],
    ["pyinit.bench"],
    ["pyinit.commands"],
    ["pyinit.cli"],
]  # fmt: skip
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every pyinit module the file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pyinit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyinit"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names} & known
    return found


def layer(name: str) -> int:
    owner = max((n for n in RANK if name == n or name.startswith(n + ".")), key=len)
    return RANK[owner]


# pyinit.worker is the run's face to a training script (its import path stays short).
SAME_CONCERN = {"pyinit.worker": "pyinit.run"}


def concern(name: str) -> str:
    """The package a module belongs to; the base layer is one concern."""
    if layer(name) == 0:
        return "base"
    top = ".".join(name.split(".")[:2])
    return SAME_CONCERN.get(top, top)


def test_every_module_has_a_layer():
    assert all(layer(name) >= 0 for name in modules())


def test_imports_go_down_the_layers():
    known = set(modules())
    wrong = []
    for name, path in modules().items():
        for target in imports(path, known) - {name}:
            if layer(target) > layer(name) or (
                layer(target) == layer(name) and concern(target) != concern(name)
            ):
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_reach_into_another_package_s_private_modules():
    known = set(modules())
    wrong = []
    for name, path in modules().items():
        for target in imports(path, known):
            parts = target.split(".")
            private = [i for i, part in enumerate(parts) if part.startswith("_")]
            if private and target != "pyinit._native":
                owner = ".".join(parts[: private[0]])
                if not (name == owner or name.startswith(owner + ".")):
                    wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_layout_doc_names_every_module():
    doc = (ROOT / "docs" / "layout.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(pyinit/[a-z_/]*)` \| (.*) \|$",
                                                        doc, re.M)}  # fmt: skip
    missing = []
    for name, path in modules().items():
        folder = path.parent.relative_to(ROOT).as_posix() + "/"
        stem = path.stem
        if stem == "__init__" or (stem == "_native"):
            continue
        if f"`{stem}`" not in rows.get(folder, ""):
            missing.append(f"{name} (in the `{folder}` row)")
    for folder in {p.parent.relative_to(ROOT).as_posix() + "/" for p in PACKAGE.rglob("*.py")}:
        if "__pycache__" not in folder and folder not in rows:
            missing.append(f"the `{folder}` row")
    assert not missing, "docs/layout.md does not name: " + ", ".join(sorted(missing))


def test_every_command_module_has_the_convention():
    """cli imports command modules by name, where the import test cannot see them."""
    import importlib

    from pyinit.cli import COMMANDS

    names = set()
    for target, _help in COMMANDS.values():
        names |= {m for m, _ in target.values()} if isinstance(target, dict) else {target}
    for name in sorted(names):
        module = importlib.import_module(name)
        assert callable(module.add_arguments) and callable(module.main), name
    files = {module_name(p) for p in (PACKAGE / "commands").glob("[a-z]*.py")}
    assert files <= names, f"command modules no command names: {sorted(files - names)}"


def test_help_imports_no_command():
    """`pyinit --help` lists the commands from cli's table alone."""
    import subprocess
    import sys

    code = (
        "import sys, pyinit.cli as c\ntry: c.main(['--help'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pyinit.', 'torch', 'numpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    # The bytecode cache is looked at before any command's imports (pyinit.bytecode,
    # which says in one line when it cannot be), and a stop signal is taken before them
    # too (pyinit.termination).
    assert loaded == ["pyinit.bytecode", "pyinit.cli", "pyinit.errors", "pyinit.extras",
                      "pyinit.private_folder", "pyinit.say",
                      "pyinit.termination"], loaded  # fmt: skip


def test_no_help_page_imports_torch():
    """Every command's --help is instant: none imports torch (the missing-extra
    line comes when the command runs, not when its options are listed)."""
    import subprocess
    import sys

    from pyinit.cli import COMMANDS

    pages = [[name] for name, (target, _) in COMMANDS.items() if not isinstance(target, dict)]
    pages += [["bench", kind] for kind in COMMANDS["bench"][0]]
    code = ("import sys, pyinit.cli as c\n"
            "for page in sys.argv[1:]:\n"
            "    try: c.main(page.split() + ['--help'])\n"
            "    except SystemExit as e: assert e.code == 0, (page, e.code)\n"
            "print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, *map(" ".join, pages)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout[-500:]


def test_public_cpp_headers_keep_detail_private():
    """A header beside a concern's sources is its interface: it names detail/
    types at most, so their definitions do not reach every includer."""
    wrong = []
    for header in sorted((ROOT / "csrc").rglob("*.hpp")):
        if "detail" in header.parts:
            continue
        for line in header.read_text().splitlines():
            if re.match(r'#include "[a-z_]+/detail/', line):
                wrong.append(f"{header.relative_to(ROOT)}: {line}")
    assert not wrong, "\n".join(wrong)
