"""Launch to the first training step, and a restart to its first step, as
a user would time them, for an eager and a compiled (`--compile`) job:
`pyinit run --cold` (torchrun's agent started afresh, workers forked from it
with torch and the preloads loaded), `pyinit run` handed to a warm interpreter
(`pyinit warm start` first), the first `pyinit run` on a node with none (it
starts one for itself and leaves it) and the second right after it,
`pyinit run --worker-start spawn` (eager only) and plain `torchrun
--standalone`, each running examples/train_tiny.py on every GPU (two gloo
workers without GPUs, the same model at a shorter sequence), interleaved
round by round.

    python bench/first_step.py --data SHARDS [--rounds 3] [--steps 20] [--kill-at 20] [--out DIR]

The headline figure is the wall time from starting the launcher to the
example's first `step` line on stdout. Beside it, from the workers' marks in
the run's event log (pyinit.run.wrapper; plain torchrun runs it with
PYINIT_RUN_DIR set, which adds the marks and nothing else), when after the
launch the last rank finished: its start, import torch, CUDA's start, the
process group, the compile, the first step.

The restart: the last rank is KILLed once it has done --kill-at steps, with
--max-restarts 1; measured from the kill to the restarted group's first step
on every rank, for `pyinit run --cold` (the new workers fork from the agent,
as for a launch with no warm interpreter), `pyinit run` handed to the warm
interpreter (the restart most launches get) and plain torchrun (fresh
interpreters), each printed with its phases as
`pyinit timeline` names them (plain torchrun's agent marks none of its
own; its workers run the wrapper that writes the marks with
PYINIT_DDP_AOT_CACHE=off, so that they compile as under torchrun alone).
Compiled runs share inductor's default cache folder, as a user's runs
on one node do; one compiled run before the rounds, not counted, fills it,
so that every counted launch finds its graphs there (otherwise the first
compiled launch of round 0, whichever launcher it is, pays the whole
compile).

Where the environment has no bytecode of its own and Python may not write it
(PYTHONDONTWRITEBYTECODE=1), pyinit keeps a bytecode cache (pyinit.bytecode):
the warm interpreter started first fills it, and the rounds wait until it is
ready, as on a node that has launched before. Plain torchrun runs as a user
runs it, without it; beside the table, `import torch, torch._dynamo` is timed
in a fresh interpreter with and without the cache, which is what the cache
alone would give any launcher.

Targets: cold at most 0.6x torchrun, warm at most 0.25x (compiled: 0.2x),
either restart at most 0.3x torchrun's (compiled: 0.2x), the second launch of
the day within 1.2x of an explicitly warm one, the handoff to a warm
interpreter at most 20 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pyinit import bytecode
from pyinit.analysis.timeline import RESUME_PHASES, resumes
from pyinit.bench.collectives import MULTICAST_OFF
from pyinit.jsonfile import write_json
from pyinit.plotting import pyplot, save_figure
from pyinit.runlog.events import boottime
from pyinit.runlog.progress import read_progress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_tiny.py"
TARGETS = {"cold": 0.6, "warm": 0.25, "second": 1.2, "restart": 0.3, "warm restart": 0.3,
           "compiled cold": 0.6, "compiled warm": 0.2, "compiled second": 1.2,
           "compiled restart": 0.2, "compiled warm restart": 0.2, "handoff_ms": 20.0}  # fmt: skip
MARKS = ("worker start", "import torch", "device init", "process group", "compile: inductor",
         "first step")  # fmt: skip
COLD, WARM, SPAWN, TORCHRUN = "pyinit run --cold", "pyinit run (warm)", "pyinit run (spawn)", (
    "torchrun")  # fmt: skip
FIRST, SECOND = "pyinit run, first of the day", "pyinit run, second of the day"


def variants(nproc: int, script_args: list[str]) -> dict[str, Callable[[Path, int], list[str]]]:
    """Each launcher's command line for a run folder and a restart count."""
    # The pyinit beside this interpreter: a user's PATH may not hold the venv.
    pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"

    def pyinit_run(*options: str) -> Callable[[Path, int], list[str]]:
        head = [pyinit, "run", "--nproc-per-node", str(nproc), *options]
        return lambda folder, restarts: [*head, "--max-restarts", str(restarts), "--run-dir",
                                         str(folder), "--", str(EXAMPLE), *script_args]  # fmt: skip

    def plain(folder: Path, restarts: int) -> list[str]:
        (folder / "status").mkdir(parents=True, exist_ok=True)
        # --log-dir as pyinit run passes it: torchrun's default is a new /tmp folder each time
        # torch's own rule for a compiled job's DDP pieces, as under torchrun
        # alone: the wrapper writing its marks would cache them (pyinit.run.ddp_pieces).
        return ["env", "PYINIT_DDP_AOT_CACHE=off", sys.executable, "-m", "torch.distributed.run",
                "--standalone", "--nproc-per-node",
                str(nproc), "--max-restarts", str(restarts), "--log-dir", str(folder / "torchrun"),
                "-m", "pyinit.run.wrapper",
                str(folder / "status"), "script", str(EXAMPLE), *script_args]  # fmt: skip

    return {COLD: pyinit_run("--cold"), WARM: pyinit_run(), SPAWN: pyinit_run(
        "--cold", "--worker-start", "spawn"), TORCHRUN: plain, FIRST: pyinit_run(),
        SECOND: pyinit_run()}  # fmt: skip


