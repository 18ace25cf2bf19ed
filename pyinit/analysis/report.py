"""``pyinit report RUN_DIR``: where every GPU-second of a run went.

Reads a run folder (``pyinit run --run-dir``; one per node, give them all for
a multi-node run): the event log, each rank's step records
(``steps/rank-R.bin``) and the monitor's samples. Every rank's time from the
run's start (power-on when pod-init booted the node, else ``pyinit run``'s
start) to its end is split into: productive step time, start-up (until the
rank's first step ended), data wait and checkpoints inside steps, stalls and
restarts between attempts, and the tail after the last step. Effective
training time is productive time over wall time, summed over ranks.

Prints a short summary, writes one self-contained HTML file (inline CSS and
SVG, no scripts, nothing fetched) with the breakdown, the costs, charts and
findings, largest loss first; ``--json`` prints the numbers for machines
instead. A run that crashed or was killed is reported as far as its records
go, and the report says what is missing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pyinit.analysis import timeline
from pyinit.errors import InputError
from pyinit.jsonfile import open_input
from pyinit.runlog.steps import FOLDER, RECORD

STEP_DTYPE = np.dtype(
    [("attempt", "<i8"), ("step", "<i8"), ("end", "<f8"), ("data", "<f8"), ("checkpoint", "<f8")]
)
assert STEP_DTYPE.itemsize == RECORD.size
# (key, label, colour), productive first, then the losses in a fixed order.
CATEGORIES = (
    ("productive", "productive step time", "#2e9d5b"),
    ("startup", "start-up to the first step", "#8c8c8c"),
    ("data", "waiting for data", "#e0902f"),
    ("checkpoint", "checkpoints", "#7a5cc4"),
    ("restart", "restarts", "#d04f4f"),
    ("stall", "stalls", "#8b1e1e"),
    ("tail", "after the last step", "#5b8fc7"),
)
LOSSES = tuple(key for key, _, _ in CATEGORIES[1:])
COLOURS = {key: colour for key, _, colour in CATEGORIES}
LABELS = {key: label for key, label, _ in CATEGORIES}


@dataclass
class Node:
    """One node's folder: its events and its ranks' step records, on its clock."""

    folder: Path
    events: list[dict]
    steps: dict[int, np.ndarray]  # rank -> records, in the order written
    monitor: Monitor | None
    start: float  # CLOCK_BOOTTIME of the run's start
    origin: str  # "power-on" or "pyinit run start"
    end: float
    ended: bool  # an end event was written


@dataclass
class RankTime:
    node: int
    rank: int
    seconds: dict[str, float]
    steps: int
    # Per step after the first: (end, length, data wait), from the run's start.
    step_ends: np.ndarray
    step_lengths: np.ndarray
    step_data: np.ndarray
    # Intervals per category, from the run's start: for the timeline chart.
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def read_steps(folder: Path) -> dict[int, np.ndarray]:
    steps = {}
    for path in sorted((folder / FOLDER).glob("rank-*.bin")):
        try:
            rank = int(path.stem.removeprefix("rank-"))
        except ValueError:
            continue
        with open_input(path) as f:
            raw = f.read()
        whole = len(raw) - len(raw) % STEP_DTYPE.itemsize  # a record in progress is left out
        steps[rank] = np.frombuffer(raw[:whole], dtype=STEP_DTYPE)
    return steps


@dataclass
class Monitor:
    """A node's monitor samples as arrays: on CLOCK_BOOTTIME (wall clock for
    samples from before the monitor stamped it, mapped later), GPU utilization
    (the mean over GPUs), PCIe and NVLink bytes/s (summed over GPUs) and disk
    read latency (the slowest device)."""

    boottime: np.ndarray
    wall: np.ndarray
    gpu_util: np.ndarray
    pcie: np.ndarray
    nvlink: np.ndarray
    disk_latency_us: np.ndarray
    gpus: bool  # some sample had a GPU
    unavailable: str | None  # why NVML gave none, as the monitor said
    stride: int  # every stride-th sample was read

    def __len__(self) -> int:
        return len(self.wall)


# A day at one sample a second is 86,400 lines of a few KiB each: beyond this
# many, every n-th is read, still hundreds per chart bin.
MONITOR_SAMPLES = 20_000


def read_monitor(folder: Path) -> Monitor | None:
    path = folder / "monitor.jsonl"
    if not path.exists():
        return None
    with open_input(path) as f:  # counted first, then read a line at a time: 100s of MiB
        count = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    stride = max(1, count // MONITOR_SAMPLES)
    columns: dict[str, list[float]] = {k: [] for k in ("boottime", "wall", "gpu_util", "pcie",
                                                       "nvlink", "disk")}  # fmt: skip
    gpus, unavailable = False, None
    with open_input(path) as f:
        lines = [line for number, line in enumerate(f) if number % stride == 0]
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue  # a torn last line
        # A sample is another process's data: a field of the wrong type is a gap, not an error.
        if not isinstance(sample, dict) or np.isnan(_real(sample.get("time"))):
            continue
        gpu_cards, blocks = sample.get("gpus"), sample.get("block")
        cards = [g for g in gpu_cards if isinstance(g, dict) and "error" not in g] if isinstance(
            gpu_cards, list) else []  # fmt: skip
        gpus = gpus or bool(cards)
        if isinstance(sample.get("gpu_unavailable"), str):
            unavailable = sample["gpu_unavailable"]
        columns["wall"].append(_real(sample["time"]))
        columns["boottime"].append(_real(sample.get("boottime")))
        columns["gpu_util"].append(_mean(g.get("utilization_percent") for g in cards))
        columns["pcie"].append(_sum(cards, ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")))
        columns["nvlink"].append(_sum(cards, ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")))
        latencies = [_real(b.get("read_latency_us")) for b in blocks if isinstance(b, dict)] if (
            isinstance(blocks, list)) else []  # fmt: skip
        columns["disk"].append(max((v for v in latencies if v > 0), default=np.nan))
    arrays = {k: np.array(v, dtype=float) for k, v in columns.items()}
    return Monitor(arrays["boottime"], arrays["wall"], arrays["gpu_util"], arrays["pcie"],
                   arrays["nvlink"], arrays["disk"], gpus, unavailable, stride)  # fmt: skip


def _real(value: Any) -> float:
    """A finite number as float; NaN (a gap) for anything else."""
    return float(value) if timeline.finite(value) else np.nan


def _mean(values: Any) -> float:
    numbers = [v for v in map(_real, values) if not np.isnan(v)]
    return sum(numbers) / len(numbers) if numbers else np.nan


def _sum(cards: list[dict], keys: tuple[str, ...]) -> float:
    numbers = [v for g in cards for k in keys if not np.isnan(v := _real(g.get(k)))]
    return float(sum(numbers)) if numbers else np.nan


def read_node(folder: Path, missing: list[str]) -> Node:
    events = timeline.last_run(timeline.read_events(folder))
    stamped = [e["boottime"] for e in events if isinstance(e.get("boottime"), (int, float))]
    if not stamped:
        raise InputError("the event log has no timestamps: not a pyinit run log", file=str(folder))
    booted = any(e.get("event") == "phase" and e.get("name") == "kernel" for e in events)
    origin = "power-on" if booted else "pyinit run start"
    start = 0.0 if booted else min(stamped)
    steps = read_steps(folder)
    monitor = read_monitor(folder)
    if monitor is not None:  # samples from before the monitor stamped boottime
        unstamped = np.isnan(monitor.boottime)
        monitor.boottime[unstamped] = monitor.wall[unstamped] - _wall_to_boot(events)
    ends = [e["boottime"] for e in events if e.get("event") == "end"]
    last_seen = max(
        [
            *stamped,
            *(float(r["end"][-1]) for r in steps.values() if len(r)),
            *(monitor.boottime[-1:] if monitor else []),
        ]
    )
    if not ends:
        missing.append(
            f"{folder}: no end event (the run was killed or is still going): "
            f"counted to its last record"
        )
    if not steps:
        missing.append(f"{folder}: no step records (steps/): every rank counts as start-up")
    for marker in sorted((folder / FOLDER).glob("rank-*.bin.lost-*")):
        rank, _, when = marker.name.removeprefix("rank-").partition(".bin.lost-")
        missing.append(
            f"{folder}: rank {rank}'s step records stop ({when.replace('-', ' ')}; the disk "
            "was full, or a write failed): its later steps count as the tail"
        )
    if not monitor:
        missing.append(f"{folder}: no monitor samples (monitor.jsonl): no GPU or disk charts")
    elif monitor.stride > 1:
        missing.append(f"{folder}: monitor.jsonl is long: every {monitor.stride}th sample read")
    return Node(
        folder, events, steps, monitor, start, origin, ends[-1] if ends else last_seen, bool(ends)
    )


def node_outcome(node: Node) -> dict[str, Any]:
    """How this node's run ended, from its last end event: the status, and
    one line saying why (the first failure, the stall, the nodes that never
    joined, the refusal to start, the signal)."""
    ends = [e for e in node.events if e.get("event") == "end"]
    if not ends:
        return {"status": None, "how": "no end: killed, or still going"}
    end = ends[-1]
    status = _real(end.get("status"))
    status = int(status) if status == status else None
    failures = [f for f in end.get("failures") or [] if isinstance(f, dict)]
    signals = [e.get("signal") for e in node.events if e.get("event") == "signal"]
    stalls = [e for e in node.events if e.get("event") in ("stall", "peer_stall")]
    if status == 0:
        how = "finished"
    elif end.get("not_joined"):
        how = f"did not start: {', '.join(map(str, end['not_joined']))} did not join"
    elif end.get("reason") or end.get("error"):
        how = f"did not start: {end.get('reason') or end.get('error')}"
    elif stalls:
        causes = stalls[-1].get("causes") or []
        named = ", ".join(f"rank {c['rank'] if isinstance(c, dict) else c}" for c in causes)
        how = f"ended by a stall{': ' + named if named else ''}"
    elif signals:
        how = f"ended by {signals[0]}"
    elif failures:
        first = failures[0]
        cause = (
            f"killed by {first['signal']}" if first.get("signal") else f"exit {first.get('exit')}"
        )
        how = f"rank {first.get('rank')} failed first ({cause})"
    else:
        how = "failed before any worker did (torchrun's agent: see agent.log)"
    return {"status": status, "how": how}


def _wall_to_boot(events: list[dict]) -> float:
    """Wall clock minus CLOCK_BOOTTIME, from the events that carry both."""
    pairs = [
        e["time"] - e["boottime"]
        for e in events
        if isinstance(e.get("time"), (int, float)) and isinstance(e.get("boottime"), (int, float))
    ]
    return float(np.median(pairs)) if pairs else 0.0


def account(node: Node, node_index: int, rank: int, records: np.ndarray) -> RankTime:
    """Splits the rank's [start, end] into the categories; they add up to it.
    Steps are handled as arrays (a day is 86,400 of them per rank); the few
    gaps between attempts one by one."""
    start, end = node.start, node.end
    spans: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {key: [] for key in COLOURS}
    stalls = sorted(e["boottime"] for e in node.events
                    if e.get("event") in ("stall", "peer_stall") and "boottime" in e)  # fmt: skip

    def add(key: str, lo: Any, hi: Any) -> None:
        lo, hi = np.atleast_1d(np.asarray(lo, float)), np.atleast_1d(np.asarray(hi, float))
        keep = hi > lo
        spans[key].append((lo[keep] - start, hi[keep] - start))

    def gap(lo: float, hi: float, after: str) -> None:
        """Between attempts (or after the last step): a stall up to its
        detection, then a restart (or the tail)."""
        found = [t for t in stalls if lo < t <= hi]
        if found:
            add("stall", lo, found[0])
            lo = found[0]
        add(after, lo, hi)

    records = records[records["end"] <= end]
    ends = records["end"].astype(float)
    if not len(records):
        add("startup", start, end)
        regular = np.zeros(0, dtype=int)
    else:
        add("startup", start, ends[0])
        attempts = records["attempt"]
        # A step ends each interval since the one before, in the same attempt;
        # the first step of a later attempt ends a gap instead.
        restarted = np.flatnonzero(attempts[1:] != attempts[:-1]) + 1
        regular = np.setdiff1d(np.arange(1, len(records)), restarted)
        for i in restarted:
            gap(ends[i - 1], ends[i], "restart")
        gap(ends[-1], end, "tail")
    previous, this_end = ends[regular - 1], ends[regular]
    lengths = np.maximum(this_end - previous, 0.0)
    data = np.minimum(records["data"][regular], lengths)
    saving = np.minimum(records["checkpoint"][regular], lengths - data)
    add("data", previous, previous + data)
    add("productive", previous + data, this_end - saving)
    add("checkpoint", this_end - saving, this_end)
    intervals = {}
    for key, parts in spans.items():
        lo = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
        hi = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
        order = np.argsort(lo, kind="stable")
        intervals[key] = (lo[order], hi[order])
    seconds = {key: float(np.sum(hi - lo)) for key, (lo, hi) in intervals.items()}
    return RankTime(node_index, rank, seconds, len(records), this_end - start, lengths, data,
                    intervals)  # fmt: skip


@dataclass
class Report:
    nodes: list[Node]
    ranks: list[RankTime]
    unit: str  # "GPU" or "rank"
    price: float | None
    missing: list[str]

    @property
    def wall_s(self) -> float:
        return max(n.end - n.start for n in self.nodes)

    def totals(self) -> dict[str, float]:
        return {key: sum(r.seconds[key] for r in self.ranks) for key in COLOURS}

    def outcome(self) -> dict[str, Any]:
        """How the run ended: the first node that did not finish names it (its
        status is the run's), a node with no end event makes it unknown, and a
        run that made no step failed whatever its status says."""
        outcomes = [node_outcome(n) for n in self.nodes]
        bad = next((o for o in outcomes if o["status"] != 0), None)
        ended = bad or outcomes[0]
        steps = sum(r.steps for r in self.ranks)
        healthy = bad is None and steps > 0
        how = ended["how"] if steps or bad else "finished without a single step"
        return {"status": ended["status"], "how": how, "healthy": healthy}

    def resumes(self) -> list[dict[str, Any]]:
        """Every restart's phases, node by node (the timeline's)."""
        found = []
        for index, node in enumerate(self.nodes):
            try:
                built = timeline.build(node.events)
            except InputError:
                continue
            found += [{"node": index, **asdict(resume)} for resume in built.resumes]
        return found

    def summary(self) -> dict[str, Any]:
        totals = self.totals()
        whole = sum(totals.values())
        hours = whole / 3600
        shares = {k: (v / whole if whole else 0.0) for k, v in totals.items()}
        lengths = np.concatenate([r.step_lengths for r in self.ranks]) if self.ranks else []
        data = np.concatenate([r.step_data for r in self.ranks]) if self.ranks else []
        document: dict[str, Any] = {
            "run_dirs": [str(n.folder) for n in self.nodes],
            "nodes": len(self.nodes),
            "ranks": len(self.ranks),
            "unit": self.unit,
            "origin": self.nodes[0].origin,
            "wall_s": round(self.wall_s, 3),
            f"{self.unit.lower()}_hours": round(hours, 6),
            "effective_training_time": round(shares["productive"], 4),
            "breakdown": {
                k: {"seconds": round(totals[k], 3), "share": round(shares[k], 4)} for k in COLOURS
            },
            "steps": int(sum(r.steps for r in self.ranks)),
            "steps_per_rank": int(max((r.steps for r in self.ranks), default=0)),
            "step_time_s": _percentiles(lengths),
            "data_wait_of_step_time": round(float(np.sum(data) / np.sum(lengths)), 4)
            if len(lengths) and np.sum(lengths) > 0
            else None,
            "ended": all(n.ended for n in self.nodes),
            "outcome": self.outcome(),
            "missing": self.missing,
        }
        if self.price is not None:
            document["cost"] = {
                "price_per_hour": self.price,
                # Kept to a millionth: a short run's cost is a fraction of a cent.
                "total": round(hours * self.price, 6),
                "not_productive": round(hours * (1 - shares["productive"]) * self.price, 6),
                "by_loss": {k: round(totals[k] / 3600 * self.price, 6) for k in LOSSES},
            }
        resumes = self.resumes()
        if resumes:
            document["resumes"] = resumes
        checkpoints = checkpoint_summary(self.nodes)
        if checkpoints:
            document["checkpoints"] = checkpoints
        document["monitor"] = monitor_summary(self.nodes)
        document["findings"] = findings(self, document)
        return document


def checkpoint_summary(nodes: list[Node]) -> dict[str, Any]:
    """Saves and loads through pyinit.checkpoint (its files and DCP's
    storage), from their events: how many, bytes, seconds from start to
    published (or loaded), and the seconds the training waited for them
    (a background save's snapshot; all of a foreground save or a load)."""
    summary: dict[str, Any] = {}
    for kind in ("save", "load"):
        rows = [e for n in nodes for e in n.events
                if e.get("event") == "phase" and e.get("name") == f"checkpoint {kind}"]  # fmt: skip
        if not rows:
            continue
        seconds = sum(_real(e.get("end")) - _real(e.get("start")) for e in rows)
        blocked = sum(_real(e.get("blocked_s", _real(e.get("end")) - _real(e.get("start"))))
                      for e in rows)  # fmt: skip
        moved = sum(int(e.get("bytes") or 0) for e in rows)
        rate = round(moved / seconds / 1e9, 3) if seconds > 0 else None
        summary[kind] = {"count": len(rows), "bytes": moved, "seconds": round(seconds, 3),
                         "blocked_s": round(blocked, 3), "gb_s": rate}  # fmt: skip
    return summary


def checkpoint_line(kind: str, row: dict[str, Any]) -> str:
    """`checkpoint saves: 12, 24.0 GiB in 30.1 s (0.80 GB/s), training blocked 2.3 s`,
    in the units a small checkpoint needs too (`2, 1.3 MiB in 0.012 s`)."""
    rate = f" ({row['gb_s']:.2f} GB/s)" if row["gb_s"] is not None else ""
    return (f"checkpoint {kind}s: {row['count']}, {byte_text(row['bytes'])} in "
            f"{seconds_text(row['seconds'])}{rate}, training blocked "
            f"{seconds_text(row['blocked_s'])}")  # fmt: skip


def byte_text(count: float) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,.0f} bytes"


