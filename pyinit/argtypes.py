"""Argument types for every command line in the package (``pyinit`` and its
benchmarks): each value is checked where it is parsed, against a stated range,
so bad usage is one line and exit 2 before any work or any output."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def whole(low: int, high: int) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def seconds(low: float, high: float, *, zero: bool = False) -> Callable[[str], float]:
    """A finite number of seconds from ``low`` to ``high`` (also 0 with ``zero``: off)."""
    return number(low, high, zero=zero, what="a number of seconds")


def number(
    low: float, high: float, *, zero: bool = False, what: str = "a number"
) -> Callable[[str], float]:
    """A finite number from ``low`` to ``high`` (also 0 with ``zero``: off)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if zero and value == 0:
            return 0.0
        if not (math.isfinite(value) and low <= value <= high):
            also = " (or 0 for off)" if zero else ""
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}{also}, not {text}")
        return value

    parse.__name__ = what.split()[-1]
    return parse


def size(low: int = 1, high: int = 1 << 50) -> Callable[[str], int]:
    """A byte count such as 4096, 64K, 1G (binary units), from ``low`` to ``high``."""

    def parse(text: str) -> int:
        number, unit = text.strip().upper().rstrip("IB"), ""
        if number and number[-1] in _UNITS:
            number, unit = number[:-1], number[-1]
        try:
            value = int(float(number) * _UNITS[unit])
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64K, 1G)") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high} bytes, not {text}")
        return value

    parse.__name__ = "size"
    return parse


REPLAY_HELP = "NVML answers recorded by `pyinit nvml --record` instead of the driver"


def add_machine_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that looks at the machine shares, declared
    once: the sysfs tree (a fixture instead of /sys), and NVML off or replayed."""
    parser.add_argument("--sysfs-root", default="/sys", metavar="DIR",
                        help="the sysfs tree to read (a fixture)")  # fmt: skip
    parser.add_argument("--no-nvml", action="store_true", help="sysfs only, even with a driver")
    parser.add_argument("--nvml-replay", metavar="FILE", help=REPLAY_HELP)
