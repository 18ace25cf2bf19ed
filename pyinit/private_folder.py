"""A folder of this user's that nobody else may enter: where pyinit keeps
what another user could turn against this one (the warm interpreter's
socket, the bytecode cache's compiled modules)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path


def checked(path: Path, create: bool, what: str) -> Path | None:
    """`path` when it is a folder of this user's that nobody else may enter
    (created 0700 when asked and missing); None when it is missing.
    PermissionError naming it and `what` it is for otherwise: another user's
    folder, or a mode that lets others in, is where someone else could put a
    file of theirs."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        why = "not a folder"
    elif info.st_uid != os.geteuid():
        why = f"owned by uid {info.st_uid}, not {os.geteuid()}"
    elif info.st_mode & 0o077:
        why = f"mode {stat.S_IMODE(info.st_mode):04o} lets others in (0700 wanted)"
    else:
        return path
    raise PermissionError(errno.EACCES, f"{what} is refused: {why}", str(path))
