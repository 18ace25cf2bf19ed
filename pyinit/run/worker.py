"""What torchrun starts for `pyinit run`: the user's script, run as
``__main__``, with its exit status written down, because torchrun reports a
failed worker as its own exit status 1 and the script's own code is lost;
and a mark per attempt, so restarts show without parsing torchrun's log.

    python -m pyinit.run.worker STATUS_DIR SCRIPT [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from pyinit import _native
from pyinit.jsonfile import write_json


def _record(status_dir: Path, code: int) -> None:
    rank = os.environ.get("RANK", "0")
    write_json(status_dir / f"rank-{rank}.json", {"rank": int(rank), "exit": code}, indent=None)


def main() -> None:
    # torchrun's agent is the parent: if it dies (even by KILL), so does this worker.
    _native.die_with_parent(signal.SIGKILL, os.getppid())
    status_dir, script, *args = sys.argv[1:]
    # torchrun counts its restarts of the worker group; pyinit run watches for new attempts.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (Path(status_dir) / f"attempt-{attempt}").touch()
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
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
