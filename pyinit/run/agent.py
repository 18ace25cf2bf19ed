"""torchrun's own elastic agent, started by ``pyinit run`` with two marks in
the run's event log: the interpreter's start and ``import torch``, the largest
single cost before the first step. Everything after is torchrun's ``main``
with the arguments given (rendezvous, restarts, signals, log options)::

    python -P -m pyinit.run.agent [torchrun options] --run-path WORKER ARGS...

Importing torch here, once, is what lets the workers be forked with torch
already loaded (see ``pyinit.run.wrapper``). The rendezvous is the ``pyinit``
backend (``pyinit.run.store``), on the socket pyinit run bound. What the agent
itself says (torchrun's log lines, its tracebacks, its logging errors while a
job is cancelled) goes to ``RUN_DIR/agent.log``, not the terminal: pyinit
run's own lines say how the run went, and the workers' output (the script's
prints and its own traceback) still goes where pyinit run's went.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from pyinit.jsonfile import write_json
from pyinit.run.events import RUN_DIR_ENV, EventLog, boottime, process_start

FAILURES_FILE = "failures.json"
AGENT_LOG = "agent.log"

# torch's own switch for a CUDA check that does not initialise CUDA: torchrun's
# LaunchConfig asks torch.cuda.is_available(), which otherwise runs cuInit in the
# agent, and a CUDA-initialised parent cannot fork workers that use CUDA. The
# workers inherit it; their availability check then asks NVML, as torch documents.
FORK_SAFE_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def main() -> None:
    entered = boottime()
    os.environ.setdefault(FORK_SAFE_CUDA_CHECK, "1")
    folder = os.environ.get(RUN_DIR_ENV)
    if folder:
        # Before torch is imported: its loggers' handlers take sys.stderr as it is
        # then. The workers' fd 2 is still the terminal (see the wrapper).
        sys.stderr = open(Path(folder, AGENT_LOG), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    log = EventLog.for_run(node=int(os.environ.get("PYINIT_NODE_RANK", "0")))
    start = boottime()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from pyinit.run import store

    store.register_handler(str(Path(folder, "status")) if folder else None)
    if log is not None:
        log.phase("agent start", process_start(), entered)
        log.phase("agent import torch", start, boottime())
        log.close()
    try:
        torchrun.main(sys.argv[1:])
    except ChildFailedError as failed:
        record_failures(failed)
        raise


def record_failures(failed: Any) -> None:
    """torchrun's record of each failed worker (rank, pid, exit code, the
    signal that killed it, when), for pyinit run to name the first: a worker
    killed by a signal leaves no record of its own."""
    folder = os.environ.get(RUN_DIR_ENV)
    if not folder:
        return
    records = [
        {"rank": rank, "local_rank": f.local_rank, "pid": f.pid, "exit": f.exitcode,
         "signal": f.signal_name() if f.exitcode < 0 else None, "time": float(f.timestamp)}
        for rank, f in failed.failures.items()
    ]  # fmt: skip
    with contextlib.suppress(OSError):  # a full disk: pyinit run falls back on torchrun's status
        write_json(Path(folder) / "status" / FAILURES_FILE, records)


if __name__ == "__main__":
    main()
