"""Which build of the data path's loops runs: the compiled one (``_kernels``,
imported in preference to its source), or, to measure what compiling buys,
the same source run as plain Python. The data package swaps its own modules'
loops here, so nothing outside it reaches into them."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from pyinit.data import _kernels

# The modules of this package that call the loops.
_CALLERS = ("pyinit.data.sharder", "pyinit.data.dataset")


def compiled() -> ModuleType:
    return _kernels


def plain() -> ModuleType:
    """pyinit/data/_kernels.py run as plain Python: the same loops, not
    compiled (its source imports Cython's pure Python mode: needs cython)."""
    # Beside this file (an editable install keeps the compiled module elsewhere).
    path = Path(__file__).with_name("_kernels.py")
    spec = importlib.util.spec_from_file_location("pyinit_kernels_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def using(module: ModuleType) -> Iterator[None]:
    """The package's sharder and dataset (those imported) run `module`'s loops
    inside the block."""
    callers = [sys.modules[name] for name in _CALLERS if name in sys.modules]
    for caller in callers:
        caller._kernels = module
    try:
        yield
    finally:
        for caller in callers:
            caller._kernels = _kernels
