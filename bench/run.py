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
  timeout  seconds (default 600)
and an optional [suite] section whose `environment` (NAME=VALUE words) every
entry's command gets.
"""

from __future__ import annotations

import argparse
import configparser
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SUITES = BENCH / "suites"
DEFAULT_TIMEOUT = 600


@dataclass
class Entry:
    name: str
    run: str
    needs: list[str]
    timeout: float


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
    except (OSError, configparser.Error) as e:
        raise SuiteError(f"{path}: {e}") from None
    environment: dict[str, str] = {}
    if parser.has_section("suite"):
        for word in shlex.split(parser.get("suite", "environment", fallback="")):
            name, equals, value = word.partition("=")
            if not equals or not name:
                raise SuiteError(f"{path}: [suite] environment: expected NAME=VALUE, not {word!r}")
            environment[name] = value
    entries = []
    for name in parser.sections():
        if name == "suite":
            continue
        section = parser[name]
        if "run" not in section:
            raise SuiteError(f"{path}: [{name}] has no run = COMMAND")
        try:
            timeout = float(section.get("timeout", DEFAULT_TIMEOUT))
        except ValueError:
            raise SuiteError(f"{path}: [{name}] timeout: not a number of seconds") from None
        entries.append(Entry(name, section["run"], section.get("needs", "").split(), timeout))
    return environment, entries


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
        if kind == "python" and colon and importlib.util.find_spec(what) is None:
            return f"needs the Python module {what}"
        if not colon and need != "root" and shutil.which(need) is None:
            return f"needs {need}"
    return ""


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
        try:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", entry.run], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=entry.timeout,
                                  start_new_session=True)  # fmt: skip
        except subprocess.TimeoutExpired:
            return Outcome(entry.name, "timed out", f"after {entry.timeout:g} s",
                           time.monotonic() - began)  # fmt: skip
    seconds = time.monotonic() - began
    if done.returncode != 0:
        return Outcome(entry.name, "failed", f"exit {done.returncode}", seconds)
    return Outcome(entry.name, "ok", "", seconds)


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
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for entry in entries:
        print(f"== {entry.name}", file=sys.stderr, flush=True)
        outcomes.append(run_entry(entry, out, environment))
        log = out / entry.name / "log.txt"
        if log.exists():  # the entry's own table, where a person looks
            sys.stderr.writelines(log.read_text(errors="replace").splitlines(True)[-12:])
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