def seconds_text(seconds: float) -> str:
    """Three significant digits below 10 s (0.012 s), tenths above."""
    return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:,.1f} s"


def money_text(amount: float) -> str:
    """A price with cents, or three significant digits below one (a short run's)."""
    return f"{amount:.3g}" if 0 < abs(amount) < 1 else f"{amount:,.2f}"


def _percentiles(values: Any) -> dict[str, float] | None:
    if not len(values):
        return None
    cuts = np.percentile(values, [50, 90, 99])
    return {
        "p50": round(float(cuts[0]), 4),
        "p90": round(float(cuts[1]), 4),
        "p99": round(float(cuts[2]), 4),
        "max": round(float(np.max(values)), 4),
    }


def monitor_summary(nodes: list[Node]) -> dict[str, Any] | None:
    monitors = [n.monitor for n in nodes if n.monitor]
    if not monitors:
        return None
    util = np.concatenate([m.gpu_util for m in monitors])
    latency = np.concatenate([m.disk_latency_us for m in monitors])
    latency = latency[np.isfinite(latency) & (latency > 0)]
    util = util[np.isfinite(util)]
    return {
        "samples": int(sum(len(m) for m in monitors)),
        "gpu_util_mean": round(float(util.mean()), 1) if len(util) else None,
        "disk_read_latency_us": _percentiles(latency),
    }


