"""A bytecode cache of the user's own, for Python environments installed
without bytecode.

Where packages were installed without their bytecode (uv's default, ``pip
install --no-compile``, images that delete ``__pycache__``) and Python may not
write it (``PYTHONDONTWRITEBYTECODE=1``, which many images set, or a read-only
site-packages), every process compiles every module it imports from source,
at every start. On an H200 host whose torch came so, that was about half of
``import torch, torch._dynamo`` (bench/NOTES.md), paid by a cold agent, a
warm interpreter's start and every worker not forked from them.

pyinit keeps that bytecode in a folder of the user's (``PYINIT_BYTECODE_CACHE``,
else ``$XDG_CACHE_HOME/pyinit/bytecode``, else ``~/.cache/pyinit/bytecode``;
``off`` for none) and hands it to Python as ``PYTHONPYCACHEPREFIX``:

- After a launch's imports, the process that did them (a cold agent, a warm
  interpreter) starts this module's :func:`main` as a child at the lowest priority
  (:func:`fill_later`). It writes the bytecode of what was imported (copied
  where a source has its own beside it, so the standard library loses
  nothing to the prefix), marks the cache ready for this environment, then
  compiles the rest of those packages, which a worker may import later. It
  ends with its parent; what it wrote stays.
- Every ``pyinit`` command, once the cache is ready for this environment,
  sets ``PYTHONPYCACHEPREFIX`` to it (:func:`use`): the agent, the warm
  interpreter, the workers and whatever they start read their bytecode from
  there. Python checks each file against its source's time and size, as it
  does beside the source, so an upgraded package is compiled again, never
  run stale; the filler of the next launch writes it anew.

``PYTHONDONTWRITEBYTECODE`` keeps its meaning: Python writes no bytecode;
only the filler does, and only into the cache. A ``PYTHONPYCACHEPREFIX`` the
user set is left as it is, and this cache is not used.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyinit import private_folder
from pyinit.errors import InputError
from pyinit.say import say

if TYPE_CHECKING:
    import subprocess
    from types import ModuleType

# Every command imports this module for use(); what only filling needs
# (subprocess, json, py_compile) is imported where it is done.

CACHE_ENV = "PYINIT_BYTECODE_CACHE"  # a folder, or "off"
PREFIX_ENV = "PYTHONPYCACHEPREFIX"
WHAT = "the bytecode cache"
# One per environment (it sits at sys.prefix's place in the cache) and version.
READY_NAME = f"pyinit-ready.{sys.implementation.cache_tag}"
# Test suites are never imported by a training job.
SKIPPED_FOLDERS = frozenset({"__pycache__", "site-packages", "dist-packages", "test", "tests"})
PARENT_CHECK_EVERY = 64  # files between looks at whether the parent is still there
# Imported modules without bytecode before a cache is worth keeping: a few of a
# script's own compile in milliseconds; an environment installed without any
# has thousands (2,500 for torch and torch._dynamo).
WORTH_KEEPING = 100
# For a command's own process, source compiled at every start before its
# bytecode is worth keeping: one module of 330 KB (a client library's
# generated bindings) took about 60 ms to compile on an H200 host.
WORTH_KEEPING_BYTES = 256 << 10


def folder(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The cache's folder; None when it is off or there is no home for it.
    InputError for a relative PYINIT_BYTECODE_CACHE."""
    chosen = environ.get(CACHE_ENV, "")
    if chosen == "off":
        return None
    if chosen:
        if not os.path.isabs(chosen):
            raise InputError(f"{CACHE_ENV}={chosen!r} is not an absolute path (a folder, or off)")
        return Path(chosen)
    home = environ.get("HOME", "")
    base = environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else "")
    # The XDG rule: a relative path there is to be ignored.
    return Path(base, "pyinit", "bytecode") if os.path.isabs(base) else None


def ready_mark(cache: Path) -> Path:
    """Left by a filler once this environment's imports have their bytecode."""
    return Path(str(cache) + sys.prefix, READY_NAME)


