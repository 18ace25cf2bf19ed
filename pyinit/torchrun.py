"""torchrun for the ranks pod-init starts itself (the collective benchmarks,
NCCL tuning's measurements): ``python -m pyinit.torchrun ARGS`` is
``torchrun ARGS``, but stopped by a signal it ends its workers, as torchrun
does, and then exits 128+N without its traceback of the signal.

The command that started it stops it with TERM (pyinit.termination), and
torchrun's own answer, passing the signal on to workers it started in
sessions of their own, is the only way those workers end with it.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run.main(argv)
    except SignalException as stopped:  # its workers are stopped; torchrun has said so
        return 128 + int(stopped.sigval)
    return 0


def command(argv: list[str]) -> list[str]:
    """The command line that runs torchrun with `argv` as this module."""
    return [sys.executable, "-m", "pyinit.torchrun", *argv]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
