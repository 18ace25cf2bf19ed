"""`pyinit check` beside `nvidia-smi -q`: wall time of each, interleaved.

python3 bench/check_time.py [--expect-gpus N] [--rounds 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyinit.jsonfile import write_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expect-gpus", type=int)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for check_time.json")
    args = parser.parse_args()
    check = ["pyinit", "check"]
    if args.expect_gpus is not None:
        check += ["--expect-gpus", str(args.expect_gpus)]
    commands = {"pyinit check": check, "nvidia-smi -q": ["nvidia-smi", "-q"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for round_no in range(args.rounds):
        for name in list(commands) if round_no % 2 == 0 else list(commands)[::-1]:
            began = time.perf_counter()
            done = subprocess.run(commands[name], capture_output=True, text=True)
            times[name].append(time.perf_counter() - began)
            if round_no == 0 and name == "pyinit check":
                print(done.stdout.strip(), "exit", done.returncode)
    for name, values in times.items():
        print(f"{name:16} median {statistics.median(values) * 1e3:7.1f} ms  "
              f"(min {min(values) * 1e3:.1f})")  # fmt: skip
    write_json(Path(args.out) / "check_time.json", times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
