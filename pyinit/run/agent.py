"""torchrun's own elastic agent, started by ``pyinit run`` with two marks in
the run's event log: the interpreter's start and ``import torch``, the largest
single cost before the first step. Everything after is torchrun's ``main``
with the arguments given (rendezvous, restarts, signals, log options)::

    python -P -m pyinit.run.agent [torchrun options] --run-path WORKER ARGS...

Importing torch here, once, is what lets the workers be forked with torch
already loaded (see ``pyinit.run.worker``).
"""

from __future__ import annotations

import os
import sys

from pyinit.run.events import EventLog, boottime, process_start

# torch's own switch for a CUDA check that does not initialise CUDA: torchrun's
# LaunchConfig asks torch.cuda.is_available(), which otherwise runs cuInit in the
# agent, and a CUDA-initialised parent cannot fork workers that use CUDA. The
# workers inherit it; their availability check then asks NVML, as torch documents.
FORK_SAFE_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def main() -> None:
    entered = boottime()
    os.environ.setdefault(FORK_SAFE_CUDA_CHECK, "1")
    log = EventLog.for_run(node=int(os.environ.get("PYINIT_NODE_RANK", "0")))
    start = boottime()
    from torch.distributed import run as torchrun

    if log is not None:
        log.phase("agent start", process_start(), entered)
        log.phase("agent import torch", start, boottime())
        log.close()
    torchrun.main(sys.argv[1:])


if __name__ == "__main__":
    main()
