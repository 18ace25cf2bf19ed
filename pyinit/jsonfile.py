"""JSON files that are whole or absent, and input files read defensively.

``write_json`` writes under a temporary name beside the target (its folder
made as needed), syncs it, renames it over the target and syncs the folder, so
neither a reader nor a crash meets half a document. ``parse_json`` reads text
from a file we do not control: malformed JSON, nesting deeper than the
interpreter can follow, and NaN or Infinity all become one ``ValueError``
saying what and where, never a traceback. ``read_input`` is how every file a
user names is read (a hostfile, thresholds, a tuning table, a replay): the
reader that refuses a FIFO, pipe or device at once instead of blocking on it,
and reads a regular file to its end (the core's ``load_input_file`` does the
same for pod-init, with the same message)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from pyinit.errors import InputError

# What an input that is not a regular file is, as the message names it.
KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO or pipe"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"))  # fmt: skip


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, as a message names it."""
    return next((name for test, name in KINDS if test(mode)), "something else")


def not_regular(mode: int) -> str:
    """The one line for an input whose mode is not a regular file's."""
    return f"{kind_of(mode)}, not a regular file: give the path of a file to read"


def open_input(path: str | os.PathLike[str], block_devices: bool = False) -> BinaryIO:
    """A user's input file, open for reading: InputError naming it for a FIFO,
    pipe or device (a block device is taken with `block_devices`; opened
    without blocking, so a FIFO without a writer is refused, not waited on);
    OSError (with ``filename``) when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or (block_devices and stat.S_ISBLK(mode))):
            message = (f"{kind_of(mode)}, not a file or block device to read" if block_devices
                       else not_regular(mode))  # fmt: skip
            raise InputError(message, file=os.fsdecode(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike[str], limit: int = 16 << 20) -> bytes:
    """A user's input file, whole (``open_input``); InputError past `limit` bytes."""
    with open_input(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"larger than {limit >> 20} MiB", file=os.fsdecode(path))
    return data


def read_input_text(path: str | os.PathLike[str], limit: int = 16 << 20) -> str:
    """``read_input`` as text; bytes that are not UTF-8 stay as escapes
    (surrogateescape), so the parser, not the codec, names what is wrong."""
    return read_input(path, limit).decode("utf-8", errors="surrogateescape")


def write_json(path: str | os.PathLike[str], document: Any, indent: int | None = 1) -> Path:
    return write_text(path, json.dumps(document, indent=indent) + "\n")


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Writes text whole or not at all (see write_bytes)."""
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o666) -> Path:
    """Writes bytes whole or not at all (a temporary name, fsync, rename),
    created with `mode` less the umask."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except OSError as e:
        _discard(temp)
        # The file the user named, not the temporary one; and a buffered
        # write's error (a full disk) names none.
        raise OSError(e.errno, e.strerror, str(target)) from e
    except BaseException:
        _discard(temp)
        raise
    sync_directory(target.parent)
    return target


def _discard(temp: Path) -> None:
    """Removes a temporary file a failed write left, if any and if it can:
    on a read-only filesystem there is none, and unlink fails too."""
    with contextlib.suppress(OSError):
        temp.unlink()


def sync_directory(path: str | os.PathLike[str]) -> None:
    """Makes the renames in a folder durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MalformedJson(ValueError):
    """Text that is not one JSON value; ``line`` where it goes wrong (0: unknown)."""

    def __init__(self, reason: str, line: int = 0):
        super().__init__(reason)
        self.line = line


def _no_constant(name: str) -> Any:
    raise MalformedJson(f"{name} is not a JSON number")


# One decoder, made once: json.loads(text, parse_constant=...) would build a new
# one per call, which costs the sharder a fifth of its speed on short lines.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def parse_json(text: str) -> Any:
    """One JSON value; MalformedJson (a ValueError) with the reason and line."""
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise MalformedJson(f"malformed JSON: {e.msg} (column {e.colno})", e.lineno) from None
    except RecursionError:
        raise MalformedJson("malformed JSON: nested too deeply") from None
    except UnicodeEncodeError:
        raise MalformedJson("malformed JSON: bytes that are not UTF-8") from None


def load_json(text: str, source: str) -> Any:
    """``parse_json`` for a whole file: InputError naming it and the line."""
    try:
        return parse_json(text)
    except MalformedJson as e:
        raise InputError(str(e), file=source, line=e.line) from None
