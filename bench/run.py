"""Runs a benchmark suite: the entries of one file under bench/suites/, in
order, each with a results folder of its own, then a table of what ran.

    python3 bench/run.py SUITE [--out DIR] [--only NAME,...] [--list]

SUITE is node (any Linux machine, no GPU), gpu (a node with one GPU or more)
or gpu2 (two GPUs or more), or the path of a suite file. Results go to
--out (default /var/tmp/pod-init-bench/SUITE-DATE-TIME), never into the
checkout: DIR/NAME/ holds an entry's files and its output (log.txt), and
DIR/suite.json what ran, how it ended and how long it took. The numbers worth
keeping are written up in bench/NOTES.md.

A suite file is INI: a section per entry, with
  run      the shell command (bash, from the checkout's root); $OUT is the
           entry's folder, $WORK a scratch folder removed afterwards, $BENCH
           this folder
  needs    what must be there, or the entry is skipped and says why: root,
           gpus:N (at least N NVIDIA GPUs), a command name, env:VARIABLE,
           python:MODULE
  timeout  seconds, a positive number (default 600)
  table    a regular expression for the first line of the entry's table: the
           driver shows its output from the last line that matches to the
           end (default: the last 12 lines); all of it is in DIR/NAME/log.txt
and an optional [suite] section whose `environment` (NAME=VALUE words) every
entry's command gets. An entry's name is a plain name (letters, digits, `_`,
`-`, `.`; not `suite.json`): it names the entry's folder under DIR.

An entry runs in a session of its own. When it ends, times out, or the
driver is interrupted (INT, TERM, HUP), whatever is left in that session is
sent TERM and, 5 s later, KILL, before its $WORK is removed: nothing of an
entry outlives it.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SUITES = BENCH / "suites"
SHOWN_LINES = 12  # of an entry's output, when it marks no table
DEFAULT_TIMEOUT = 600
GRACE_S = 5.0  # between TERM and KILL for what an entry leaves
ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RESERVED_NAMES = {"suite.json"}
NEED_KINDS = {"gpus", "env", "python"}  # NAME:VALUE needs; a plain word is root or a command


@dataclass
class Entry:
    name: str
    run: str
    needs: list[str]
    timeout: float
    table: re.Pattern[str] | None = None


@dataclass
class Outcome:
    name: str
    status: str  # ok, failed, timed out, skipped
    detail: str  # the exit status, or why it was skipped
    seconds: float


class SuiteError(ValueError):
    """A suite file that cannot be run as written: the message names it."""


def load_suite(path: Path) -> tuple[dict[str, str], list[Entry]]:
    parser = configparser.ConfigParser(interpolation=None)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SUITES.glob("*.ini")))
        raise SuiteError(f"{path}: no such suite file (bench/suites/ has {known})")
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except UnicodeDecodeError as e:
        raise SuiteError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                         f"{e.start})") from None  # fmt: skip
    except configparser.MissingSectionHeaderError as e:
        raise SuiteError(f"{path}:{e.lineno}: a line before any [section] header") from None
    except configparser.ParsingError as e:
        line = e.errors[0][0] if e.errors else 0
        raise SuiteError(f"{path}:{line}: not NAME = VALUE inside a [section]") from None
    except (OSError, configparser.Error) as e:
        raise SuiteError(f"{path}: {str(e).splitlines()[0]}") from None
    environment: dict[str, str] = {}
    if parser.has_section("suite"):
        try:
            words = shlex.split(parser.get("suite", "environment", fallback=""))
        except ValueError as e:
            raise SuiteError(f"{path}: [suite] environment: {str(e).lower()}") from None
        for word in words:
            name, equals, value = word.partition("=")
            if not equals or not name:
                raise SuiteError(f"{path}: [suite] environment: expected NAME=VALUE, not {word!r}")
            environment[name] = value
    entries = []
    for name in parser.sections():
        if name == "suite":
            continue
        where = f"{path}: [{name}]"
        if not ENTRY_NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise SuiteError(f"{where}: an entry's name is a plain name (letters, digits, _ - .), "
                             "not a path: it names the entry's results folder")  # fmt: skip
        section = parser[name]
        if "run" not in section:
            raise SuiteError(f"{where} has no run = COMMAND")
        try:
            timeout = float(section.get("timeout", DEFAULT_TIMEOUT))
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout <= 0:
            raise SuiteError(f"{where} timeout: must be a positive number of seconds, not "
                             f"{section.get('timeout')!r}")  # fmt: skip
        needs = section.get("needs", "").split()
        for need in needs:
            problem = need_problem(need)
            if problem:
                raise SuiteError(f"{where} needs {need!r}: {problem}")
        table = None
        if "table" in section:
            try:
                table = re.compile(section["table"])
            except re.error as e:
                raise SuiteError(f"{where} table: not a regular expression: {e}") from None
        entries.append(Entry(name, section["run"], needs, timeout, table))
    return environment, entries


def need_problem(need: str) -> str:
    """What is wrong with how a need is written ("" when nothing)."""
    kind, colon, what = need.partition(":")
    if not colon:
        return ""  # root, or a command's name
    if kind not in NEED_KINDS:
        return f"unknown kind {kind!r} (gpus:N, env:VARIABLE, python:MODULE, root or a command)"
    if kind == "gpus" and not what.isdigit():
        return "gpus: takes a whole number"
    if kind == "env" and not what:
        return "env: takes a variable's name"
    if kind == "python" and not all(part.isidentifier() for part in what.split(".")):
        return "python: takes a module's dotted name"
    return ""


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def missing(needs: list[str]) -> str:
    """What of `needs` this machine lacks, or ""."""
    for need in needs:
        kind, colon, what = need.partition(":")
        if need == "root" and os.geteuid() != 0:
            return "needs root"
        if kind == "gpus" and colon and gpu_count() < int(what):
            return f"needs {what} GPUs, found {gpu_count()}"
        if kind == "env" and colon and not os.environ.get(what):
            return f"needs ${what}"
        if kind == "python" and colon and not module_exists(what):
            return f"needs the Python module {what}"
        if not colon and need != "root" and shutil.which(need) is None:
            return f"needs {need}"
    return ""


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # its package is missing
        return False


class Interrupted(Exception):
    """The driver got INT, TERM or HUP: the running entry is ended first."""

    def __init__(self, number: int):
        super().__init__(signal.Signals(number).name)
        self.number = number


class Stops:
    """INT, TERM and HUP raise Interrupted, except while an entry's shell is
    being started: a signal then, before the shell is in the driver's hands
    to end, would leave it running. It is kept, and raised by
    `raise_held` once it can be ended."""

    def __init__(self) -> None:
        self.holding = False
        self.held = 0

    def handler(self, number: int, _frame: object) -> None:
        if self.holding:
            self.held = self.held or number
            return
        raise Interrupted(number)

    @contextlib.contextmanager
    def holding_back(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def raise_held(self) -> None:
        if self.held:
            raise Interrupted(self.held)


STOPS = Stops()


def end_session(shell: subprocess.Popen) -> None:
    """Everything left in the shell's session: TERM, then KILL after GRACE_S.
    The shell is reaped as soon as it ends: until then, as a zombie, it
    would keep its group alive to kill(2) and cost the whole grace."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(shell.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            shell.poll()
            try:
                os.killpg(shell.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_entry(entry: Entry, out: Path, environment: dict[str, str]) -> Outcome:
    why = missing(entry.needs)
    if why:
        return Outcome(entry.name, "skipped", why, 0.0)
    folder = out / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"pod-init-bench-{entry.name}-",
                                     dir="/var/tmp") as work, \
            open(folder / "log.txt", "w", encoding="utf-8") as log:  # fmt: skip
        env = {**os.environ, **environment, "OUT": str(folder), "WORK": work, "BENCH": str(BENCH)}
        with STOPS.holding_back():
            shell = subprocess.Popen(["bash", "-euo", "pipefail", "-c", entry.run], cwd=ROOT,
                                     env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        try:
            STOPS.raise_held()
            code = shell.wait(timeout=entry.timeout)
        except subprocess.TimeoutExpired:
            return Outcome(entry.name, "timed out", f"after {entry.timeout:g} s",
                           time.monotonic() - began)  # fmt: skip
        finally:  # the shell's session (its pid) ends with it, whatever it left running
            end_session(shell)
            shell.wait()
    seconds = time.monotonic() - began
    if code != 0:
        return Outcome(entry.name, "failed", f"exit {code}", seconds)
    return Outcome(entry.name, "ok", "", seconds)


def shown_lines(entry: Entry, output: str) -> list[str]:
    """What of an entry's output the driver shows: its table whole, from the
    last line its `table` pattern matches, else the last lines."""
    lines = output.splitlines(True)
    starts = [i for i, line in enumerate(lines) if entry.table and entry.table.search(line)]
    return lines[starts[-1] :] if starts else lines[-SHOWN_LINES:]


def suite_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix == ".ini" or path.exists() else SUITES / f"{name}.ini"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", metavar="SUITE", help="node, gpu, gpu2, or a suite file")
    parser.add_argument("--out", metavar="DIR", help="the results folder (outside the checkout)")
    parser.add_argument("--only", metavar="NAME,...", help="run these entries alone")
    parser.add_argument("--list", action="store_true", help="print the entries and exit")
    args = parser.parse_args(argv)
    path = suite_path(args.suite)
    try:
        environment, entries = load_suite(path)
    except SuiteError as e:
        print(f"bench/run.py: {e}", file=sys.stderr)
        return 2
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {e.name for e in entries})
        if unknown:
            print(f"bench/run.py: {path}: no entry {', '.join(unknown)}", file=sys.stderr)
            return 2
        entries = [e for e in entries if e.name in wanted]
    if args.list:
        for entry in entries:
            needs = f"  (needs {' '.join(entry.needs)})" if entry.needs else ""
            print(f"{entry.name}{needs}")
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"/var/tmp/pod-init-bench/{path.stem}-{stamp}").resolve()
    if out == ROOT or ROOT in out.parents:
        print(f"bench/run.py: --out {out} is inside the checkout: results go elsewhere "
              "(the numbers worth keeping, into bench/NOTES.md)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # writable: a read-only --out is said up front
            pass
    except OSError as e:
        print(f"bench/run.py: --out {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, STOPS.handler)
    outcomes = []
    for entry in entries:
        print(f"== {entry.name}", file=sys.stderr, flush=True)
        try:
            outcomes.append(run_entry(entry, out, environment))
        except Interrupted as stop:
            print(f"bench/run.py: {stop}: {entry.name} and what it started were ended",
                  file=sys.stderr)  # fmt: skip
            return 128 + stop.number
        log = out / entry.name / "log.txt"
        if log.exists():  # the entry's own table, where a person looks
            sys.stderr.writelines(shown_lines(entry, log.read_text(errors="replace")))
        print(f"== {entry.name}: {outcomes[-1].status} {outcomes[-1].detail}".rstrip(),
              file=sys.stderr, flush=True)  # fmt: skip
        document = {"suite": str(path), "date": time.strftime("%Y-%m-%d %H:%M"),
                    "machine": os.uname().nodename,
                    "entries": [asdict(o) for o in outcomes]}  # fmt: skip
        temporary = out / ".suite.json.tmp"
        temporary.write_text(json.dumps(document, indent=1) + "\n")
        os.replace(temporary, out / "suite.json")  # whole or the previous one
    print(f"{'entry':24} {'status':10} {'seconds':>8}  detail")
    for o in outcomes:
        print(f"{o.name:24} {o.status:10} {o.seconds:8.1f}  {o.detail}")
    print(f"results: {out}")
    return 1 if any(o.status in ("failed", "timed out") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
