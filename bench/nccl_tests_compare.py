"""`pyinit bench COLLECTIVE` beside nccl-tests' own binary, the same flags,
alternating: do the sizes and counts agree row for row, and how does the bus
bandwidth compare?

    python bench/nccl_tests_compare.py --nccl-tests DIR/build [--rounds 2] [--out DIR] \\
        [-- -b 8 -e 1G -f 4]

DIR/build holds all_reduce_perf and its siblings (nccl-tests built with MPI=0).
nccl-tests runs one process driving every GPU (-g N), pyinit one process per
GPU under torchrun; both time back-to-back calls on the same sizes. Rows are
compared on the in-place column, the one torch has for every collective
but all-to-all (out-of-place there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyinit.bench.collectives import COLLECTIVES, MULTICAST_OFF
from pyinit.jsonfile import write_json
from pyinit.plotting import bytes_axis, pyplot, save_figure


def _cell(fields: list[str], at: int) -> dict | None:
    """One (time, algbw, busbw, #wrong) group starting at `at`; None for N/A."""
    try:
        return {"time": float(fields[at]), "bus_bw": float(fields[at + 2])}
    except ValueError:
        return None


def parse_table(text: str) -> list[dict]:
    """nccl-tests' data rows: size, count, then the two (time, algbw, busbw, #wrong) groups."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 13 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        rows.append({"size": int(fields[0]), "count": int(fields[1]),
                     "out_of_place": _cell(fields, 5), "in_place": _cell(fields, 9)})  # fmt: skip
    return rows


def run(command: list[str]) -> list[dict]:
    env = dict(os.environ, **MULTICAST_OFF)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return parse_table(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl-tests", required=True, metavar="DIR", help="the *_perf binaries")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--only", action="append", help="collectives (default: all five)")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for nccl_tests_compare.json and .png")  # fmt: skip
    parser.add_argument("flags", nargs="*", default=["-b", "8", "-e", "1G", "-f", "4"])
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for command in args.only or list(COLLECTIVES):
            collective = COLLECTIVES[command]
            theirs = [str(Path(args.nccl_tests) / f"{collective.name}_perf"), *args.flags,
                      "-g", str(args.gpus), "-n", "20", "-w", "5"]  # fmt: skip
            ours = [sys.executable, "-m", "pyinit.cli", "bench", command, *args.flags,
                    "-g", str(args.gpus), "-n", "20", "-w", "5", "--out", scratch]  # fmt: skip
            tables: dict[str, list[list[dict]]] = {"nccl-tests": [], "pyinit": []}
            for round_no in range(args.rounds):
                pair = [("nccl-tests", theirs), ("pyinit", ours)]
                for name, line in pair if round_no % 2 == 0 else pair[::-1]:
                    tables[name].append(run(line))
            results[command] = compare(collective.name, tables)
            report(command, results[command])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "nccl_tests_compare.json", {"date": time.strftime("%Y-%m-%d"),
               "gpus": args.gpus, "flags": args.flags, "results": results})  # fmt: skip
    plot(results, out / "nccl_tests_compare.png")
    mismatched = [c for c, r in results.items() if not r["sizes_match"]]
    return 1 if mismatched else 0


def compare(name: str, tables: dict[str, list[list[dict]]]) -> dict:
    """Per size: both tools' median busbw (in-place, or out-of-place for all-to-all)."""
    mode = "out_of_place" if name == "alltoall" else "in_place"
    columns = {tool: [(r["size"], r["count"]) for r in runs[0]] for tool, runs in tables.items()}
    rows = []
    for at, (size, count) in enumerate(columns["nccl-tests"]):
        row = {"size": size, "count": count}
        for tool, runs in tables.items():
            cells = [r[at][mode] for r in runs if at < len(r) and r[at][mode]]
            row[tool] = statistics.median(c["bus_bw"] for c in cells) if cells else None
        rows.append(row)
    return {"sizes_match": columns["nccl-tests"] == columns["pyinit"], "mode": mode,
            "rows": rows, "pyinit_sizes": columns["pyinit"]}  # fmt: skip


def report(command: str, result: dict) -> None:
    print(f"{command}: sizes and counts {'agree' if result['sizes_match'] else 'DIFFER'} "
          f"row for row; busbw {result['mode'].replace('_', '-')}, GB/s")  # fmt: skip
    print(f"{'size':>12} {'count':>12} {'nccl-tests':>11} {'pyinit':>9} {'ratio':>7}")
    for row in result["rows"]:
        theirs, ours = row["nccl-tests"], row["pyinit"]
        ratio = f"{ours / theirs:7.3f}" if theirs and ours else f"{'':>7}"
        print(f"{row['size']:>12} {row['count']:>12} {theirs or 0:11.2f} {ours or 0:9.2f} {ratio}")


def plot(results: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), squeeze=False)
    for ax, (command, result) in zip(axes[0], results.items(), strict=True):
        for tool in ("nccl-tests", "pyinit"):
            points = [(r["size"], r[tool]) for r in result["rows"] if r[tool] and r["size"]]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=tool)
        bytes_axis(ax)
        ax.set_title(COLLECTIVES[command].title)
        ax.set_ylabel("bus bandwidth, GB/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("pyinit bench beside nccl-tests, the same flags")
    return save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
