"""Wall time of `pod-init topo --json` on the 8-GPU fixture and on the live
sysfs, beside `lspci -tv` and `nvidia-smi topo -m` where they are installed.

Each command runs --repeat times, interleaved so that a noisy neighbour hits
all of them alike; the table shows medians. Target: under 5 ms for the 8-GPU
fixture on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from pyinit.jsonfile import write_json

REPO = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(REPO / "tests"))
import sysfs_fixtures  # noqa: E402

TARGET_MS = 5.0


def time_command(cmd: list[str]) -> tuple[float, dict | None]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"topo_scan: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    internal = None
    if "--json" in cmd:
        internal = json.loads(proc.stdout)
    return elapsed, internal


def measure(pod_init: str, repeat: int) -> list[dict]:
    """Each command `repeat` times, in turns; a row of medians per command."""
    with tempfile.TemporaryDirectory() as tmp:
        fixture = Path(tmp) / "8gpu"
        sysfs_fixtures.build_8gpu(fixture)
        commands = {
            "pod-init topo --json (8-GPU fixture)": [
                pod_init,
                "topo",
                "--json",
                "--sysfs-root",
                str(fixture),
            ],
            "pod-init topo --json (live /sys)": [pod_init, "topo", "--json"],
        }
        if shutil.which("lspci"):
            commands["lspci -tv (live)"] = ["lspci", "-tv"]
        if shutil.which("nvidia-smi"):
            commands["nvidia-smi topo -m (live)"] = ["nvidia-smi", "topo", "-m"]

        wall: dict[str, list[float]] = {name: [] for name in commands}
        internal: dict[str, list[float]] = {name: [] for name in commands}
        devices: dict[str, int] = {}
        for _ in range(repeat):
            for name, cmd in commands.items():
                elapsed, doc = time_command(cmd)
                wall[name].append(elapsed)
                if doc is not None:
                    internal[name].append(doc["scan_seconds"])
                    devices[name] = len(doc["devices"])

    rows = []
    for name in commands:
        rows.append(
            {
                "command": name,
                "pci_functions": devices.get(name),
                "wall_ms_median": statistics.median(wall[name]) * 1e3,
                "wall_ms_min": min(wall[name]) * 1e3,
                "scan_ms_median": (
                    statistics.median(internal[name]) * 1e3 if internal[name] else None
                ),
            }
        )

    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--pod-init", default=shutil.which("pod-init") or "pod-init")
    parser.add_argument(
        "--out", type=Path, default=Path("."), metavar="DIR", help="folder for topo_scan.json"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")

    rows = measure(args.pod_init, args.repeat)
    print(
        f"{'command':40} {'functions':>9} {'wall median':>12} {'wall min':>9} "
        f"{'in-process scan':>16}"
    )
    for row in rows:
        scan = f"{row['scan_ms_median']:.2f} ms" if row["scan_ms_median"] is not None else "-"
        funcs = row["pci_functions"] if row["pci_functions"] is not None else "-"
        print(
            f"{row['command']:40} {funcs:>9} {row['wall_ms_median']:>9.2f} ms "
            f"{row['wall_ms_min']:>6.2f} ms {scan:>16}"
        )
    fixture_ms = rows[0]["wall_ms_median"]
    verdict = "meets" if fixture_ms < TARGET_MS else "MISSES"
    print(
        f"\n8-GPU fixture: {fixture_ms:.2f} ms median, {verdict} the {TARGET_MS} ms target "
        f"({args.repeat} runs, {os.cpu_count()} CPUs)"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    host = platform.node() or "unknown"
    result = {
        "benchmark": "topo_scan",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "target_ms": TARGET_MS,
        "rows": rows,
    }
    path = write_json(args.out / "topo_scan.json", result, indent=2)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
