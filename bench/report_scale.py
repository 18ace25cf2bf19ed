"""pyinit report on a day-long run, and what the step records cost a step.

Writes the logs of a 24-hour, 8-GPU run (one step a second per rank, one
monitor sample a second with 8 GPUs and two disks, a restart and a stall),
then times `pyinit report` on them in a fresh process, several times, with
its peak resident memory. Then times, in this process, what every step pays
for the records: one `phase("data")` and one `StepLog.step()`, against the
example's median step time in the recorded run (tests/data/run-report).

    python bench/report_scale.py --out DIR
    python bench/report_scale.py --hours 1 --ranks 2      # smaller, quicker
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pyinit import phases  # noqa: E402
from pyinit.analysis import report  # noqa: E402
from pyinit.jsonfile import write_json  # noqa: E402
from pyinit.runlog import steps  # noqa: E402

TARGET_S, TARGET_MIB, TARGET_SHARE = 5.0, 500.0, 0.005


def generate(folder: Path, hours: float, ranks: int) -> int:
    """The run's logs; returns the bytes written."""
    start, seconds = 1000.0, int(hours * 3600)
    end = start + seconds
    stall_at, restart_at = start + seconds * 0.6, start + seconds * 0.6 + 120
    events = [{"time": 1.7e9 + start, "boottime": start, "event": "start"},
              {"boottime": start + 1, "event": "phase", "name": "supervisor start",
               "start": start, "end": start + 1},
              {"boottime": stall_at + 60, "event": "stall", "rank": 3},
              {"boottime": restart_at, "event": "restart", "attempt": 1},
              {"boottime": end, "event": "end", "status": 0}]  # fmt: skip
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "w") as f:
        for event in events:
            f.write(json.dumps({"time": 1.7e9 + event["boottime"], **event}) + "\n")
    (folder / "steps").mkdir()
    rng = np.random.default_rng(0)
    ends = start + 60 + np.arange(seconds - 61, dtype=np.float64)
    attempt = np.where(ends > restart_at, 1, 0)
    keep = (ends < stall_at) | (ends > restart_at + 30)
    ends, attempt = ends[keep], attempt[keep]
    for rank in range(ranks):
        records = np.zeros(len(ends), dtype=report.STEP_DTYPE)
        records["attempt"] = attempt
        records["step"] = np.arange(1, len(ends) + 1)
        records["end"] = ends + rng.uniform(0, 0.01, len(ends))
        records["data"] = rng.exponential(0.05, len(ends))
        records["checkpoint"] = np.where(np.arange(len(ends)) % 1800 == 0, 8.0 / 60, 0.0)
        records.tofile(folder / "steps" / f"rank-{rank}.bin")
    gpu = {"uuid": "GPU-x", "pci_bus_id": "0000:00:00.0", "memory_used_bytes": 7.0e10,
           "temperature_celsius": 60.0, "xid": []}  # fmt: skip
    with open(folder / "monitor.jsonl", "w") as f:
        for t in range(seconds):
            sample = {
                "time": 1.7e9 + start + t, "boottime": start + t,
                "gpus": [{**gpu, "gpu": g, "utilization_percent": 85.0 + (t + g) % 10,
                          "pcie_tx_bytes_per_s": 1.0e9, "pcie_rx_bytes_per_s": 2.0e9,
                          "nvlink_tx_bytes_per_s": 1.0e11, "nvlink_rx_bytes_per_s": 1.0e11}
                         for g in range(ranks)],
                "block": [{"device": d, "read_iops": 5000.0, "read_bytes_per_s": 2.0e9,
                           "read_latency_us": 90.0 + t % 50} for d in ("nvme0n1", "nvme1n1")],
                "gpu_unavailable": None, "alerts_firing": [],
            }  # fmt: skip
            f.write(json.dumps(sample) + "\n")
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def time_report(folder: Path, rounds: int) -> tuple[list[float], float]:
    """Wall seconds of `pyinit report` per round, and the largest peak RSS (MiB)."""
    seconds = []
    command = [sys.executable, "-m", "pyinit.cli", "report", str(folder), "--out",
               str(folder / "report.html")]  # fmt: skip
    for _ in range(rounds):
        began = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - began)
    # The largest peak of any child so far: these runs are this process's only children.
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def step_cost(count: int = 100_000) -> float:
    """Seconds each step pays: one data phase and one record."""
    with tempfile.TemporaryDirectory() as folder:
        log = steps.StepLog(Path(folder) / "rank-0.bin", attempt=0)
        phases.install(log)
        try:
            began = time.perf_counter()
            for i in range(count):
                with phases.phase("data"):
                    pass
                log.step(float(i))
            return (time.perf_counter() - began) / count
        finally:
            phases.install(None)
            log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for report_scale.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        folder = Path(tmp) / "run"
        began = time.perf_counter()
        written = generate(folder, args.hours, args.ranks)
        print(f"{args.hours:g} h x {args.ranks} GPUs: {written / 2**20:,.0f} MiB of logs "
              f"written in {time.perf_counter() - began:.1f} s", file=sys.stderr)  # fmt: skip
        seconds, peak = time_report(folder, args.rounds)
        summary = json.loads(subprocess.run(
            [sys.executable, "-m", "pyinit.cli", "report", str(folder), "--json"],
            check=True, capture_output=True, text=True).stdout)  # fmt: skip
    per_step = statistics.median(step_cost() for _ in range(5))
    recorded = report.build([ROOT / "tests/data/run-report"], None).summary()
    step_s = recorded["step_time_s"]["p50"]
    rows = [
        ("pyinit report, median wall", f"{statistics.median(seconds):.2f} s", f"< {TARGET_S:g} s"),
        ("pyinit report, peak RSS", f"{peak:.0f} MiB", f"< {TARGET_MIB:g} MiB"),
        ("records per step", f"{per_step * 1e6:.2f} µs", ""),
        ("of the example's step", f"{per_step / step_s:.4%} of {step_s * 1e3:.0f} ms",
         f"< {TARGET_SHARE:.1%}"),
    ]  # fmt: skip
    for name, value, target in rows:
        print(f"{name:30} {value:>22} {target:>10}")
    print(f"effective training time of the generated run: "
          f"{summary['effective_training_time']:.1%}")  # fmt: skip
    write_json(Path(args.out) / "report_scale.json", {
        "date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
        "hours": args.hours, "ranks": args.ranks, "log_bytes": written,
        "report_seconds": seconds, "report_peak_rss_mib": peak,
        "record_seconds_per_step": per_step, "example_step_s": step_s,
        "targets": {"seconds": TARGET_S, "rss_mib": TARGET_MIB, "step_share": TARGET_SHARE},
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
