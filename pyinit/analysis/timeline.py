"""``pyinit timeline RUN_DIR``: where the seconds went before the first step.

Reads the run's event log (``RUN_DIR/events.jsonl``: PID 1's boot steps when
pod-init booted the node, then ``pyinit run``'s, torchrun's agent's and every
worker's) and prints one row per phase, in order, with its start, its length
and a bar on a common axis: a text Gantt chart. ``--json`` writes the rows for
machines, ``--png`` draws the chart. Phases every rank goes through are shown
once, from the earliest rank's start to the latest rank's end; their spread is
in the JSON.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyinit.errors import InputError
from pyinit.jsonfile import MalformedJson, open_input, parse_json
from pyinit.runlog.events import FILE_NAME, NODE_FOLDER

# (event name, label, who records it), in the order they happen.
PHASES = (
    ("kernel", "kernel start to /init", "PID 1"),
    ("modules", "module loading", "PID 1"),
    ("scan", "topology scan", "PID 1"),
    ("nccl", "NCCL files", "PID 1"),
    ("root wait", "waiting for the root's device", "PID 1"),
    ("device wait", "waiting for devices", "PID 1"),
    ("root", "mounting the root", "PID 1"),
    ("data", "mounting the data disk", "PID 1"),
    ("warm start", "starting the warm interpreter", "PID 1"),
    ("warm imports", "warm interpreter: its imports", "warm"),
    ("exec", "exec of the supervisor", "PID 1"),
    ("supervisor start", "supervisor start (Python, pyinit)", "pyinit run"),
    ("preflight", "preflight", "pyinit run"),
    ("nccl files", "NCCL files", "pyinit run"),
    ("agent start", "torchrun agent start (Python)", "agent"),
    ("agent import torch", "agent: import torch", "agent"),
    ("agent preload", "agent: preloads (what a step imports)", "agent"),
    ("rendezvous", "rendezvous, workers started", "agent"),
    ("worker start", "worker start (Python)", "workers"),
    ("import torch", "worker: import torch", "workers"),
    ("device init", "device init (CUDA)", "workers"),
    ("process group", "process group init", "workers"),
    ("script setup", "script set-up (model, data, wrappers)", "workers"),
    ("checkpoint load", "checkpoint load", "workers"),
    ("compile: pattern set-up", "compile: inductor's patterns, set up beside start-up", "workers"),
    ("first forward", "first forward", "workers"),
    ("compile: dynamo", "compile: dynamo tracing", "workers"),
    ("compile: inductor", "compile: inductor (compile or cache load)", "workers"),
    ("compile: backward", "compile: backward graphs (inductor)", "workers"),
    ("first backward", "first backward", "workers"),
    ("first optimizer step", "first optimizer step", "workers"),
    ("first step", "first step (forward to optimizer step)", "workers"),
    ("steps", "steps after the first", "workers"),
)
# Phases that belong to a run on any node; PID 1's exist only when pod-init booted it.
RUN_PHASES = tuple(name for name, _, who in PHASES if who != "PID 1")
# Phases a run may well not have: no GPU, workers spawned, an older log, a
# script that loads no checkpoint or calls no nn.Module.
OPTIONAL = {"nccl files", "agent preload", "warm imports", "checkpoint load", "script setup",
            "first forward", "first backward", "first optimizer step", "compile: dynamo",
            "compile: inductor", "compile: backward", "compile: pattern set-up"}  # fmt: skip
# Phases a rank goes through many times (one per compile): a row's seconds are
# the slowest rank's sum, not the span from the first to the last.
SUMMED = ("compile: ",)
BAR_WIDTH = 40


@dataclass
class Row:
    phase: str
    label: str
    recorder: str
    start_s: float  # from the origin
    seconds: float
    ranks: list[int] = field(default_factory=list)
    # Per rank: when its phase ended, from the origin (the spread across ranks).
    rank_ends_s: dict[str, float] = field(default_factory=dict)
    steps: int | None = None
    note: str = ""


# A restart's steps, in order, and how `pyinit timeline` names each.
RESUME_PHASES = (
    ("restart detect", "failure seen"),
    ("restart stop", "workers stopped"),
    ("restart rendezvous", "rendezvous"),
    ("restart start workers", "fork"),
    ("device init", "CUDA"),
    ("process group", "process group"),
    ("checkpoint load", "checkpoint load"),
    ("compile: pattern set-up", "patterns (beside)"),
    ("compile: dynamo", "dynamo"),
    ("compile: inductor", "inductor"),
    ("compile: backward", "backward compile"),
    ("first step", "first step"),
)


@dataclass
class Resume:
    """One restart of the worker group: each step's seconds (the slowest
    rank's), and from the failure's last sign of life to the first step."""

    attempt: int
    phases: dict[str, float]
    seconds: float | None  # to the first step on every rank; None: it never came
    import_torch: bool  # whether a restarted worker imported torch again


@dataclass
class Timeline:
    origin: str  # "power-on" or "pyinit run start"
    rows: list[Row]
    first_step_s: float | None  # when every rank had done its first step
    missing: list[str]  # run phases the log does not have
    restarts: int
    resumes: list[Resume] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def run_folders(given: Path) -> list[Path]:
    """The run folders GIVEN stands for: itself, or, where it holds no event
    log but per-node folders (pyinit-run/node0, ... of a run without
    --run-dir, or the nodes' folders gathered in one place), those in node
    order."""
    if not given.is_dir() or os.path.lexists(given / FILE_NAME):
        return [given]
    nodes = []
    for child in given.iterdir():
        match = NODE_FOLDER.fullmatch(child.name)
        if match and os.path.lexists(child / FILE_NAME):
            nodes.append((int(match[1]), child))
    return [child for _, child in sorted(nodes)] or [given]


def read_events(run_dir: Path) -> list[dict]:
    """The log's events (RUN_DIR/events.jsonl, or that file named itself); a
    torn last line (a crash mid-write) is left out."""
    path = run_dir if run_dir.is_file() else run_dir / FILE_NAME
    try:
        with open_input(path) as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        where = str(run_dir)
        raise InputError(f"no {FILE_NAME} here: not a pyinit run folder", file=where) from None
    events = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = parse_json(line)
        except MalformedJson as e:
            if number == len(lines):
                break
            raise InputError(str(e), file=str(path), line=number) from None
        if isinstance(event, dict):
            problem = shape_problem(event)
            if problem:
                raise InputError(problem, file=str(path), line=number)
            events.append(event)
    return events


def finite(value: object) -> bool:
    """A JSON number that is finite (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def shape_problem(event: dict) -> str:
    """What is wrong with an event's fields for the timeline and the report
    ("" when nothing): valid JSON of the wrong shape, said once here rather
    than met as a KeyError or TypeError wherever a field is used."""
    for key in ("time", "boottime", "start", "end"):
        if key in event and not finite(event[key]):
            return f"{key} must be a finite number of seconds, not {event[key]!r:.40}"
    for key in ("rank", "node", "attempt"):
        if key in event and (not isinstance(event[key], int) or isinstance(event[key], bool)):
            return f"{key} must be a whole number, not {event[key]!r:.40}"
    kind = event.get("event")
    if kind == "phase":
        if not isinstance(event.get("name"), str):
            return "a phase event needs a name (a string)"
        if "start" not in event or "end" not in event:
            return "a phase event needs start and end"
    if kind == "end" and "boottime" not in event:
        return "an end event needs its boottime"
    return ""


def clamp_process_starts(by_name: dict[str, list[dict]], events: list[dict]) -> None:
    """A process's start comes from /proc at the clock tick (10 ms), rounded
    down: never show a process starting before the step that started it."""
    launched = {
        "supervisor start": [e["end"] for e in by_name.get("exec", [])],
        "agent start": [e["boottime"] for e in events if e.get("event") == "spawn"],
        "worker start": [
            e["end"] for e in by_name.get("agent preload") or by_name.get("agent import torch", [])
        ],
    }
    for name, before in launched.items():
        if before:
            by_name[name] = [dict(e, start=min(max(e["start"], before[0]), e["end"]))
                             for e in by_name.get(name, [])]  # fmt: skip


def last_run(events: list[dict]) -> list[dict]:
    """The events of the last run in the log (a folder may serve several runs)."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return events[starts[-1] :] if starts else events


def build(events: list[dict]) -> Timeline:
    events = last_run(events)
    phases = [e for e in events if e.get("event") == "phase" and e.get("attempt", 0) == 0]
    by_name: dict[str, list[dict]] = {}
    for event in phases:
        by_name.setdefault(event["name"], []).append(event)
    booted = "kernel" in by_name
    if booted:
        origin_at, origin = 0.0, "power-on"
    elif "supervisor start" in by_name:
        origin_at, origin = by_name["supervisor start"][0]["start"], "pyinit run start"
    elif phases:
        origin_at, origin = min(e["start"] for e in phases), "first event"
    else:
        raise InputError("the event log has no phases: was this run started by pyinit run?")
    workers = [e for e in phases if "rank" in e]
    clamp_process_starts(by_name, events)
    agent_done = by_name.get("agent preload") or by_name.get("agent import torch")
    if agent_done and by_name.get("worker start"):
        # Between the agent's imports and the first worker's fork: the
        # rendezvous and torchrun's start of the workers.
        first_fork = min(e["start"] for e in by_name["worker start"])
        ended = agent_done[0]["end"]
        by_name["rendezvous"] = [{"start": ended, "end": max(first_fork, ended)}]
    rows = []
    for name, label, recorder in PHASES:
        found = by_name.get(name)
        if not found:
            continue
        start = min(e["start"] for e in found) - origin_at
        end = max(e["end"] for e in found) - origin_at
        if name.startswith(SUMMED):
            end = start + span_seconds(found)
        if end < 0:
            continue  # a warm interpreter's imports, done before this run began
        if name == "first step" and "first forward" not in by_name:
            label = "to the first step done"  # an older log: it spans the script's set-up too
        row = Row(name, label, recorder, round(start, 6), round(end - start, 6))
        ranked = [e for e in found if "rank" in e]
        if ranked:
            row.ranks = sorted({e["rank"] for e in ranked})
            row.rank_ends_s = {str(e["rank"]): round(e["end"] - origin_at, 6) for e in ranked}
        if name == "steps":
            row.steps = max(e.get("steps", 0) for e in found)
        if name == "compile: inductor":
            row.note = compile_note(events)
        if name == "import torch" and all(e.get("preloaded") for e in found):
            row.note = "forked with torch loaded"  # an older log's way of saying it
        if name == "agent import torch" and all(e.get("preloaded") for e in found):
            row.note = "forked from a warm interpreter: imported already"
        if name == "worker start" and all(e.get("torch_loaded") for e in found):
            row.note = "forked with torch loaded: no import"
        rows.append(row)
    # In the order they began (a script may start CUDA inside the process group's
    # set-up, or before it); the table's order breaks ties.
    rows.sort(key=lambda row: row.start_s)
    first = by_name.get("first step")
    ranks = {e["rank"] for e in workers}
    first_step = None
    if first and {e["rank"] for e in first} >= ranks:
        first_step = round(max(e["end"] for e in first) - origin_at, 6)
    missing = [name for name in RUN_PHASES if name not in by_name and name not in OPTIONAL]
    if all(e.get("torch_loaded") for e in by_name.get("worker start", [{}])):
        missing = [m for m in missing if m != "import torch"]
    if any(e.get("backend") == "gloo" for e in by_name.get("process group", [])):
        missing = [m for m in missing if m != "device init"]  # no device to initialise on CPU
    restarts = len({e.get("attempt", 0) for e in events if e.get("event") == "phase"}) - 1
    return Timeline(origin, rows, first_step, missing, max(restarts, 0), resumes(events))


def span_seconds(spans: list[dict]) -> float:
    """A phase's seconds: its longest span, or for a phase a rank goes through
    many times (SUMMED), the slowest rank's sum."""
    if not spans[0]["name"].startswith(SUMMED):
        return max(e["end"] - e["start"] for e in spans)
    per_rank: dict[object, float] = {}
    for e in spans:
        per_rank[e.get("rank")] = per_rank.get(e.get("rank"), 0.0) + e["end"] - e["start"]
    return max(per_rank.values())


def compile_note(events: list[dict]) -> str:
    """What the first step compiled, from the ranks' compile summaries (the
    first attempt's): graphs, inductor's and AOTAutograd's cache lookups, the
    graphs AOTAutograd would not cache, its tracing, autotuning."""
    found = [e for e in events if e.get("event") == "compile summary"
             and e.get("at") == "first step" and e.get("attempt", 0) == 0]  # fmt: skip
    if not found:
        return ""

    def most(key: str) -> float:
        values = [e[key] for e in found if finite(e.get(key))]
        return max(values) if values else 0

    def count(e: dict, key: str) -> float:
        return e[key] if finite(e.get(key)) else 0

    def lookups(cache: str) -> tuple[float, float]:
        """Hits and lookups in `cache` of the rank that hit least."""
        counts = [(hits := count(e, f"{cache}_hits"), hits + count(e, f"{cache}_misses"))
                  for e in found]  # fmt: skip
        return min(counts, key=lambda pair: (pair[0] - pair[1], pair[0]))

    hits, looked = lookups("inductor_cache")
    note = f"{most('graphs'):g} graphs; {hits:g} of {looked:g} inductor cache lookups hit"
    hits, looked = lookups("aot_cache")
    if looked:
        note += f"; {hits:g} of {looked:g} AOTAutograd cache lookups hit"
    if most("aot_cache_bypasses"):
        note += (f"; {most('aot_cache_bypasses'):g} graphs past AOTAutograd's cache "
                 "(traced at every start)")  # fmt: skip
    traced = most("aot_trace_s")
    if traced:
        note += f"; AOTAutograd tracing {traced:.2f} s"
    autotune = most("autotune_s")
    return note + (f"; autotuning {autotune:.2f} s" if autotune else "")


def resumes(events: list[dict]) -> list[Resume]:
    """Every restart's phases, from the agent's hooks and the new workers' marks."""
    found = []
    attempts = sorted({e.get("attempt", 0) for e in events if e.get("event") == "phase"} - {0})
    for attempt in attempts:
        mine = [e for e in events if e.get("event") == "phase" and e.get("attempt") == attempt]
        phases = {}
        for name, _label in RESUME_PHASES:
            spans = [e for e in mine if e["name"] == name]
            if spans:
                phases[name] = round(span_seconds(spans), 6)
        began = [e["start"] for e in mine if e["name"] in ("restart detect", "restart stop")]
        firsts = [e["end"] for e in mine if e["name"] == "first step"]
        workers = {e["rank"] for e in mine if "rank" in e}
        done = firsts and len(firsts) >= len(workers)
        seconds = round(max(firsts) - min(began), 6) if done and began else None
        imported = any(e["name"] == "import torch" for e in mine)
        found.append(Resume(attempt, phases, seconds, imported))
    return found


def resume_line(resume: dict) -> str:
    """One restart (a Resume as a dict): its steps' seconds and the time to resume."""
    labels = dict(RESUME_PHASES)
    steps = resume["phases"].items()
    parts = ", ".join(f"{labels[name]} {seconds:.3f} s" for name, seconds in steps)
    if resume["seconds"] is not None:
        took = (f"first step again {resume['seconds']:.3f} s after the failed rank's last sign "
                "of life")  # fmt: skip
    else:
        took = "no first step after it in the log"
    torch_note = "; torch imported again" if resume["import_torch"] else "; no import of torch"
    return f"restart {resume['attempt']}: {took} ({parts}{torch_note})"


def _bar(start: float, seconds: float, span: float) -> str:
    """The phase's place on the common axis, `BAR_WIDTH` characters for `span`
    from the origin, clipped to it: a phase a broken clock put before the
    origin or far past it is drawn at the edge, never as a bar the size of
    its nonsense."""
    scale = BAR_WIDTH / span if span > 0 else 0.0
    at = int(start * scale)
    begin = min(BAR_WIDTH - 1, max(0, at))
    length = max(1, round(seconds * scale)) if seconds > 0 else 0
    if at < 0 and length:
        length = max(1, length + at)  # the part before the origin is not drawn
    length = min(length, BAR_WIDTH - begin)
    return " " * begin + ("#" * length if length else "|")


def table(timeline: Timeline) -> str:
    span = max((r.start_s + r.seconds for r in timeline.rows), default=0.0)
    labels = []
    for row in timeline.rows:
        label = row.label
        if row.ranks:
            ranks = f"rank {row.ranks[0]}" if len(row.ranks) == 1 else (
                f"ranks {row.ranks[0]}-{row.ranks[-1]}")  # fmt: skip
            label += f" ({ranks})"
        if row.steps:
            label += f" ({row.steps} steps)"
        labels.append(label)
    # The phase column as wide as its longest name: a name is never cut.
    width = max([len("phase"), *map(len, labels)])
    lines = [f"{'phase':{width}} {'who':10} {'start s':>8} {'took s':>8}  from {timeline.origin}"]
    for row, label in zip(timeline.rows, labels, strict=True):
        bar = _bar(row.start_s, row.seconds, span)
        timing = f"{row.start_s:8.3f} {row.seconds:8.3f}"
        lines.append(f"{label:{width}} {row.recorder:10} {timing}  {bar}")
        if row.note:
            lines.append(f"  {row.note}")
    if timeline.first_step_s is not None:
        lines.append(f"first step done on every rank {timeline.first_step_s:.3f} s after "
                     f"{timeline.origin}")  # fmt: skip
    if timeline.missing:
        lines.append("not in the log: " + ", ".join(timeline.missing))
    if timeline.restarts:
        lines.append(f"the worker group restarted {timeline.restarts} time(s); the first "
                     "attempt is shown above")  # fmt: skip
        lines.extend(resume_line(asdict(resume)) for resume in timeline.resumes)
    return "\n".join(lines) + "\n"


COLOURS = {"PID 1": "#4c72b0", "warm": "#dd8452", "pyinit run": "#55a868", "agent": "#c44e52",
           "workers": "#8172b2"}  # fmt: skip


def plot(timeline: Timeline, path: Path) -> bool:
    from pyinit.plotting import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return False
    rows = timeline.rows
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.6))
    for y, row in enumerate(rows):
        ax.barh(y, max(row.seconds, 1e-3), left=row.start_s, color=COLOURS[row.recorder],
                label=row.recorder)  # fmt: skip
        for end in row.rank_ends_s.values():
            ax.plot([end, end], [y - 0.4, y + 0.4], color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.label for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds from {timeline.origin}")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="best", fontsize="small")
    title = f"From {timeline.origin} to the first step"
    if timeline.first_step_s is not None:
        title += f" on every rank: {timeline.first_step_s:.2f} s"
    ax.set_title(title + "\n(ticks: each rank's end of the phase)", fontsize="medium")
    if timeline.first_step_s is not None:
        # The chart is about the start: minutes of steps after it would make every
        # phase before it a sliver. Phases that run on past the edge are cut there.
        ax.set_xlim(0, timeline.first_step_s * 1.15)
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)
