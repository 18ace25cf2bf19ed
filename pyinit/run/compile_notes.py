"""What forked workers tell the process they were forked from about their
compiles, in one page of memory that it shares with every process it forks:
whether one has compiled, and, per command and local rank, the GPU whose
graphs went past AOTAutograd's cache at the first step.

- The warm interpreter a first ``pyinit run`` leaves behind imports the
  compile set (``pyinit.run.preload.COMPILE_PRELOAD_STEPS``) only once a
  worker forked from it has started a compile: on a node that runs eager
  scripts alone those imports would only take the CPU from the launches that
  come meanwhile (on a 2-core VM the second launch of the day 0.37 s against
  0.30 s).
- A worker whose first step went past AOTAutograd's cache (a graph torch
  will not cache, traced at every start: with ``PYINIT_DDP_AOT_CACHE=off``,
  DDP's pieces of a compiled model, ``pyinit.run.ddp_pieces``) writes down its
  GPU, and the next start of the same command on this node, a restart from
  the same agent or the next launch from the same warm interpreter, sets
  inductor's patterns up for it beside its own start-up
  (``pyinit.run.pattern_setup``). A command's next start that compiles no
  such graph clears it, so a stale note costs one start at most. The page
  holds 84 notes (of 4 KiB): a command's digest chooses the slot of its local
  rank 0, and its other local ranks take the slots after it, so that the ranks
  of one job never meet one another. Two commands that meet in a slot take it
  from each other, which costs a start its head start, never its correctness.

The page is a shared anonymous mapping, made before the first fork (by the
warm interpreter, or by a cold agent for its workers), so every keeper,
agent and worker forked from that process writes the same memory, with no
file and no message, and nothing of it outlives that process. A worker not
forked from one has no mapping: it notes and finds nothing.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

COMPILED_AT = 0  # the byte set at a worker's first compile
SLOTS_AT = 64
KEY_BYTES, DEVICE_BYTES = 16, 32  # a command's and local rank's digest; "cuda:N", NUL-padded
SLOT = KEY_BYTES + DEVICE_BYTES
SLOTS = (mmap.PAGESIZE - SLOTS_AT) // SLOT  # 84 on a 4 KiB page
NO_KEY = bytes(KEY_BYTES)

_shared: mmap.mmap | None = None


def share() -> None:
    """The page, made in this process before it forks workers or agents; one
    inherited from the process this one was forked from is kept, so that its
    notes reach that process too."""
    global _shared
    if _shared is None:
        _shared = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED | MAP_ANONYMOUS


def note() -> None:
    """A worker's first compile."""
    if _shared is not None:
        _shared[COMPILED_AT] = 1


def seen() -> bool:
    """Whether a worker forked from here has compiled."""
    return _shared is not None and _shared[COMPILED_AT] == 1


def command_key(kind: str, name: str, args: Sequence[str],
                environ: Mapping[str, str] = os.environ) -> bytes:  # fmt: skip
    """What makes two starts the same job on this node: the script (its
    resolved path) or module or program, its arguments, the folder it runs
    in and the GPUs it may see."""
    try:
        target = str(Path(name).resolve()) if kind == "script" else name
        folder = os.getcwd()
    except OSError:  # the working folder is gone: nothing to match a later start with
        return NO_KEY
    parts = (kind, target, *args, folder, environ.get("CUDA_VISIBLE_DEVICES", "*"))
    text = "\0".join(parts).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(text, digest_size=KEY_BYTES).digest()


def _slot(key: bytes, local_rank: int) -> tuple[int, bytes] | None:
    """Where the note of the command `key`'s `local_rank` goes, and what
    names it there: the command's digest places its local rank 0 and the
    others follow it, so jobs taking turns on a node keep their notes unless
    two of them meet, and a job's own ranks (up to 84) never do."""
    if _shared is None or key == NO_KEY:
        return None
    name = hashlib.blake2b(key + local_rank.to_bytes(8, "little", signed=True),
                           digest_size=KEY_BYTES).digest()  # fmt: skip
    first = int.from_bytes(key[:4], "little")
    return SLOTS_AT + (first + local_rank) % SLOTS * SLOT, name


def remember_device(key: bytes, local_rank: int, device: str | None) -> None:
    """`device` ("cuda:0") as the one the command `key`'s `local_rank`
    compiled past AOTAutograd's cache on; None forgets it, and only it."""
    found = _slot(key, local_rank)
    if found is None or _shared is None:
        return
    at, name = found
    if device is None:
        if _shared[at : at + KEY_BYTES] == name:
            _shared[at : at + KEY_BYTES] = NO_KEY
        return
    # The name last: a reader that meets a half-written slot sees another name.
    _shared[at : at + KEY_BYTES] = NO_KEY
    encoded = device.encode("ascii", "replace")[:DEVICE_BYTES]
    _shared[at + KEY_BYTES : at + SLOT] = encoded.ljust(DEVICE_BYTES, b"\0")
    _shared[at : at + KEY_BYTES] = name


def remembered_device(key: bytes, local_rank: int) -> str | None:
    """What remember_device noted for the command `key`'s `local_rank`."""
    found = _slot(key, local_rank)
    if found is None or _shared is None:
        return None
    at, name = found
    if _shared[at : at + KEY_BYTES] != name:
        return None
    device = _shared[at + KEY_BYTES : at + SLOT].rstrip(b"\0").decode("ascii", "replace")
    return device or None
