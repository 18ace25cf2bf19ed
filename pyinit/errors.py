"""What pod-init raises, and the exit status each failure means.

A failing system call is an ``OSError`` of the matching subclass
(``FileNotFoundError``, ``PermissionError``, ...) with ``filename`` set to the
path it failed on and a message naming the operation. Bad input (an option, a
file's content) is an :class:`InputError`, a ``ValueError`` naming the file and
line. Both commands, ``pod-init`` and ``pyinit``, exit with the statuses below.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # a system call failed, or the node is unhealthy (an error finding)
EXIT_USAGE = 2  # bad usage or bad content: the message names the option, file and line
EXIT_STALLED = 124  # pyinit run ended its workers for a stall (as timeout(1) exits)

# Each status a command can return, as its --help lists it.
_STATUS_LINES = {
    "0": "  0    success",
    "1": "  1    a system call failed (the message names the file and the errno text), or the\n"
    "       node is unhealthy (a finding of severity error, a failed preflight)",
    "2": "  2    bad usage or bad content (the message names the option, or the file and line)",
    "N": "  N    a supervised command's own status (pod-init -- CMD, pyinit run); 128+N when\n"
    "       signal N ended it, 127 when it was not found, 126 when it could not be run",
    "124": "  124  pyinit run --stall-timeout: a rank made no step for that long, and the run\n"
    "       ended (its stall event names the rank and where it was)",
}


def exit_status_help(*codes: str) -> str:
    """The exit-status table of a command that returns `codes` (keys of _STATUS_LINES)."""
    return "\n".join(["exit status:", *(_STATUS_LINES[code] for code in codes)])


# The whole table, printed by `pyinit --help` and `pod-init --help` and kept in
# the README (tests/test_errors.py holds all three to this text); each command's
# own --help lists only the statuses it can return (COMMAND_STATUSES).
EXIT_STATUS_HELP = exit_status_help(*_STATUS_LINES)
COMMAND_STATUSES = {"run": ("0", "1", "2", "N", "124")}
PLAIN_STATUSES = ("0", "1", "2")


def printable(text: str) -> str:
    """Text for a terminal: control characters, and bytes that were not UTF-8
    (surrogate escapes), as ``\\xNN``, the way pod-init's C++ prints them, so
    a hostile value (a node list holding ESC) cannot drive the terminal."""
    return "".join(
        f"\\x{ord(c) & 0xFF:02x}"
        if ord(c) < 0x20 or ord(c) == 0x7F or 0xDC80 <= ord(c) <= 0xDCFF
        else c
        for c in text
    )


def as_utf8(text: str) -> str:
    """Text that can be written as UTF-8: bytes that were not UTF-8 (a file
    name's, kept by Python as surrogate escapes) shown as ``\\xNN``, every
    other character kept (a report's lines stay lines)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class InputError(ValueError):
    """Bad input from the user: ``str()`` is ``FILE:LINE: message`` (or less
    where there is no file or line); ``file``, ``line`` and ``message`` keep
    the parts."""

    def __init__(self, message: str, *, file: str = "", line: int = 0):
        self.file = file
        self.line = line
        self.message = message
        where = f"{file}:{line}: " if file and line else f"{file}: " if file else ""
        super().__init__(where + message)
