"""The optional parts of pod-init and the pip extra that brings each: a
command that needs one that is missing says so in one line, before any work."""

from __future__ import annotations

import importlib.util
import sys

# module -> the extra of `pip install 'pod-init[EXTRA]'` that installs it
EXTRAS = {"torch": "train", "matplotlib": "plots", "tokenizers": "tokenizers", "cython": "dev"}


class MissingExtra(ImportError):
    """An optional package a command needs is not installed; the message says
    which extra brings it. `pyinit` exits 2 on it."""


def installed(module: str) -> bool:
    return module in sys.modules or importlib.util.find_spec(module) is not None


def require(module: str, command: str) -> None:
    """MissingExtra naming `command` and the extra when `module` is not installed."""
    if not installed(module):
        extra = EXTRAS[module]
        raise MissingExtra(f"{command} needs {module}: pip install 'pod-init[{extra}]'")


def note_missing(module: str, what: str, command: str) -> bool:
    """One line on stderr when `module` is missing and only `what` is left out
    (a plot, a comparison); True when it is installed."""
    if installed(module):
        return True
    extra = EXTRAS[module]
    print(f"{command}: {what} needs {module}: pip install 'pod-init[{extra}]'", file=sys.stderr)
    return False
