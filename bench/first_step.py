"""Launch to the first training step, as a user would time it: `pyinit run`
(workers forked with torch loaded, the default), `pyinit run --worker-start
spawn` and plain `torchrun --standalone`, each running examples/train_tiny.py
on every GPU (two gloo workers without GPUs), interleaved round by round.

    python bench/first_step.py --data SHARDS [--rounds 4] [--steps 20] [--out DIR]

The headline figure is the wall time from starting the launcher to the
example's first `step` line on stdout. Beside it, from the workers' marks in
the run's event log (pyinit.run.wrapper; plain torchrun runs it with
PYINIT_RUN_DIR set, which adds the marks and nothing else), when after the
launch the last rank finished: its start, import torch, CUDA's start, the
process group, the first step. Target (issue "Power-on to first gradient"):
`pyinit run` at most 0.7x plain torchrun on a 2xH200 node.
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
from collections.abc import Callable
from pathlib import Path

from pyinit.bench.collectives import MULTICAST_OFF
from pyinit.jsonfile import write_json
from pyinit.plotting import pyplot, save_figure
from pyinit.run.events import boottime

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_tiny.py"
TARGET_RATIO = 0.7
MARKS = ("worker start", "import torch", "device init", "process group", "first step")


def variants(nproc: int, script_args: list[str]) -> dict[str, Callable[[Path], list[str]]]:
    """Each launcher's command line for a run folder."""
    # The pyinit beside this interpreter: a user's PATH may not hold the venv.
    pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc)]  # fmt: skip

    def pyinit_run(start: str) -> Callable[[Path], list[str]]:
        head = [pyinit, "run", "--nproc-per-node", str(nproc), "--worker-start", start]
        return lambda folder: [*head, "--run-dir", str(folder), "--", str(EXAMPLE), *script_args]

    def plain(folder: Path) -> list[str]:
        (folder / "status").mkdir(parents=True, exist_ok=True)
        return [*torchrun, "-m", "pyinit.run.wrapper", str(folder / "status"), "script",
                str(EXAMPLE), *script_args]  # fmt: skip

    return {"pyinit run": pyinit_run("fork"), "pyinit run (spawn)": pyinit_run("spawn"),
            "torchrun": plain}  # fmt: skip


def one_run(command: list[str], folder: Path) -> dict[str, float]:
    """Seconds from launch to the first step line, and to each worker mark."""
    folder.mkdir(parents=True, exist_ok=True)
    # The installed package, never a checkout: no PYTHONPATH, and (as -P) no working
    # directory on sys.path in the interpreters plain torchrun starts.
    env = dict(os.environ, PYINIT_RUN_DIR=str(folder), PYTHONSAFEPATH="1", **MULTICAST_OFF)
    env.pop("PYTHONPATH", None)
    launched, launched_boot = time.perf_counter(), boottime()
    first_line = float("nan")
    with (
        (folder / "stderr.txt").open("w") as errors,
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=errors, text=True
        ) as proc,
    ):
        for line in proc.stdout:
            if line.startswith("step ") and first_line != first_line:
                first_line = time.perf_counter() - launched
        code = proc.wait()
    if code != 0:
        tail = (folder / "stderr.txt").read_text()[-6000:]
        raise RuntimeError(f"{' '.join(command[:3])}... exited with {code}:\n{tail}")
    figures = {"first step line": first_line}
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    for mark in MARKS:
        ends = [e["end"] for e in events if e["event"] == "phase" and e["name"] == mark
                and "rank" in e]  # fmt: skip
        figures[mark] = max(ends) - launched_boot if ends else float("nan")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="shards from pyinit shard")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--machine", default=os.uname().nodename)
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for first_step.json and first_step.png")  # fmt: skip
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    nproc = gpus or 2
    script_args = [
        "--data",
        str(Path(args.data).resolve()),
        "--steps",
        str(args.steps),
        "--log-every",
        "10",
    ]
    if not gpus:
        script_args += ["--width", "32", "--layers", "1", "--seq-len", "32"]
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        chosen = variants(nproc, script_args)
        names = list(chosen)
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                folder = Path(scratch) / f"{name.replace(' ', '_')}-{round_no}"
                figures = one_run(chosen[name](folder), folder)
                runs.setdefault(name, []).append(figures)
                print(f"round {round_no} {name}: first step line at "
                      f"{figures['first step line']:.2f} s", file=sys.stderr)  # fmt: skip
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
              for name, rs in runs.items()}  # fmt: skip
    columns = ("first step line", *MARKS)
    print(f"{nproc} workers ({'GPUs, NCCL' if gpus else 'CPU, gloo'}), median of {args.rounds} "
          "interleaved rounds, seconds after launch (marks: the last rank's)")  # fmt: skip
    print(f"{'launcher':20} " + " ".join(f"{c:>15}" for c in columns))
    for name, figures in median.items():
        print(f"{name:20} " + " ".join(f"{figures[c]:15.2f}" for c in columns))
    ratio = median["pyinit run"]["first step line"] / median["torchrun"]["first step line"]
    print(f"pyinit run / torchrun, launch to first step line: {ratio:.3f} "
          f"(target at most {TARGET_RATIO})")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"date": time.strftime("%Y-%m-%d"), "machine": args.machine, "gpus": gpus,
                "workers": nproc, "rounds": args.rounds, "steps": args.steps, "runs": runs,
                "median": median, "ratio": ratio, "target": TARGET_RATIO}  # fmt: skip
    write_json(out / "first_step.json", document)
    plot(document, out / "first_step.png")
    return 0


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = list(document["median"])
    for y, name in enumerate(names):
        figures = document["median"][name]
        left = 0.0
        for mark in MARKS:
            end = figures[mark]
            if end == end and end > left:
                ax.barh(y, end - left, left=left, label=mark if y == 0 else None)
                left = end
        ax.plot([figures["first step line"]] * 2, [y - 0.4, y + 0.4], color="black")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after launch (black: the first step line on stdout)")
    ax.set_title(f"Launch to first training step, {document['workers']} workers, "
                 f"{document['machine']} ({document['date']})")  # fmt: skip
    ax.legend(fontsize="small", loc="lower right")
    return save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
