"""A file that a worker appends its records to while the user's script runs
in the same process.

The script owns the process's descriptors: it may close every one it did
not open (``os.closerange(3, ...)``, as a daemon does) and then open files
of its own, which take the freed numbers. A record written to a number
that now names the script's file would corrupt that file, and closing it
at the end would close the script's file under it. So each write and the
close first check that the descriptor is still the file this process
opened (its device and inode, one ``fstat``); where it is not, the file is
opened again by its path and the records go on.

Imported by every worker before the training script: the standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path


def identity(fd: int) -> tuple[int, int] | None:
    """The device and inode of the file `fd` names; None where it is closed."""
    try:
        named = os.fstat(fd)
    except OSError:
        return None
    return named.st_dev, named.st_ino


class Appender:
    """An O_APPEND descriptor of `path`, one ``write()`` per record."""

    def __init__(self, path: Path):
        self.path = path
        self._open()

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._identity = identity(self.fd)

    def _ours(self) -> bool:
        return identity(self.fd) == self._identity

    def reopened(self) -> bool:
        """Opens the file again where its descriptor is no longer ours: True
        when it did (a holder of the old number must take the new one)."""
        if self._ours():
            return False
        self._open()
        return True

    def write(self, data: bytes) -> int:
        """One write of `data`; the count written (a full disk may take part)."""
        self.reopened()
        return os.write(self.fd, data)

    def truncate_by(self, count: int) -> None:
        """Cuts the last `count` bytes off a record just written in part."""
        os.ftruncate(self.fd, os.fstat(self.fd).st_size - count)

    def close(self) -> None:
        if self._ours():  # else the number is not ours to close
            os.close(self.fd)
