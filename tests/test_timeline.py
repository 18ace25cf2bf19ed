"""`pyinit timeline`: a recorded event log (a real boot under QEMU: PID 1's
steps, pyinit run's, the agent's and two workers') gives the same table and
JSON every time; damaged and partial logs are read as far as they go.

After an intended change to the table, regenerate the golden files with
    pyinit timeline tests/data/qemu-training-events.jsonl \\
        --json tests/golden/timeline/qemu-training.json > tests/golden/timeline/qemu-training.txt
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "tests" / "data" / "qemu-training-events.jsonl"
GOLDEN = ROOT / "tests" / "golden" / "timeline"


def timeline(pyinit_bin, *args) -> subprocess.CompletedProcess:
    return subprocess.run([pyinit_bin, "timeline", *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_recorded_boot_gives_the_golden_table(pyinit_bin, tmp_path):
    for attempt in range(2):
        out = tmp_path / f"t{attempt}.json"
        done = timeline(pyinit_bin, EVENTS, "--json", out)
        assert done.returncode == 0, done.stderr
        assert done.stdout == (GOLDEN / "qemu-training.txt").read_text()
        assert json.loads(out.read_text()) == json.loads(
            (GOLDEN / "qemu-training.json").read_text()
        )
    document = json.loads(out.read_text())
    rows = {row["phase"]: row for row in document["rows"]}
    # The figures come from the log, not from the table: kernel start at 0, PID 1's exec
    # before pyinit run's start, the workers' first steps after the process group.
    assert rows["kernel"]["start_s"] == 0 and document["origin"] == "power-on"
    assert rows["exec"]["start_s"] <= rows["supervisor start"]["start_s"]
    assert rows["first step"]["start_s"] >= rows["process group"]["start_s"]
    assert document["first_step_s"] == max(rows["first step"]["rank_ends_s"].values())


def test_a_run_folder_is_read_like_its_log(pyinit_bin, tmp_path):
    (tmp_path / "events.jsonl").write_text(EVENTS.read_text())
    done = timeline(pyinit_bin, tmp_path)
    assert done.returncode == 0 and done.stdout == (GOLDEN / "qemu-training.txt").read_text()


def test_a_folder_used_twice_shows_its_last_run(pyinit_bin, tmp_path):
    earlier = [json.loads(line) for line in EVENTS.read_text().splitlines()]
    shifted = [dict(e, start=e["start"] - 50, end=e["end"] - 50) if "start" in e else e
               for e in earlier[1:]]  # fmt: skip
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in [earlier[0], *shifted]) + EVENTS.read_text()
    )
    done = timeline(pyinit_bin, tmp_path)
    assert done.returncode == 0 and done.stdout == (GOLDEN / "qemu-training.txt").read_text()


def test_a_crashed_run_is_read_as_far_as_it_went(pyinit_bin, tmp_path):
    lines = EVENTS.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"first step"' in line)
    # Killed while writing: the last line is torn. The steps never came.
    (tmp_path / "events.jsonl").write_text("".join(lines[:cut]) + lines[cut][:40])
    done = timeline(pyinit_bin, tmp_path, "--json", tmp_path / "t.json")
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "t.json").read_text())
    assert document["first_step_s"] is None
    assert document["missing"] == ["first step", "steps"]
    assert "not in the log: first step, steps" in done.stdout


def test_restarted_workers_are_counted_and_the_first_attempt_shown(pyinit_bin, tmp_path):
    events = [json.loads(line) for line in EVENTS.read_text().splitlines()]
    again = [dict(e, attempt=1, start=e["start"] + 100, end=e["end"] + 100)
             for e in events if e["event"] == "phase" and "rank" in e]  # fmt: skip
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events + again))
    done = timeline(pyinit_bin, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "restarted 1 time(s); the first attempt is shown" in done.stdout
    assert done.stdout.startswith((GOLDEN / "qemu-training.txt").read_text())


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no events.jsonl here: not a pyinit run folder"),
        ('{"event": "start"}\n', "the event log has no phases"),
        ('{"event": "phase"\n{"event": "end"}\n', "events.jsonl:1: malformed JSON"),
    ],
)
def test_bad_logs_are_one_line_and_exit_2(pyinit_bin, tmp_path, content, words):
    if content is not None:
        (tmp_path / "events.jsonl").write_text(content)
    done = timeline(pyinit_bin, tmp_path)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_chart(pyinit_bin, tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        done = timeline(pyinit_bin, EVENTS, "--png", tmp_path / "t.png")
        assert done.returncode == 2 and "pod-init[plots]" in done.stderr
        return
    done = timeline(pyinit_bin, EVENTS, "--png", tmp_path / "t.png")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_shows_the_start_not_the_steps(monkeypatch, tmp_path):
    """Scaled to the whole run, minutes of steps left the phases the chart is
    titled after as slivers."""
    pytest.importorskip("matplotlib")
    import pyinit.plotting
    from pyinit.analysis import timeline

    shown = {}

    def keep(fig, path):
        import matplotlib.pyplot as plt

        shown["xlim"] = fig.axes[0].get_xlim()
        plt.close(fig)
        return True

    monkeypatch.setattr(pyinit.plotting, "save_figure", keep)
    built = timeline.build(timeline.read_events(EVENTS))
    assert timeline.plot(built, tmp_path / "t.png")
    assert shown["xlim"] == pytest.approx((0, built.first_step_s * 1.15))
