"""How long `pyinit run` takes from its start to torchrun's spawn (preflight
and, with GPUs, the NCCL files included), and how long `import pyinit` takes.

    python bench/run_startup.py [--runs 10] [--out DIR]

The spawn time is the wall clock between starting the `pyinit run` process
and the `spawn` event in its log, so interpreter start-up counts. NVML is
present where a driver is (GPU machines), absent here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyinit.jsonfile import write_json

TARGET_SPAWN_MS = 300.0
TARGET_IMPORT_MS = 100.0


def spawn_ms(pyinit: str | Path, script: Path, run_dir: Path, *options: str) -> float:
    """From starting `pyinit run` (with `options`) to its spawn event, in ms:
    the launcher's own cost, so with no warm interpreter used or left behind
    (PYINIT_WARM=off; an earlier commit ignores it)."""
    start = time.time()
    subprocess.run([pyinit, "run", "--nproc-per-node", "1", *options, "--run-dir", run_dir, "--",
                    script], check=True, capture_output=True,
                   env=dict(os.environ, PYINIT_WARM="off"))  # fmt: skip
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    spawn = next(e for e in map(json.loads, reversed(lines)) if e["event"] == "spawn")
    return (spawn["time"] - start) * 1e3


def import_ms() -> float:
    start = time.perf_counter()
    # From /: a checkout in the working directory would shadow the installed package.
    subprocess.run([sys.executable, "-c", "import pyinit"], check=True, cwd="/")
    return (time.perf_counter() - start) * 1e3


def python_ms() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, cwd="/")
    return (time.perf_counter() - start) * 1e3


def nvml_present() -> bool:
    try:
        from pyinit.nvml import NvmlUnavailable, read_nvml

        read_nvml()
        return True
    except (ImportError, NvmlUnavailable):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for run_startup.json")
    args = parser.parse_args()
    pyinit = shutil.which("pyinit")
    if pyinit is None:
        print("run_startup: no pyinit on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "noop.py"
        script.write_text("pass\n")
        spawns, imports, bare = [], [], []
        for i in range(args.runs):  # interleaved, so drift hits all three alike
            spawns.append(spawn_ms(pyinit, script, Path(scratch) / f"run{i}"))
            imports.append(import_ms())
            bare.append(python_ms())
    document = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": os.uname().nodename,
        "nvml": nvml_present(),
        "spawn_ms": spawns,
        "import_ms": imports,
        "python_ms": bare,
        "median": {
            "spawn_ms": statistics.median(spawns),
            "import_ms": statistics.median(imports),
            "python_ms": statistics.median(bare),
        },
    }
    m = document["median"]
    print(f"median of {args.runs}, NVML {'present' if document['nvml'] else 'absent'}")
    print(f"{'pyinit run start to torchrun spawn':36} {m['spawn_ms']:7.1f} ms  (target < 300)")
    label = "python -c 'import pyinit'"
    print(f"{label:36} {m['import_ms']:7.1f} ms  (target < 100)")
    print(f"{'python -c pass (the floor)':36} {m['python_ms']:7.1f} ms")
    write_json(Path(args.out) / "run_startup.json", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
