"""pyinit report: the accounting on a recorded run (golden) and on built-to-
measure logs (restarts, stalls, partial runs), the step records and phases
behind it, a real CPU run with a slow data path and one killed mid-way, and
the HTML as headless Chromium shows it.

After an intended change to the summary, regenerate the golden files with

    pyinit report tests/data/run-report --out /tmp/report.html \
        > tests/golden/report/run.txt
    pyinit report tests/data/run-report --out /tmp/report.html --json \
        > tests/golden/report/run.json

(then drop the last line, "wrote ...", from run.txt and the "html" key from run.json).
"""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import signal
import struct
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, TINY

from pyinit import phases
from pyinit.analysis import report, timeline
from pyinit.runlog import steps

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "run-report"
GOLDEN = ROOT / "tests" / "golden" / "report"


def pyinit_report(pyinit_bin, *args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(pyinit_bin), "report", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=120)  # fmt: skip


def test_recorded_run_gives_the_golden_summary(pyinit_bin, tmp_path):
    out = tmp_path / "report.html"
    done = pyinit_report(pyinit_bin, "tests/data/run-report", "--out", out)
    assert done.returncode == 0, done.stderr
    *summary, wrote = done.stdout.splitlines(keepends=True)
    assert "".join(summary) == (GOLDEN / "run.txt").read_text()
    assert wrote == f"wrote {out}\n"
    done = pyinit_report(pyinit_bin, "tests/data/run-report", "--out", out, "--json")
    document = json.loads(done.stdout)
    assert document.pop("html") == str(out)
    assert document == json.loads((GOLDEN / "run.json").read_text())
    shares = [row["share"] for row in document["breakdown"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    seconds = sum(row["seconds"] for row in document["breakdown"].values())
    assert seconds == pytest.approx(document["ranks"] * document["wall_s"], rel=1e-3)
    # The slow data path (--slow-data 0.1) is there: 0.1 s of every step after the first.
    assert document["breakdown"]["data"]["seconds"] == pytest.approx(2 * 29 * 0.1, rel=0.05)
    assert document["breakdown"]["checkpoint"]["seconds"] > 0  # rank 0 saved 3 times


class Checker(html.parser.HTMLParser):
    """Tags opened and closed in order (void elements aside)."""

    VOID = frozenset({"meta", "br", "img", "rect", "polyline", "polygon"})

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.open[-1:] or 'nothing'}")
        else:
            self.open.pop()


def test_the_html_is_self_contained_and_well_formed(pyinit_bin, tmp_path):
    out = tmp_path / "report.html"
    assert pyinit_report(pyinit_bin, RECORDED, "--out", out,
                         "--price-per-gpu-hour", "3.2").returncode == 0  # fmt: skip
    page = out.read_text()
    checker = Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.open == []
    for needle in ("http://", "https://", "<script", "<link", "src="):
        assert needle not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    charts = page.split("<svg")[1:]
    assert len(charts) >= 3
    for chart in charts:  # each chart is well-formed XML
        ElementTree.fromstring("<svg" + chart[: chart.index("</svg>") + len("</svg>")])
    assert "Effective training time" in page and "at 3.2 per rank-hour" in page
    # The recorded run: 30 steps on each of 2 ranks, a 17 s run's cost below a cent.
    assert "30 steps per rank" in page and "60 steps" not in page
    assert "Cost: <b>0.0304</b>" in page and "<td>0.00523</td>" in page  # not 0.03, 0.01


def test_a_folder_whose_name_is_not_utf8_is_reported(pyinit_bin, tmp_path):
    """A run folder named in another encoding: its bytes show as \\xNN in the
    lines and the page, where writing them was taken for a bug of ours."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    shutil.copytree(RECORDED, folder)
    done = pyinit_report(pyinit_bin, folder)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = f"{tmp_path}/caf\\xe9"
    assert done.stdout.endswith(f"wrote {shown}/report.html\n"), done.stdout[-500:]
    assert f"{shown}: " in (folder / "report.html").read_text()


def write_run(folder: Path, events: list[dict], records: dict[int, list[tuple]]) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "w") as f:
        for event in events:
            f.write(json.dumps({"time": 1e9 + event["boottime"], **event}) + "\n")
    (folder / "steps").mkdir()
    for rank, rows in records.items():
        (folder / "steps" / f"rank-{rank}.bin").write_bytes(
            b"".join(steps.RECORD.pack(*row) for row in rows)
        )
    return folder


def test_restarts_stalls_and_the_tail_are_accounted_to_the_second(tmp_path):
    # One rank: starts at 100, first step ends at 110, steps every 1 s with 0.25 s of
    # data wait and one 0.5 s checkpoint, stalls after 113 (detected at 120), restarts,
    # steps again from 125, and the run ends at 130.
    events = [
        {"boottime": 100.0, "event": "start"},
        {"boottime": 101.0, "event": "phase", "name": "supervisor start", "start": 100.0,
         "end": 101.0},
        {"boottime": 120.0, "event": "stall", "rank": 0},
        {"boottime": 121.0, "event": "restart", "attempt": 1},
        {"boottime": 130.0, "event": "end", "status": 0},
    ]  # fmt: skip
    records = {0: [(0, 1, 110.0, 0.0, 0.0), (0, 2, 111.0, 0.25, 0.0), (0, 3, 112.0, 0.25, 0.5),
                   (0, 4, 113.0, 0.25, 0.0), (1, 1, 125.0, 0.0, 0.0), (1, 2, 126.0, 0.25, 0.0),
                   (1, 3, 127.0, 0.25, 0.0)]}  # fmt: skip
    run = report.build([write_run(tmp_path / "run", events, records)], price=None)
    seconds = run.ranks[0].seconds
    assert seconds == {"productive": 3.0 * 0.75 - 0.5 + 2 * 0.75, "startup": 10.0,
                       "data": 5 * 0.25, "checkpoint": 0.5, "restart": 5.0, "stall": 7.0,
                       "tail": 3.0}  # fmt: skip
    assert sum(seconds.values()) == pytest.approx(30.0)
    document = run.summary()
    assert document["effective_training_time"] == pytest.approx(3.25 / 30, abs=1e-4)
    assert document["findings"][0].startswith("33% of the rank-time (10.0 rank-seconds) went to "
                                              "start-up")  # fmt: skip
    assert document["missing"] == [f"{tmp_path / 'run'}: no monitor samples (monitor.jsonl): "
                                   "no GPU or disk charts"]  # fmt: skip


def test_a_partial_run_is_reported_as_far_as_it_goes(tmp_path):
    events = [{"boottime": 10.0, "event": "start"},
              {"boottime": 12.0, "event": "phase", "name": "worker start", "rank": 0,
               "start": 11.0, "end": 12.0}]  # fmt: skip
    run_dir = write_run(tmp_path / "run", events, {0: [(0, 1, 15.0, 0.0, 0.0)]})
    # A record cut short by the kill is left out, not misread.
    with open(run_dir / "steps" / "rank-0.bin", "ab") as f:
        f.write(steps.RECORD.pack(0, 2, 16.0, 0.0, 0.0) + steps.RECORD.pack(0, 3, 17.0, 0, 0)[:20])
    document = report.build([run_dir], price=2.0).summary()
    assert not document["ended"] and document["wall_s"] == 6.0
    assert document["breakdown"]["startup"]["seconds"] == 5.0
    assert document["breakdown"]["productive"]["seconds"] == 1.0
    assert any("no end event" in m for m in document["missing"])
    assert document["cost"]["total"] == round(6 / 3600 * 2.0, 6)


def test_bad_folders_are_one_line(pyinit_bin, tmp_path):
    done = pyinit_report(pyinit_bin, tmp_path / "nope")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "nope: not a folder" in done.stderr
    done = pyinit_report(pyinit_bin, tmp_path)
    assert done.returncode == 2 and "no events.jsonl here" in done.stderr
    done = pyinit_report(pyinit_bin, RECORDED, "--price-per-gpu-hour", "-1")
    assert done.returncode == 2 and "--price-per-gpu-hour" in done.stderr


def test_the_default_run_folder_is_read_node_by_node(pyinit_bin, tmp_path):
    """`pyinit run` without --run-dir writes pyinit-run/node0, node1, ...;
    `pyinit report pyinit-run` was refused as "not a pyinit run folder"."""
    root = tmp_path / "pyinit-run"
    shutil.copytree(RECORDED, root / "node0")
    (root / "node1-old").mkdir()  # not a node's folder: passed over
    done = pyinit_report(pyinit_bin, "pyinit-run", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document.pop("html") == "pyinit-run/report.html"
    assert document.pop("run_dirs") == ["pyinit-run/node0"]
    golden = json.loads((GOLDEN / "run.json").read_text())
    assert golden.pop("run_dirs") == ["tests/data/run-report"] and document == golden
    for node in (10, 2):
        (root / f"node{node}").mkdir()
        (root / f"node{node}" / "events.jsonl").touch()
    assert timeline.run_folders(root) == [root / "node0", root / "node2", root / "node10"]
    assert timeline.run_folders(root / "node0") == [root / "node0"]
    done = subprocess.run([str(pyinit_bin), "timeline", root], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr == (
        f"pyinit: {root}: holds 3 nodes' run folders (node0, node2, node10): give one\n"
    )
    shutil.rmtree(root / "node2"), shutil.rmtree(root / "node10")
    done = subprocess.run([str(pyinit_bin), "timeline", root], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and "first step" in done.stdout, done.stderr


def test_phases_count_once_and_only_inside_a_run(tmp_path):
    with phases.phase("data"):  # outside a run: just runs
        pass
    log = steps.StepLog(tmp_path / "rank-0.bin", attempt=0)
    phases.install(log)
    try:
        with phases.phase("data"), phases.phase("data"):  # nested: the outer counts
            time.sleep(0.05)
        with phases.phase("checkpoint"):
            time.sleep(0.02)
        log.step(123.0)
        log.step(124.0)
    finally:
        phases.install(None)
        log.close()
    raw = (tmp_path / "rank-0.bin").read_bytes()
    rows = [steps.RECORD.unpack_from(raw, i) for i in range(0, len(raw), steps.RECORD.size)]
    assert [r[:3] for r in rows] == [(0, 1, 123.0), (0, 2, 124.0)]
    assert 0.05 <= rows[0][3] < 0.09 and 0.02 <= rows[0][4] < 0.06
    assert rows[1][3:] == (0.0, 0.0)


def train_command(pyinit_bin, run_dir: Path, shards: Path, *extra: str) -> list[str]:
    return [str(pyinit_bin), "run", "--nproc-per-node", "2", "--run-dir", str(run_dir),
            "--monitor-interval", "1", "--", str(EXAMPLE), "--data", str(shards), *TINY,
            *extra]  # fmt: skip


@pytest.mark.slow
def test_a_slow_data_path_is_the_largest_loss(pyinit_bin, shards, tmp_path):
    run_dir = tmp_path / "run"
    # A second of data wait per step, made by the script: large against what
    # a loaded machine adds to the steps, so the conclusion below holds on
    # any machine (a share of the step time would move with the load).
    done = subprocess.run(train_command(pyinit_bin, run_dir, shards, "--steps", "20",
                                        "--slow-data", "1.0"),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(pyinit_report(pyinit_bin, run_dir, "--json").stdout)
    losses = {k: v["seconds"] for k, v in document["breakdown"].items() if k != "productive"}
    assert max(losses, key=losses.get) == "data", losses
    assert losses["data"] >= 2 * 20 * 1.0 * 0.9, losses  # 2 ranks, 20 steps, 1 s each
    # GPU-seconds where the monitor saw GPUs (the node's, whatever the ranks ran on)
    samples = [json.loads(line) for line in (run_dir / "monitor.jsonl").read_text().splitlines()]
    unit = "GPU" if any(sample.get("gpus") for sample in samples) else "rank"
    assert document["unit"] == unit
    assert document["findings"][0].split(" waited for data")[0].endswith(f"{unit}-seconds)")
    assert document["ended"]
    assert (run_dir / "report.html").exists()


@pytest.mark.slow
def test_a_run_killed_mid_way_reports_what_it_has(pyinit_bin, shards, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(train_command(pyinit_bin, run_dir, shards, "--steps", "100000"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        record = steps.RECORD.size
        while time.monotonic() < deadline:
            found = list((run_dir / "steps").glob("rank-*.bin")) if run_dir.exists() else []
            if len(found) == 2 and all(p.stat().st_size >= 5 * record for p in found):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run made no steps")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = pyinit_report(pyinit_bin, run_dir, "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert not document["ended"] and document["steps"] >= 10
    assert any("no end event" in m for m in document["missing"])
    assert document["breakdown"]["productive"]["seconds"] > 0


def distinct_colours(png: Path, box: tuple[int, int, int, int]) -> int:
    from PIL import Image

    with Image.open(png) as image:
        region = image.convert("RGB").crop(box)
        counts = region.getcolors(maxcolors=1 << 20) or []
    # Colours that fill at least 50 pixels: the charts', not anti-aliased edges.
    return sum(1 for count, _ in counts if count >= 50)


def test_chromium_shows_the_charts_without_console_errors(pyinit_bin, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium (./bootstrap test installs Debian's package)")
    out = tmp_path / "report.html"
    assert pyinit_report(pyinit_bin, RECORDED, "--out", out).returncode == 0
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1000,1400", f"--screenshot={shot}", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / 'profile'}", out.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert console == []
    # The breakdown bar, the phases per rank and the step-time chart fill the top:
    # several of the category colours must be on screen, not a blank page.
    assert distinct_colours(shot, (0, 120, 1000, 1100)) >= 5
    assert np.asarray(struct.unpack(">II", shot.read_bytes()[16:24])).tolist() == [1000, 1400]


@pytest.mark.parametrize("end, extra, ended", [
    ({"status": 3, "failures": [{"rank": 1, "exit": 3, "signal": None, "time": 5.0}]}, [],
     "exit 3, rank 1 failed first (exit 3)"),
    ({"status": 137, "failures": [{"rank": 0, "exit": -9, "signal": "SIGKILL", "time": 5.0}]},
     [], "exit 137, rank 0 failed first (killed by SIGKILL)"),
    ({"status": 124}, [{"event": "stall", "causes": [2], "boottime": 14.0}],
     "exit 124, ended by a stall: rank 2"),
    ({"status": 143}, [{"event": "signal", "signal": "SIGTERM", "boottime": 14.0}],
     "exit 143, ended by SIGTERM"),
    ({"status": 1, "not_joined": ["node 1 (192.0.2.99)"]}, [],
     "exit 1, did not start: node 1 (192.0.2.99) did not join"),
    ({"status": 1, "reason": "preflight errors (strict)"}, [],
     "exit 1, did not start: preflight errors (strict)"),
    ({"status": 1}, [], "exit 1, failed before any worker did (torchrun's agent: see agent.log)"),
])  # fmt: skip
def test_a_failed_run_says_how_it_ended_first(tmp_path, end, extra, ended):
    """A run that died was once "No loss above 0.5 %: the run spent its time in steps"."""
    events = [
        {"boottime": 10.0, "event": "start"},
        *extra,
        {"boottime": 15.0, "event": "end", **end},
    ]
    document = report.build([write_run(tmp_path / "run", events, {})], price=None).summary()
    assert report.ended_line(document) == ended
    assert not document["outcome"]["healthy"]
    assert (
        document["findings"][0]
        == f"The run failed (exit {end['status']}): {ended.split(', ', 1)[1]}."
    )
    assert not any("No loss" in note for note in document["findings"])
    assert f"ended: {ended}\n" in report.text(document)


def test_a_run_without_a_step_is_not_healthy_even_when_it_exits_0(tmp_path):
    events = [{"boottime": 10.0, "event": "start"}, {"boottime": 12.0, "event": "end", "status": 0}]
    document = report.build([write_run(tmp_path / "run", events, {})], price=None).summary()
    assert report.ended_line(document) == "exit 0, finished without a single step"
    assert document["findings"][0] == (
        "The run trained nothing (exit 0): finished without a single step."
    )


def test_checkpoints_report_their_bytes_seconds_and_what_they_blocked(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is installed by the test command")
    from pyinit import checkpoint

    seen = []

    class Sink:
        def ended(self, name, start, end, detail):
            seen.append((name, end - start, dict(detail)))

    path = tmp_path / "model.safetensors"
    state = {"w": torch.ones(1 << 18)}  # 1 MiB
    phases.install(Sink())
    try:
        checkpoint.save(state, path)
        checkpoint.save(state, path, background=True).wait(timeout=60)
        checkpoint.load(path)
    finally:
        phases.install(None)
    saves = [d for name, _, d in seen if name == "checkpoint save"]
    assert [d["bytes"] for d in saves] == [1 << 20, 1 << 20] and saves[1]["background"]
    assert all(d["path"] == str(path) and d["blocked_s"] >= 0 for d in saves)
    (load,) = [d for name, _, d in seen if name == "checkpoint load"]
    assert load["bytes"] == 1 << 20
    assert [name for name, _, _ in seen].count("checkpoint") == 3  # the step's waits
    # In a run's events, the report sums them.
    events = [
        {"boottime": 100.0, "event": "start"},
        {"boottime": 103.0, "event": "phase", "name": "checkpoint save", "start": 101.0,
         "end": 103.0, "bytes": 2 << 30, "blocked_s": 0.5, "background": True},
        {"boottime": 105.0, "event": "phase", "name": "checkpoint save", "start": 104.0,
         "end": 105.0, "bytes": 2 << 30, "blocked_s": 1.0},
        {"boottime": 106.0, "event": "phase", "name": "checkpoint load", "start": 105.0,
         "end": 106.0, "bytes": 1 << 30},
        {"boottime": 110.0, "event": "end", "status": 0},
    ]  # fmt: skip
    run = report.build([write_run(tmp_path / "run", events, {0: [(0, 1, 109.0, 0, 0)]})], None)
    document = run.summary()
    assert document["checkpoints"] == {
        "save": {"count": 2, "bytes": 4 << 30, "seconds": 3.0, "blocked_s": 1.5,
                 "gb_s": round((4 << 30) / 3.0 / 1e9, 3)},
        "load": {"count": 1, "bytes": 1 << 30, "seconds": 1.0, "blocked_s": 1.0,
                 "gb_s": round((1 << 30) / 1e9, 3)},
    }  # fmt: skip
    text = report.text(document)
    assert "checkpoint saves: 2, 4.0 GiB in 3 s (1.43 GB/s), training blocked 1.5 s" in text
    assert "checkpoint loads: 1, 1.0 GiB in 1 s" in text
    # A small checkpoint in units that show it, not "0.00 GiB in 0.0 s".
    small = {"count": 2, "bytes": 1_363_148, "seconds": 0.0123, "blocked_s": 0.004, "gb_s": None}
    assert report.checkpoint_line("save", small) == (
        "checkpoint saves: 2, 1.3 MiB in 0.0123 s, training blocked 0.004 s"
    )
    assert report.money_text(0.00123) == "0.00123" and report.money_text(12.5) == "12.50"
