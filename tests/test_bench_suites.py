"""bench/run.py and the suite files: every entry names what exists, and the
driver runs, skips, times out and reports entries as it says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "bench" / "run.py"
sys.path.insert(0, str(ROOT / "bench"))
import run as driver  # noqa: E402


def test_every_suite_entry_names_what_exists():
    from pyinit.cli import COMMANDS

    bench_kinds = set(COMMANDS["bench"][0])
    suites = sorted((ROOT / "bench" / "suites").glob("*.ini"))
    assert {p.stem for p in suites} == {"node", "gpu", "gpu2"}
    for suite in suites:
        _, entries = driver.load_suite(suite)
        assert entries, suite
        for entry in entries:
            for script in re.findall(r"\$BENCH/([\w.]+)", entry.run):
                assert (ROOT / "bench" / script).is_file(), f"{suite.name} [{entry.name}]: {script}"
            for example in re.findall(r"(examples/[\w.]+)", entry.run):
                assert (ROOT / example).is_file(), f"{suite.name} [{entry.name}]: {example}"
            for kind in re.findall(r"pyinit bench \"?\$?(\w+)", entry.run):
                assert kind in bench_kinds or kind == "c", f"{suite.name} [{entry.name}]: {kind}"
            for test in re.findall(r"(tests/\w+\.py)", entry.run):
                assert (ROOT / test).is_file(), f"{suite.name} [{entry.name}]: {test}"


def test_the_driver_runs_skips_and_times_out(tmp_path):
    suite = tmp_path / "mine.ini"
    suite.write_text(
        "[suite]\nenvironment = GREETING=hello\n\n"
        '[ok]\nrun = echo "$GREETING" > "$OUT/said.txt"; touch "$WORK/scratch"\n'
        '      echo "$WORK" > "$OUT/work.txt"\n\n'
        "[fails]\nrun = echo broken; exit 3\n\n"
        "[skipped]\nneeds = no-such-command-here env:POD_INIT_NO_SUCH_VARIABLE\nrun = true\n\n"
        "[slow]\ntimeout = 0.5\nrun = sleep 30\n"
    )
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, DRIVER, suite, "--out", out], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    document = json.loads((out / "suite.json").read_text())
    outcomes = {e["name"]: (e["status"], e["detail"]) for e in document["entries"]}
    assert outcomes == {"ok": ("ok", ""), "fails": ("failed", "exit 3"),
                        "skipped": ("skipped", "needs no-such-command-here"),
                        "slow": ("timed out", "after 0.5 s")}  # fmt: skip
    assert (out / "ok" / "said.txt").read_text() == "hello\n"
    assert not Path((out / "ok" / "work.txt").read_text().strip()).exists()  # scratch removed
    assert "broken" in (out / "fails" / "log.txt").read_text()
    assert "broken" in done.stderr  # the entry's output, shown as it ends
    assert re.search(r"^fails +failed .* exit 3$", done.stdout, re.M), done.stdout


def test_bad_suites_and_results_inside_the_checkout_are_one_line(tmp_path):
    bad = tmp_path / "bad.ini"
    bad.write_text("[nothing]\nneeds = root\n")
    cases = [
        ([bad], "bad.ini: [nothing] has no run = COMMAND"),
        (["nosuch"], "no such suite file (bench/suites/ has gpu, gpu2, node)"),
        (["node", "--only", "nope"], "node.ini: no entry nope"),
        (["node", "--out", ROOT / "bench" / "results"], "is inside the checkout"),
    ]
    for args, message in cases:
        done = subprocess.run([sys.executable, DRIVER, *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (ROOT / "bench" / "results").exists()
