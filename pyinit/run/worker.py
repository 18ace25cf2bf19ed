"""What torchrun starts for `pyinit run`: the user's script (as ``__main__``),
module (as ``python -m`` runs it) or program, with its exit status written
down, because torchrun reports a failed worker as its own exit status 1 and the
script's own code is lost; and a mark per attempt, so restarts show without
parsing torchrun's log.

    python -m pyinit.run.worker STATUS_DIR script|module|program NAME [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

from pyinit import _native
from pyinit.jsonfile import write_json


def _record(status_dir: Path, code: int) -> None:
    rank = os.environ.get("RANK", "0")
    write_json(status_dir / f"rank-{rank}.json", {"rank": int(rank), "exit": code}, indent=None)


def _run_program(argv: list[str]) -> int:
    """A program as a child: TERM, INT and HUP passed on, its status returned
    as a shell gives it (128+N for signal N)."""
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    return 128 - code if code < 0 else code


def main() -> None:
    # torchrun's agent is the parent: if it dies (even by KILL), so does this worker.
    _native.die_with_parent(signal.SIGKILL, os.getppid())
    status_dir, kind, name, *args = sys.argv[1:]
    # torchrun counts its restarts of the worker group; pyinit run watches for new attempts.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (Path(status_dir) / f"attempt-{attempt}").touch()
    try:
        if kind == "program":
            sys.exit(_run_program([name, *args]))
        sys.argv = [name, *args]
        if kind == "module":
            # As `python -m` does, the working directory's modules are importable; last,
            # so a checkout of pod-init there cannot shadow the installed package.
            sys.path.append(os.getcwd())
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(name).resolve().parent))
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        _record(Path(status_dir), code)
        raise
    except BaseException:
        _record(Path(status_dir), 1)
        raise
    _record(Path(status_dir), 0)


if __name__ == "__main__":
    main()