def count_of(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def clock_text(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def findings(report: Report, document: dict[str, Any]) -> list[str]:
    """The losses, largest first, each said plainly with what to do about it."""
    unit = report.unit
    breakdown = document["breakdown"]
    notes = []
    for key in sorted(LOSSES, key=lambda k: -breakdown[k]["seconds"]):
        seconds, share = breakdown[key]["seconds"], breakdown[key]["share"]
        if share < 0.005:
            continue
        lead = f"{share:.0%} of the {unit}-time ({seconds:,.1f} {unit}-seconds)"
        if key == "data":
            of_steps = document["data_wait_of_step_time"] or 0.0
            disk = (document.get("monitor") or {}).get("disk_read_latency_us")
            where = f"; the disk's read latency p99 was {disk['p99'] / 1e3:.2f} ms" if disk else ""
            notes.append(
                f"{lead} waited for data: {of_steps:.0%} of step time{where}. More "
                "DataLoader workers, a deeper reader queue or page_cache=True would "
                "hide it."
            )
        elif key == "startup":
            slowest = _slowest_start_phase(report.nodes[0])
            notes.append(
                f"{lead} went to start-up, before the first step ended"
                f"{slowest}. `pyinit timeline` shows every phase."
            )
        elif key == "checkpoint":
            saves = (document.get("checkpoints") or {}).get("save", {}).get("count", 0)
            notes.append(
                f"{lead} went to {saves} checkpoint save(s) inside steps; "
                "pyinit.checkpoint.save(..., background=True) writes while training "
                "goes on."
            )
        elif key in ("restart", "stall"):
            restarts = sum(1 for n in report.nodes for e in n.events if e.get("event") == "restart")
            what = (
                "stalls (from the last step to the stall's detection)"
                if key == "stall"
                else f"restarts ({restarts}: from the last step before one to the first after)"
            )
            notes.append(f"{lead} was lost to {what}; each stall event names its cause.")
        elif key == "tail":
            notes.append(
                f"{lead} came after the last step: the script's end (saving, "
                "evaluation, teardown) or ranks waiting for a slower one."
            )
    util = (document.get("monitor") or {}).get("gpu_util_mean")
    if util is not None and util < 75:
        notes.append(
            f"The GPUs were {util:.0f} % busy on average (monitor): below the 75 % a "
            "training GPU should reach."
        )
    outcome = document["outcome"]
    if not outcome["healthy"]:
        status = "no exit status" if outcome["status"] is None else f"exit {outcome['status']}"
        # A clean exit with no step is no failure of the script's, but nothing trained.
        lead = "The run trained nothing" if outcome["status"] == 0 else "The run failed"
        notes.insert(0, f"{lead} ({status}): {outcome['how']}.")
    elif not notes:
        notes.append("No loss above 0.5 %: the run spent its time in steps.")
    return notes


def _slowest_start_phase(node: Node) -> str:
    try:
        rows = timeline.build(node.events).rows
    except InputError:
        return ""
    rows = [r for r in rows if r.phase not in ("steps", "first step")]
    if not rows:
        return ""
    slowest = max(rows, key=lambda r: r.seconds)
    return f" (the longest phase: {slowest.label}, {slowest.seconds:.1f} s)"


def build(folders: list[Path], price: float | None) -> Report:
    missing: list[str] = []
    nodes = [read_node(folder, missing) for folder in folders]
    ranks = []
    for index, node in enumerate(nodes):
        seen = set(node.steps)
        seen |= {e["rank"] for e in node.events if isinstance(e.get("rank"), int)}
        for rank in sorted(seen):
            records = node.steps.get(rank, np.zeros(0, dtype=STEP_DTYPE))
            ranks.append(account(node, index, rank, records))
    if not ranks:
        missing.append("no ranks: the workers never started")
    gpus = any(n.monitor.gpus for n in nodes if n.monitor)
    return Report(nodes, ranks, "GPU" if gpus else "rank", price, missing)


def ended_line(document: dict[str, Any]) -> str:
    """How the run ended, as the text's `ended:` line and the page say it."""
    outcome = document["outcome"]
    status = "no exit status" if outcome["status"] is None else f"exit {outcome['status']}"
    return f"{status}, {outcome['how']}"


def text(document: dict[str, Any]) -> str:
    unit = document["unit"]
    hours = document[f"{unit.lower()}_hours"]
    lines = [
        f"pyinit report: {', '.join(document['run_dirs'])}",
        f"{count_of(document['ranks'], unit)} on {count_of(document['nodes'], 'node')}, wall "
        f"{clock_text(document['wall_s'])} from {document['origin']}, {hours:.4f} {unit}-hours"
        + ("" if document["ended"] else " (the run has no end: partial)"),
        f"ended: {ended_line(document)}",
        f"effective training time {document['effective_training_time']:.1%}",
    ]
    for key, label, _ in CATEGORIES:
        row = document["breakdown"][key]
        lines.append(f"  {label:28} {row['seconds']:12,.1f} {unit}-s {row['share']:7.1%}")
    cost = document.get("cost")
    if cost:
        lines.append(
            f"cost {money_text(cost['total'])} at {cost['price_per_hour']:g} per {unit}-hour; "
            f"not productive: {money_text(cost['not_productive'])}"
        )
    for resume in document.get("resumes", []):
        lines.append(f"node {resume['node']} {timeline.resume_line(resume)}")
    for kind, row in document.get("checkpoints", {}).items():
        lines.append(checkpoint_line(kind, row))
    lines.append("findings:")
    lines += [f"  {i}. {note}" for i, note in enumerate(document["findings"], 1)]
    lines += [f"missing: {note}" for note in document["missing"]]
    return "\n".join(lines) + "\n"


# --- the HTML: inline SVG charts ---------------------------------------------------------
