"""What a warm interpreter is (``Warm``): what it imported and the files
those imports loaded, what they read and set, how a launch compares with it,
and what it has served. ``server`` runs the loop around it."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyinit import _native, bytecode
from pyinit.run import compile_notes
from pyinit.run.agent import AGENT_ENV_DEFAULTS
from pyinit.run.preload import (
    COMPILE_PRELOAD_STEPS,
    DEFAULT_PRELOADS,
    PreloadError,
    collector_paused,
    compute_compile_caches,
    fork_unsafe,
    import_all,
    import_compile_set,
)
from pyinit.run.warm import protocol, scheduling
from pyinit.run.warm.deferred import StepImport
from pyinit.runlog.events import boottime, process_start
from pyinit.say import say as say_line

if TYPE_CHECKING:
    import subprocess

    from pyinit.run.warm.caller import Caller
    from pyinit.run.warm.cpu_probe import CpuProbe


@dataclass
class Spare:
    """A keeper and its agent, forked ahead of the next launch and waiting
    for it: a launch pays for neither fork (each copies the page tables of
    everything imported)."""

    pid: int
    channel: socket.socket  # the warm interpreter's end; closed: the spare ends


def say(line: str) -> None:
    say_line(f"pyinit warm: {line}")


class Warm:
    """The warm interpreter's state: what it imported, from which files,
    how it compares, what it has served."""

    def __init__(self, preloads: tuple[str, ...], idle_timeout: float, defer_compile: bool,
                 until_compiled: bool = False):  # fmt: skip
        self.preloads = tuple(dict.fromkeys((*DEFAULT_PRELOADS, *preloads)))
        # Imported after the first launch is served, a step at a time beside the
        # loop, when started with a launch right behind (PID 1's, or a run's for
        # itself): a plain `pyinit warm start` waits for the rest.
        self.deferred = list(COMPILE_PRELOAD_STEPS) if defer_compile or until_compiled else []
        # A run's own interpreter begins them only once a worker has compiled.
        self.until_compiled = until_compiled
        compile_notes.share()  # what its workers say of their compiles
        self.idle_timeout = idle_timeout
        self.started = time.time()
        self.launches = 0
        self.keepers: set[int] = set()  # launches running
        self.spare: Spare | None = None
        self.start_env = dict(os.environ)
        self.identity = protocol.Identity.here(self.start_env, protocol.agent_sys_path())
        self.set_by_import: dict[str, str] = {}
        self.read_at_import: frozenset[str] = frozenset()
        self.files = _native.FileSnapshot([])
        self.imported = (process_start(), 0.0)  # CLOCK_BOOTTIME: the start, and ready
        self.filler: subprocess.Popen[bytes] | None = None  # pyinit.bytecode's, after the imports
        self.cpu_probe: CpuProbe | None = None  # after the deferred preloads (cpu_probe)
        self.probe_begun = False
        # A probe that ended while the compile set was still coming: its wait status.
        self.probe_ended: int | None = None
        self.importing: StepImport | None = None  # a deferred preload's thread (deferred)

    def drop_spare(self) -> None:
        """The spare keeper, if any, told to end by closing its channel (it is
        reaped as it does); the loop forks a new one when it may."""
        if self.spare is not None:
            self.spare.channel.close()
            self.spare = None

    def load(self) -> None:
        """The preloads, the agent's own imports, and a record of each file."""
        with protocol.recording_environ_reads() as seen, collector_paused():
            import_all(self.preloads)
            import_all(("torch.distributed.run", "pyinit.run.agent", "pyinit.run.store",
                        "pyinit.run.wrapper"))  # fmt: skip
            if not self.deferred:
                import_compile_set()
        self._imported(seen)
        self.imported = (self.imported[0], boottime())

    def compile_set_wanted(self) -> bool:
        """Whether the deferred compile set may be imported now: at once,
        unless this interpreter waits for a worker it forked to compile first."""
        return not self.until_compiled or compile_notes.seen()

    def begin_import(self) -> None:
        """The next deferred preload imported in a thread (``deferred``),
        while the loop serves: the spare, forked first, takes a launch that
        comes meanwhile."""
        self.importing = StepImport(self)

    def import_next_deferred(self) -> set[str]:
        """The next deferred preload imported (in StepImport's thread); the
        environment names it read. One that fails to import is said and left
        out: a compiled script imports it itself."""
        name = self.deferred.pop(0)
        with protocol.recording_environ_reads() as seen, collector_paused():
            try:
                import_all((name,))
            except PreloadError as error:
                say(f"{error} (left to the scripts that compile)")
            if not self.deferred:  # a launch may come at any moment: the CPU probe forked
                compute_compile_caches(probe_cpu=False)
        return seen

    def end_import(self) -> set[str] | None:
        """The step under way waited for; the environment names it read (None
        without one). Alone, as the interpreter ends: what the step loaded is
        neither recorded nor kept, since nothing more is served."""
        if self.importing is None:
            return None
        seen = self.importing.finish()
        self.importing = None
        return seen

    def settle_import(self) -> str:
        """The step under way, if any, waited for and taken in; why this
        interpreter may no longer fork ("" when it may)."""
        seen = self.end_import()
        if seen is None:
            return ""
        self._imported(seen | self.read_at_import)
        return fork_unsafe()

    def _imported(self, seen: set[str] | frozenset[str]) -> None:
        """What the imports so far read and set, and the files they loaded."""
        self.read_at_import = frozenset(seen)
        # As they were before the imports, which set some (torch sets
        # TORCHINDUCTOR_CACHE_DIR): what a fresh start would have met.
        self.identity.import_env = {k: v for k, v in self.start_env.items()
                                    if protocol.import_time(k) or k in seen}  # fmt: skip
        self.set_by_import = {k: v for k, v in os.environ.items() if self.start_env.get(k) != v}
        self.files = loaded_files()
        if not self.deferred and self.filler is None:  # all imported: kept for the next start
            self.filler = bytecode.fill_later()

    def difference(self, request: dict[str, Any], peer: Caller) -> str:
        """Why this launch, from `peer`, cannot be served here ("" when it can)."""
        missing = [m for m in request.get("preloads", []) if m not in self.preloads]
        if missing:
            return f"the warm interpreter has not preloaded {', '.join(missing)}"
        # As the launch's agent would import: with its defaults where the user set none.
        environ = {**AGENT_ENV_DEFAULTS, **request["env"]}
        why = self.identity.difference(peer.identity, environ, self.read_at_import)
        if why:
            return why
        why = scheduling.refusal(peer.scheduling, scheduling.of(0))
        if why:
            return why
        for name, (_soft, hard) in peer.limits.items():
            _, mine = resource.getrlimit(getattr(resource, name))
            if mine != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > mine):
                return f"{name}'s hard limit is lower in the warm interpreter ({mine} < {hard})"
        return changed_file(self.files)

    def status(self) -> dict[str, Any]:
        memory = _memory(os.getpid())
        return {"pid": os.getpid(), "python": sys.executable, "preloads": list(self.preloads),
                "age_s": round(time.time() - self.started, 1), "launches": self.launches,
                "running": len(self.keepers), "idle_timeout_s": self.idle_timeout,
                # The step being imported is pending until it has ended.
                "compile_preloads_pending": len(self.deferred) + (self.importing is not None),
                "compile_preloads_wait_for_a_compile": bool(self.deferred)
                and not self.compile_set_wanted(),
                "cpu_probe_running": self.cpu_probe is not None, **memory}  # fmt: skip