def run_env(folder: Path, warm_dir: Path) -> dict[str, str]:
    # The installed package, never a checkout: no PYTHONPATH, and (as -P) no working
    # directory on sys.path in the interpreters plain torchrun starts.
    env = dict(os.environ, PYINIT_RUN_DIR=str(folder), PYTHONSAFEPATH="1",
               PYINIT_WARM_DIR=str(warm_dir), **MULTICAST_OFF)  # fmt: skip
    env.pop("PYTHONPATH", None)
    return env


def events_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def one_run(command: list[str], folder: Path, warm_dir: Path) -> dict[str, float]:
    """Seconds from launch to the first step line, and to each worker mark."""
    folder.mkdir(parents=True, exist_ok=True)
    launched, launched_boot = time.perf_counter(), boottime()
    first_line = float("nan")
    with (
        (folder / "stderr.txt").open("w") as errors,
        subprocess.Popen(command, env=run_env(folder, warm_dir), stdout=subprocess.PIPE,
                         stderr=errors, text=True) as proc,
    ):  # fmt: skip
        for line in proc.stdout:
            if line.startswith("step ") and first_line != first_line:
                first_line = time.perf_counter() - launched
        code = proc.wait()
    if code != 0:
        tail = (folder / "stderr.txt").read_text()[-6000:]
        raise RuntimeError(f"{' '.join(command[:3])}... exited with {code}:\n{tail}")
    figures = {"first step line": first_line}
    events = events_of(folder)
    for mark in MARKS:
        ends = [e["end"] for e in events if e["event"] == "phase" and e["name"] == mark
                and "rank" in e and e.get("attempt", 0) == 0]  # fmt: skip
        figures[mark] = max(ends) - launched_boot if ends else float("nan")
    handoff = warm_handoff(command, events)
    if handoff is not None:
        figures["handoff ms"] = handoff * 1e3
    return figures


def warm_handoff(command: list[str], events: list[dict]) -> float | None:
    """Seconds the launch took to hand itself to a warm interpreter; None
    for one that was not to (`--cold`, plain torchrun), RuntimeError for one
    that started cold instead."""
    warm = [e for e in events if e["event"] == "warm"]
    if warm and warm[0].get("used"):
        return warm[0]["handoff_s"]
    if "--cold" not in command and "torch.distributed.run" not in command:
        raise RuntimeError(f"the warm run started cold: {warm[0].get('reason') if warm else ''}")
    return None


def restart_run(command: list[str], folder: Path, warm_dir: Path, kill_at: int,
                victim: int) -> tuple[float, dict[str, float]]:  # fmt: skip
    """Seconds from KILLing rank `victim` at step `kill_at` to the restarted
    group's first step on every rank, and the restart's phases as `pyinit
    timeline` names them (the slowest rank's seconds in each)."""
    folder.mkdir(parents=True, exist_ok=True)
    status = folder / "status"
    with (folder / "stderr.txt").open("w") as errors, subprocess.Popen(
            command, env=run_env(folder, warm_dir), stdout=subprocess.DEVNULL,
            stderr=errors) as proc:  # fmt: skip
        killed = 0.0
        while proc.poll() is None and not killed:
            for progress in read_progress(status):
                if progress.rank == victim and progress.steps >= kill_at:
                    killed = boottime()
                    os.kill(progress.pid, signal.SIGKILL)
            time.sleep(0.005)
        code = proc.wait()
    if code != 0 or not killed:
        tail = (folder / "stderr.txt").read_text()[-6000:]
        raise RuntimeError(f"restart run exited with {code} (killed: {bool(killed)}):\n{tail}")
    events = events_of(folder)
    warm_handoff(command, events)
    firsts = [e["end"] for e in events if e["event"] == "phase"
              and e["name"] == "first step" and e.get("attempt") == 1]  # fmt: skip
    labels = dict(RESUME_PHASES)
    found = resumes(events)
    phases = {labels[name]: s for name, s in (found[0].phases if found else {}).items()}
    return max(firsts) - killed, phases


