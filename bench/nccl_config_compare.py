"""All-reduce bus bandwidth with NCCL's own configuration against pod-init's,
side by side in one run on one machine.

Configurations, interleaved round by round so drift hits all of them alike:
  nccl-default     nothing set but the multicast switches every run keeps
  pod-init         the env file of `pyinit nccl` (topology file, socket interface)
  pod-init-forced  the same with --force-rings (NCCL takes the ring graph unchecked)

Each run is `torchrun -m pyinit.bench.collectives all_reduce` with NCCL_DEBUG=INFO; the log
shows whether NCCL loaded the topology file and the graph. Prints a table,
writes JSON (and a PNG when matplotlib is there) into --out-dir.

    python bench/nccl_config_compare.py --out DIR
    python bench/nccl_config_compare.py --rebuild DIR/nccl_config_compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyinit.jsonfile import write_json
from pyinit.plotting import human_bytes, pyplot, save_figure

# Kept in every run on the GPU machines measured (NVLink multicast is off there).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TOPO_LOADED = "NCCL_TOPO_FILE set by environment to"
GRAPH_LOADED = "channels loaded from XML graph"


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env


def run_pyinit_nccl(out: Path, force: bool) -> str:
    command = [str(Path(sys.executable).parent / "pyinit"), "nccl", "--out", str(out)]
    if force:
        command.append("--force-rings")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    done = subprocess.run(command, env=clean, capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def run_allreduce(gpus: int, sizes: str, extra_env: dict[str, str], work: Path, tag: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(MULTICAST_OFF)
    env.update(extra_env)
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH"})
    result = work / f"{tag}.json"
    log = work / f"{tag}.log"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--log-dir",  # torchrun's default is a new /tmp folder each time
        str(work / f"{tag}-torchrun"),
        f"--nproc-per-node={gpus}",
        "-m",
        "pyinit.bench.collectives",
        "all_reduce",
        "--sizes",
        sizes,
        "--out",
        str(result),
    ]
    with log.open("w") as f:
        subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT, check=True, cwd=work)


def load_run(work: Path, tag: str) -> dict:
    """One run's rows, and what its NCCL log says was loaded."""
    text = (work / f"{tag}.log").read_text()
    document = json.loads((work / f"{tag}.json").read_text())
    document["topo_file_loaded"] = TOPO_LOADED in text
    document["graph_loaded"] = GRAPH_LOADED in text
    # "Channel 00/24 : 0 1" lists a ring; "Channel 00/0 : 0[0] -> 1[1] via ..." a connection.
    document["channels"] = sorted(
        {
            int(line.split(" Channel 00/")[1].split(" ")[0])
            for line in text.splitlines()
            if " Channel 00/" in line and " via " not in line
        }
    )
    return document


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[int, dict[str, float]]]:
    table: dict[str, dict[int, dict[str, float]]] = {}
    for name, documents in runs.items():
        by_size: dict[int, list[dict]] = {}
        for document in documents:
            for row in document["results"]:
                by_size.setdefault(row["size"], []).append(row["in_place"])
        table[name] = {
            size: {
                "busbw_median": statistics.median(r["bus_bw"] for r in rows),
                "busbw_min": min(r["bus_bw"] for r in rows),
                "busbw_max": max(r["bus_bw"] for r in rows),
                "time_us_median": statistics.median(r["time"] for r in rows),
                "wrong": sum(r["nwrong"] for r in rows),
            }
            for size, rows in sorted(by_size.items())
        }
    return table


def print_table(table: dict[str, dict[int, dict[str, float]]]) -> None:
    names = list(table)
    baseline = names[0]
    header = " ".join(f"{n + ' busbw':>22}" for n in names)
    print(f"{'size':>12} {header}  ratios to {baseline}")
    for size in table[baseline]:
        cells = " ".join(f"{table[n][size]['busbw_median']:>16.1f} GB/s" for n in names)
        ratios = " ".join(
            f"{table[n][size]['busbw_median'] / table[baseline][size]['busbw_median']:.3f}"
            for n in names[1:]
        )
        wrong = sum(table[n][size]["wrong"] for n in names)
        print(f"{size:>12} {cells}  {ratios}  #wrong {wrong}")


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    table = document["table"]
    names = list(table)
    sizes = list(table[names[0]])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [table[name][s]["busbw_median"] for s in sizes]
        ax.bar([x + i * width for x in range(len(sizes))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(sizes))])
    ax.set_xticklabels([human_bytes(int(s)) for s in sizes])
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("all-reduce bus bandwidth, GB/s (median of rounds)")
    ax.set_title(f"{document['machine']}: NCCL default vs pod-init ({document['date']})")
    ax.legend(loc="lower right")
    return save_figure(fig, path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="default: every GPU")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="64M,256M,1G,2G,4G")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for nccl_config_compare.json and its runs")  # fmt: skip
    parser.add_argument("--machine", default=platform.node())
    parser.add_argument(
        "--rebuild", metavar="JSON", help="recompute table, JSON and plot from a saved run folder"
    )
    args = parser.parse_args()
    if args.rebuild:
        path = Path(args.rebuild)
        return finish(json.loads(path.read_text()), path)

    import torch

    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2:
        print("needs at least 2 GPUs", file=sys.stderr)
        return 2
    out_dir = Path(args.out).resolve()
    work = out_dir / "runs"
    work.mkdir(parents=True, exist_ok=True)
    summaries = {
        "pod-init": run_pyinit_nccl(work / "pod-init", force=False),
        "pod-init-forced": run_pyinit_nccl(work / "pod-init-forced", force=True),
    }
    configs = {
        "nccl-default": {},
        "pod-init": read_env_file(work / "pod-init" / "nccl.env"),
        "pod-init-forced": read_env_file(work / "pod-init-forced" / "nccl.env"),
    }
    names = list(configs)
    for round_no in range(args.rounds):
        order = names[round_no % len(names) :] + names[: round_no % len(names)]
        for name in order:
            tag = f"{name}-{round_no}"
            run_allreduce(gpus, args.sizes, configs[name], work, tag)
            print(f"round {round_no} {name} done", file=sys.stderr)
    document = {
        "machine": args.machine,
        "date": time.strftime("%Y-%m-%d"),
        "gpus": gpus,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "env": configs,
        "pyinit_nccl": summaries,
    }
    return finish(document, out_dir / "nccl_config_compare.json")


def finish(document: dict, path: Path) -> int:
    """Reads the runs beside ``path``, adds the table and what NCCL loaded,
    writes the JSON and the plot, prints the table."""
    work = path.parent / "runs"
    runs = {
        name: [load_run(work, f"{name}-{r}") for r in range(document["rounds"])]
        for name in document["env"]
    }
    document["loaded"] = {
        name: {
            "topo_file": [r["topo_file_loaded"] for r in documents],
            "graph": [r["graph_loaded"] for r in documents],
            "channels": sorted({c for r in documents for c in r["channels"]}),
        }
        for name, documents in runs.items()
    }
    document["table"] = summarize(runs)
    print_table(document["table"])
    write_json(path, document, indent=2)
    print("wrote", path, "plot:", plot(json.loads(path.read_text()), path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
