"""``pyinit run``: its settings (``config``: the options, their environment
fallbacks, ``RunConfig``), the launcher (``launcher``: prepare, launch,
conclude), the nodes (``nodes``) and their liveness port (``liveness``), the
checks before it starts (``preflight``), the watches (``stall``) and the
wrapper each worker runs the script in (``worker``). ``run(config)`` takes a
``RunConfig`` from ``config.config_from_args``."""

import importlib

__all__ = ["run"]


def __getattr__(name: str):
    # Loaded on first use, so `python -m pyinit.run.wrapper` in every worker pays nothing for it.
    if name == "run":
        return importlib.import_module("pyinit.run.launcher").run
    raise AttributeError(f"module 'pyinit.run' has no attribute {name!r}")
