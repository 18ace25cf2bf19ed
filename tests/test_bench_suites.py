"""bench/run.py and the suite files: every entry names what exists, and the
driver runs, skips, times out and reports entries as it says."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_the_driver_shows_an_entry_s_table_whole(tmp_path):
    suite = tmp_path / "tables.ini"
    # A long run-up, then a table of 30 rows: the marked one is shown from its
    # header down; the unmarked one as its last lines, the rest in log.txt.
    body = 'for i in $(seq 40); do echo "run-up $i"; done; echo "tool   GB/s"; seq 30\n'
    suite.write_text(f"[marked]\ntable = ^tool +GB/s\nrun = {body}\n[plain]\nrun = {body}")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, DRIVER, suite, "--out", out], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    marked = done.stderr.split("== marked\n")[1].split("== marked:")[0]
    assert marked.splitlines() == ["tool   GB/s", *map(str, range(1, 31))]
    plain = done.stderr.split("== plain\n")[1].split("== plain:")[0]
    assert plain.splitlines() == [str(i) for i in range(19, 31)]
    assert "run-up 1\n" in (out / "plain" / "log.txt").read_text()
    bad = tmp_path / "bad.ini"
    bad.write_text("[x]\ntable = (\nrun = true\n")
    done = subprocess.run([sys.executable, DRIVER, bad, "--out", out], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "[x] table: not a regular expression" in done.stderr


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


def alive(marker: str) -> list[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


# Each leaves something running past its shell: a pipeline, a background job
# waited for, a child that ignores TERM (ended by the KILL after the grace).
LEFT_RUNNING = {
    "piped": "sleep 3021 | cat",
    "waited": "sleep 3031 & wait",
    "stubborn": "bash -c 'trap \"\" TERM; sleep 3041; true' & wait",
    "plain": "sleep 3011; true",
}


def test_a_timed_out_entry_leaves_nothing_running(tmp_path):
    suite = tmp_path / "mine.ini"
    suite.write_text("".join(f"[{name}]\ntimeout = 0.5\nrun = {command}\n\n"
                             for name, command in LEFT_RUNNING.items()))  # fmt: skip
    done = subprocess.run([sys.executable, DRIVER, suite, "--out", tmp_path / "out"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert [alive(f"sleep {n}") for n in (3011, 3021, 3031, 3041)] == [[], [], [], []]


def test_a_signal_to_the_driver_ends_the_running_entry_first(tmp_path):
    suite = tmp_path / "mine.ini"
    suite.write_text("[long]\nrun = sleep 3051 | cat\n\n[never]\nrun = touch $OUT/ran\n")
    driver_run = subprocess.Popen([sys.executable, DRIVER, suite, "--out", tmp_path / "out"],
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not alive("sleep 3051") and time.monotonic() < deadline:
        time.sleep(0.05)
    driver_run.send_signal(signal.SIGTERM)
    _, err = driver_run.communicate(timeout=60)
    assert driver_run.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: long and what it started were ended" in err
    assert alive("sleep 3051") == [] and not (tmp_path / "out" / "never").exists()


def test_a_signal_while_an_entry_starts_is_held_until_its_shell_can_be_ended():
    # Between the fork and Popen's return the driver has no shell to end: a
    # TERM there left the entry running (seen once in CI). It is held, then raised.
    stops = driver.Stops()
    with stops.holding_back():
        stops.handler(signal.SIGTERM, None)  # no raise here
        stops.handler(signal.SIGINT, None)  # the first one is the one said
    with pytest.raises(driver.Interrupted) as raised:
        stops.raise_held()
    assert raised.value.number == signal.SIGTERM
    with pytest.raises(driver.Interrupted):
        stops.handler(signal.SIGHUP, None)


BAD_SUITES = [
    ("[../../x]\nrun = true\n", "[../../x]: an entry's name is a plain name"),
    ("[/abs/path]\nrun = true\n", "[/abs/path]: an entry's name is a plain name"),
    ("[suite.json]\nrun = true\n", "[suite.json]: an entry's name is a plain name"),
    ("[a]\ntimeout = -1\nrun = true\n", "[a] timeout: must be a positive number of seconds"),
    ("[a]\ntimeout = 0\nrun = true\n", "[a] timeout: must be a positive number of seconds"),
    ("[a]\ntimeout = nan\nrun = true\n", "not 'nan'"),
    ("[a]\nneeds = gpus:many\nrun = true\n", "needs 'gpus:many': gpus: takes a whole number"),
    ("[a]\nneeds = gpus:\nrun = true\n", "needs 'gpus:': gpus: takes a whole number"),
    ("[a]\nneeds = python:.foo\nrun = true\n", "python: takes a module's dotted name"),
    ("[a]\nneeds = disk:fast\nrun = true\n", "needs 'disk:fast': unknown kind 'disk'"),
    ("run = true\n", ":1: a line before any [section] header"),
    ("[suite]\nenvironment = A='x\n[a]\nrun = true\n", "environment: no closing quotation"),
]


def test_a_bad_suite_is_one_line_and_exit_2(tmp_path):
    for number, (text, said) in enumerate(BAD_SUITES):
        suite = tmp_path / f"s{number}.ini"
        suite.write_text(text)
        done = subprocess.run([sys.executable, DRIVER, suite, "--out", tmp_path / f"out{number}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (text, done.stderr)
        assert said in done.stderr, (text, done.stderr)
    assert not (tmp_path / "x").exists() and not Path("/abs/path").exists()
    binary = tmp_path / "binary.ini"
    binary.write_bytes(b"[a]\nrun = echo \xff\n")
    plain = tmp_path / "plain.ini"
    plain.write_text("[a]\nneeds = python:no_such_package_here.sub\nrun = true\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for suite, out, said in (
        (binary, tmp_path / "o1", "not UTF-8 text (byte 0xff"),
        (plain, a_file, "--out"),
        (plain, a_file / "under", "--out"),
    ):
        done = subprocess.run([sys.executable, DRIVER, suite, "--out", out], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert said in done.stderr
    # A missing module, even one under a missing package, is a skip.
    done = subprocess.run([sys.executable, DRIVER, plain, "--out", tmp_path / "o2"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "needs the Python module no_such_package_here.sub" in done.stdout