def warm_start(warm_dir: Path) -> float:
    """Seconds from `pyinit warm start` to ready."""
    pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"
    env = run_env(warm_dir, warm_dir)
    began = time.perf_counter()
    subprocess.run([pyinit, "warm", "start", "--idle-timeout", "3600"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return time.perf_counter() - began


def warm_stop(warm_dir: Path) -> None:
    """Ends the warm interpreter of `warm_dir`, waiting until its socket is gone."""
    pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"
    subprocess.run([pyinit, "warm", "stop"], env=run_env(warm_dir, warm_dir),
                   capture_output=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while (warm_dir / "warm.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def bytecode_cache(timeout: float) -> Path | None:
    """The bytecode cache, once the warm interpreter's filler has made it
    ready; None where it is off or this environment has bytecode of its own."""
    import importlib.util

    cache = bytecode.folder()
    torch = importlib.util.find_spec("torch")
    if cache is None or torch is None or os.path.exists(bytecode.beside(str(torch.origin))):
        return None
    deadline = time.monotonic() + timeout
    while not bytecode.ready_mark(cache).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bytecode cache {cache} was not ready in {timeout:g} s")
        time.sleep(0.2)
    return cache


def import_times(cache: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds of `import torch, torch._dynamo` in a fresh interpreter, with
    and without the bytecode cache, interleaved."""
    times: dict[str, list[float]] = {"with the cache": [], "without": []}
    env = {k: v for k, v in os.environ.items() if k != bytecode.PREFIX_ENV}
    for _ in range(rounds):
        for name, extra in (("with the cache", {bytecode.PREFIX_ENV: str(cache)}),
                            ("without", {})):  # fmt: skip
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch, torch._dynamo"],
                           env=dict(env, **extra), check=True)  # fmt: skip
            times[name].append(time.perf_counter() - began)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="shards from pyinit shard")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=20, help="the restart's step (0: none)")
    parser.add_argument("--machine", default=os.uname().nodename)
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for first_step.json and first_step.png")  # fmt: skip
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    nproc = gpus or 2

    def script_args(steps: int) -> list[str]:
        words = ["--data", str(Path(args.data).resolve()), "--steps", str(steps),
                 "--log-every", "10"]  # fmt: skip
        # Without GPUs, the same model at a shorter sequence: still past one of
        # DDP's buckets, so the compiled job is split in pieces as on a GPU.
        return words + ([] if gpus else ["--seq-len", "32"])

    runs: dict[str, list[dict[str, float]]] = {}
    restarts: dict[str, list[float]] = {}
    restart_phases: dict[str, list[dict[str, float]]] = {}
    jobs = {"": [], "compiled ": ["--compile"]}
    with tempfile.TemporaryDirectory() as scratch:
        warm_dir = Path(scratch, "warm")
        warm_dir.mkdir(mode=0o700)
        ready_s = warm_start(warm_dir)
        cache = bytecode_cache(timeout=300)
        imports = import_times(cache, args.rounds) if cache else {}
        try:
            compiled = variants(nproc, script_args(args.steps) + jobs["compiled "])
            fill = Path(scratch, "fill-compile-caches")
            took = one_run(compiled[COLD](fill, 0), fill, warm_dir)["first step line"]
            print(f"compile caches filled by one uncounted run: first step line at {took:.2f} s",
                  file=sys.stderr)  # fmt: skip
            for round_no in range(args.rounds):
                for job, extra in jobs.items():
                    chosen = variants(nproc, script_args(args.steps) + extra)
                    again = variants(nproc, script_args(2 * args.kill_at + 10) + extra)
                    names = [n for n in chosen if n != SECOND and not (job and n == SPAWN)]
                    order = names[round_no % len(names) :] + names[: round_no % len(names)]
                    for name in order:
                        launches = [FIRST, SECOND] if name == FIRST else [name]
                        day = Path(scratch, f"day-{job.strip()}-{round_no}")  # a node with none
                        if name == FIRST:
                            day.mkdir(mode=0o700)
                        for launch in launches:
                            key = f"{job}{launch}"
                            folder = Path(scratch) / f"{key.replace(' ', '_')}-{round_no}"
                            figures = one_run(chosen[launch](folder, 0), folder,
                                              day if name == FIRST else warm_dir)  # fmt: skip
                            runs.setdefault(key, []).append(figures)
                            took = figures["first step line"]
                            print(f"round {round_no} {key}: first step line at {took:.2f} s",
                                  file=sys.stderr)  # fmt: skip
                        if name == FIRST:
                            warm_stop(day)
                    for name in (COLD, WARM, TORCHRUN) if args.kill_at else ():
                        key = f"{job}{name}"
                        folder = Path(scratch) / f"restart-{key.replace(' ', '_')}-{round_no}"
                        took, phases = restart_run(again[name](folder, 1), folder, warm_dir,
                                                   args.kill_at, nproc - 1)  # fmt: skip
                        restarts.setdefault(key, []).append(took)
                        restart_phases.setdefault(key, []).append(phases)
                        steps = ", ".join(f"{n} {s:.2f}" for n, s in phases.items())
                        print(f"round {round_no} {key}: restart in {took:.2f} s ({steps})",
                              file=sys.stderr)  # fmt: skip
        finally:
            warm_stop(warm_dir)
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
              for name, rs in runs.items()}  # fmt: skip
    columns = ("first step line", *MARKS)
    print(f"{nproc} workers ({'GPUs, NCCL' if gpus else 'CPU, gloo'}), median of {args.rounds} "
          "interleaved rounds, seconds after launch (marks: the last rank's)")  # fmt: skip
    print(f"{'launcher':40} " + " ".join(f"{c[:15]:>15}" for c in columns))
    for name, figures in median.items():
        print(f"{name:40} " + " ".join(f"{figures[c]:15.2f}" for c in columns))
    ratios: dict[str, float] = {"handoff_ms": median[WARM]["handoff ms"]}
    restart_median = {name: statistics.median(values) for name, values in restarts.items()}
    for job in jobs:
        line = {name: median[f"{job}{name}"]["first step line"] for name in
                (TORCHRUN, COLD, WARM, SECOND)}  # fmt: skip
        ratios[f"{job}cold"] = line[COLD] / line[TORCHRUN]
        ratios[f"{job}warm"] = line[WARM] / line[TORCHRUN]
        ratios[f"{job}second"] = line[SECOND] / line[WARM]
        if restart_median:
            again = restart_median[f"{job}{TORCHRUN}"]
            ratios[f"{job}restart"] = restart_median[f"{job}{COLD}"] / again
            ratios[f"{job}warm restart"] = restart_median[f"{job}{WARM}"] / again
    if restart_median:
        print(f"restart, kill of rank {nproc - 1} at step {args.kill_at} to the first step after "
              "it: " + ", ".join(f"{n} {s:.2f} s" for n, s in restart_median.items()))  # fmt: skip
    for key, value in ratios.items():
        what = ("ms" if key == "handoff_ms" else "x explicitly warm" if "second" in key
                else "x torchrun")  # fmt: skip
        met = "met" if value <= TARGETS[key] else "MISSED"
        print(f"{key:21} {value:8.3f} {what:18} (target at most {TARGETS[key]}: {met})")
    print(f"pyinit warm start to ready: {ready_s:.2f} s")
    if imports:
        print(
            f"bytecode cache {cache}: import torch, torch._dynamo "
            + ", ".join(
                f"{name} {statistics.median(values):.2f} s" for name, values in imports.items()
            )
        )
    else:
        print("bytecode cache: not used (off, or the environment has its own bytecode)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"date": time.strftime("%Y-%m-%d"), "machine": args.machine, "gpus": gpus,
                "workers": nproc, "rounds": args.rounds, "steps": args.steps, "runs": runs,
                "median": median, "restarts": restarts, "restart_median": restart_median,
                "restart_phases": restart_phases,
                "ratios": ratios, "targets": TARGETS, "warm_start_s": ready_s,
                "bytecode_cache": str(cache) if cache else None, "import_s": imports}  # fmt: skip
    write_json(out / "first_step.json", document)
    plot(document, out / "first_step.png")
    return 0


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 5))
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
