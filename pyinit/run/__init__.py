"""``pyinit run``: the launcher (``launcher``: nodes, NCCL files, torchrun,
signals, the event log), the checks before it starts (``preflight``) and the
wrapper each worker runs the script in (``worker``)."""

import importlib

__all__ = ["run"]


def __getattr__(name: str):
    # Loaded on first use, so `python -m pyinit.run.worker` in every worker pays nothing for it.
    if name == "run":
        return importlib.import_module("pyinit.run.launcher").run
    raise AttributeError(f"module 'pyinit.run' has no attribute {name!r}")