def loaded_files() -> _native.FileSnapshot:
    """Every loaded module's file, as it is on disk now (mtime, size, inode)."""
    modules = list(sys.modules.values())
    paths = dict.fromkeys(getattr(module, "__file__", None) for module in modules)
    return _native.FileSnapshot([os.fsencode(path) for path in paths if isinstance(path, str)])


def changed_file(files: _native.FileSnapshot) -> str:
    """The first loaded module file changed on disk since it was imported.
    Asked at every launch, of some 4,000 files with the compile set: the
    stat() calls are the handoff's largest part (15.7 of 18.7 ms on a 2-core
    VM when they were made here, one Python object each)."""
    change = files.first_change()
    if change is None:
        return ""
    path, err = os.fsdecode(change[0]), change[1]
    if err == errno.ENOENT:
        return f"{path} is gone since the warm interpreter imported it"
    if err:
        return f"{path}: {os.strerror(err)} since the warm interpreter imported it"
    return f"{path} changed since the warm interpreter imported it"


def _memory(pid: int) -> dict[str, int]:
    """Resident and proportional set sizes (the workers' shared pages count
    once in PSS, split among those that share them)."""
    found = {}
    for name, key in (("status", "VmRSS"), ("smaps_rollup", "Pss")):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key + ":"):
                    found[f"{key.lower().removeprefix('vm')}_bytes"] = int(line.split()[1]) * 1024
    return found
