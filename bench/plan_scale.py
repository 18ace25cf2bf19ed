"""How long one node's NCCL plan takes in a large cluster, process start
included: `pod-init nccl` and `pyinit nccl --node K` with a hostfile of 64 and
of 512 nodes and the 8-GPU fixture's topology, interleaved, median of the
rounds, beside each target (64 nodes: under 50 ms, 512: under 200 ms).

    python bench/plan_scale.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
import sysfs_fixtures  # noqa: E402

from pyinit.jsonfile import write_json  # noqa: E402

TARGETS_MS = {64: 50.0, 512: 200.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for plan_scale.json")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    tools = {"pod-init": [str(bin_dir / "pod-init")], "pyinit": [str(bin_dir / "pyinit")]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sysfs_fixtures.build_8gpu(folder / "sys")
        # Bytecode written, as a wheel's install leaves it: with PYTHONDONTWRITEBYTECODE
        # an editable install would compile the package at every start.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("NCCL_") and k != "PYTHONDONTWRITEBYTECODE"}  # fmt: skip
        for count, target in TARGETS_MS.items():
            hostfile = folder / f"hosts-{count}"
            hostfile.write_text("".join(f"10.{i // 4000}.{i // 250 % 16}.{i % 250 + 1}\n"
                                        for i in range(count)))  # fmt: skip
            times: dict[str, list[float]] = {tool: [] for tool in tools}
            for round_no in range(-1, args.rounds):  # round -1: untimed, to warm the caches
                order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
                for tool in order:
                    command = [*tools[tool], "nccl", "--sysfs-root", str(folder / "sys"),
                               "--hostfile", str(hostfile), "--node", str(count - 1),
                               "--out", str(folder / "out" / tool)]  # fmt: skip
                    if tool == "pyinit":
                        command.append("--no-nvml")
                    began = time.perf_counter()
                    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
                    if round_no >= 0:
                        times[tool].append((time.perf_counter() - began) * 1e3)
            for tool, values in times.items():
                rows.append({"nodes": count, "tool": tool, "median_ms": statistics.median(values),
                             "min_ms": min(values), "target_ms": target})  # fmt: skip
        shutil.rmtree(folder / "out", ignore_errors=True)
    print(f"{'nodes':>5} {'tool':9} {'median ms':>10} {'min ms':>8} {'target':>8}")
    for row in rows:
        met = "met" if row["median_ms"] < row["target_ms"] else "missed"
        print(f"{row['nodes']:5} {row['tool']:9} {row['median_ms']:10.1f} {row['min_ms']:8.1f} "
              f"{'< ' + format(row['target_ms'], 'g'):>8} {met}")  # fmt: skip
    write_json(Path(args.out) / "plan_scale.json",
               {"date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
                "fixture": "8gpu", "rounds": args.rounds, "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