def use(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """The cache, once ready for this environment, made this process's and
    its children's PYTHONPYCACHEPREFIX; None when it is not used. A folder
    that is not the user's own is said in one line and left unused."""
    if environ.get(PREFIX_ENV) or sys.pycache_prefix is not None:
        return None
    cache = folder(environ)
    if cache is None:
        return None
    try:
        if private_folder.checked(cache, create=False, what=WHAT) is None:
            return None
    except PermissionError as error:
        say(f"pyinit: {error.filename}: {error.strerror}; compiling from source")
        return None
    if not ready_mark(cache).exists():
        return None
    sys.pycache_prefix = environ[PREFIX_ENV] = str(cache)
    return cache


def fill_later(
    modules: Mapping[str, ModuleType] = sys.modules,
    environ: Mapping[str, str] = os.environ,
    worth: int = WORTH_KEEPING,
) -> subprocess.Popen[bytes] | None:
    """The filler (:func:`main`) started for `modules`, when at least
    `worth` of their sources have no bytecode beside them: after an import,
    Python could not or would not write it there. None when there is too
    little to keep, or no cache (off, or a folder that is refused)."""
    import json
    import subprocess
    import tempfile

    imported = sources(modules)
    if len(without_bytecode(imported)) < worth:
        return None
    cache = made_folder(environ)
    if cache is None:
        return None
    order = {"imported": imported, "packages": packages(modules)}
    with tempfile.TemporaryFile() as listing:
        listing.write(json.dumps(order).encode())
        listing.seek(0)
        return subprocess.Popen([sys.executable, "-P", "-m", __name__, str(cache)],
                                stdin=listing, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip


def keep_imported(modules: Mapping[str, ModuleType] = sys.modules,
                  environ: Mapping[str, str] = os.environ) -> None:  # fmt: skip
    """For a command run without the cache (not ready for this environment):
    when at least WORTH_KEEPING_BYTES of what it imported has no bytecode
    beside it, that bytecode written to the cache here, in this process, and
    the cache marked ready. A health check run every minute pays the
    compile once, not at every start; a launch later fills in the rest."""
    imported = sources(modules)
    lacking = 0
    for source in without_bytecode(imported):
        with contextlib.suppress(OSError):
            lacking += os.stat(source).st_size
    if lacking < WORTH_KEEPING_BYTES:
        return
    cache = made_folder(environ)
    if cache is not None:
        fill(cache, imported, (), os.getppid())


def without_bytecode(imported: Iterable[str]) -> list[str]:
    """The sources without bytecode beside them: after their import, Python
    could not or would not write it there."""
    return [source for source in imported if not os.path.exists(beside(source))]


def made_folder(environ: Mapping[str, str]) -> Path | None:
    """The cache's folder, made if missing; None when there is none (off,
    or a folder that is refused, which every command's use() has said)."""
    try:
        cache = folder(environ)
        if cache is None:
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        private_folder.checked(cache, create=True, what=WHAT)
    except (OSError, InputError):
        return None
    return cache


def end(filler: subprocess.Popen[bytes] | None) -> None:
    """The filler ended, if it is still at work (what it wrote stays)."""
    import subprocess

    if filler is None or filler.poll() is not None:
        return
    filler.terminate()
    try:
        filler.wait(5)
    except subprocess.TimeoutExpired:
        filler.kill()
        filler.wait()


def fill_missing(modules: Mapping[str, ModuleType] = sys.modules) -> None:
    """In this process, the bytecode of each imported module the cache (this
    process's prefix) lacks: a command's own few, compiled once."""
    import importlib.util

    for source in sources(modules):
        if not os.path.exists(importlib.util.cache_from_source(source)):
            fill_one(source)


def sources(modules: Mapping[str, ModuleType]) -> list[str]:
    """The source file of each module, in the order they were imported."""
    found = []
    for module in list(modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            found.append(path)
    return found


def packages(modules: Mapping[str, ModuleType]) -> list[str]:
    """The folders (or files) of the top-level packages in `modules`, and
    the standard library's: what a worker may import next."""
    import sysconfig

    roots: dict[str, None] = {}
    for name, module in list(modules.items()):
        if "." in name:
            continue
        paths = getattr(module, "__path__", None)
        path = getattr(module, "__file__", None)
        if paths is not None:
            roots.update(dict.fromkeys(str(p) for p in list(paths)))
        elif isinstance(path, str) and path.endswith(".py"):
            roots[path] = None
    roots[sysconfig.get_path("stdlib")] = None
    return list(roots)


def beside(source: str) -> str:
    """Where the source's own bytecode would be, without a prefix."""
    head, name = os.path.split(source)
    return os.path.join(head, "__pycache__", f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")


def current(pyc: str, source: os.stat_result) -> bool:
    """Whether `pyc` is bytecode Python would take for `source` as it is:
    this version's magic, checked by the source's time and size."""
    import importlib.util

    try:
        with open(pyc, "rb") as file:
            head = file.read(16)
    except OSError:
        return False
    return (len(head) == 16 and head[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(head[4:8], "little") == 0
            and int.from_bytes(head[8:12], "little") == int(source.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == source.st_size & 0xFFFFFFFF)  # fmt: skip


def fill_one(source: str) -> None:
    """The cache's bytecode for `source` (in this process's prefix), when it
    is not current: a copy of the source's own where that is current, else
    compiled. A file that cannot be read or compiled is left to the import."""
    import importlib.util
    import py_compile

    try:
        info = os.stat(source)
    except OSError:
        return
    target = importlib.util.cache_from_source(source)
    if current(target, info):
        return
    own = beside(source)
    if current(own, info):
        with contextlib.suppress(OSError):
            _write_atomic(target, Path(own).read_bytes())
        return
    with contextlib.suppress(OSError):
        py_compile.compile(source, cfile=target, doraise=False, quiet=2,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)  # fmt: skip


def _write_atomic(path: str, data: bytes) -> None:
    """`data` at `path`, whole or not at all: a reader never meets half a file.
    Not jsonfile.write_bytes: a cache needs no fsync of each of its thousands
    of files, as Python's own bytecode writes have none (it checks a file's
    header before it uses it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as file:
            file.write(data)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def walk(root: str) -> Iterator[str]:
    """The Python sources under `root` (or `root` itself, a file)."""
    if root.endswith(".py"):
        yield root
        return
    for here, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in SKIPPED_FOLDERS)
        yield from (os.path.join(here, f) for f in sorted(files) if f.endswith(".py"))


def fill(cache: Path, imported: Iterable[str], roots: Iterable[str], parent: int) -> bool:
    """The filler's work: what was imported, the ready mark, then the rest
    of the packages. False when the parent went first (it stops there)."""
    sys.pycache_prefix = str(cache)
    done = 0

    def parent_gone() -> bool:
        nonlocal done
        done += 1
        return done % PARENT_CHECK_EVERY == 0 and os.getppid() != parent

    for source in imported:
        if parent_gone():
            return False
        fill_one(source)
    mark = ready_mark(cache)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    for root in roots:
        for source in walk(root):
            if parent_gone():
                return False
            fill_one(source)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m pyinit.bytecode CACHE`` with the JSON of fill_later on
    stdin: {"imported": [FILE...], "packages": [FOLDER or FILE...]}."""
    import json

    argv = sys.argv[1:] if argv is None else argv
    parent = os.getppid()
    if len(argv) != 1 or not os.path.isabs(argv[0]):
        print("usage: python -m pyinit.bytecode CACHE (an absolute path), the files on stdin "
              "as fill_later writes them", file=sys.stderr)  # fmt: skip
        return 2
    try:
        order = json.load(sys.stdin)
        imported, roots = order["imported"], order["packages"]
        if not all(isinstance(p, str) for p in (*imported, *roots)):
            raise TypeError("a path that is not a string")
    except (ValueError, KeyError, TypeError) as error:
        print(f"pyinit.bytecode: stdin: not a fill order ({error})", file=sys.stderr)
        return 2
    # The lowest priority, not SCHED_IDLE: that never runs while every core is
    # busy (a data loader's workers can keep them so), and the cache would never
    # be ready; at nice 19 it takes a sliver of a core until it is done.
    os.nice(19)
    fill(Path(argv[0]), imported, roots, parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
