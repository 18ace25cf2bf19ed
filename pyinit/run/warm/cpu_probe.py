"""Inductor's CPU vector-ISA probe for a warm interpreter that a run started.

A compiled step on the CPU first asks which vector instructions its C++
kernels may use: inductor builds a small program for each ISA and loads it
in a fresh interpreter (1.2-1.4 s on a 2-core VM, in every process that
compiles). A warm interpreter started explicitly runs it before it is
ready. One that a run started must stay ready for the next launch, so it
runs the probe in a forked child of its own (no thread: the fork-safety rule
of pyinit.run.preload), goes on serving, and when the child ends fills its
own caches from the verdicts the child sends back (pyinit.run.preload's
prime_cpu_isa); the spare keeper forked before that is replaced by one
that has them. A launch that comes meanwhile is served as before: its
workers probe for themselves. A probe still running when the warm
interpreter ends is killed with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from pyinit.run.preload import compiles_for_cpu, prime_cpu_isa, probe_cpu_isa

VERDICTS_MAX = 1 << 16  # a handful of checks: far below this


@dataclass
class CpuProbe:
    pid: int  # the child, leader of its own process group (with the probe's interpreters)
    verdicts_fd: int  # the child's JSON, complete once it has ended


def start(close_in_fork: Callable[[], None], beside_a_compile: bool = False) -> CpuProbe | None:
    """The probe running in a child, or None where this torch compiles for a
    GPU (its compiled steps never probe the CPU). Between launches it runs at
    the lowest priority, so that a launch's workers come first;
    `beside_a_compile`, started as a launch's workers compile, at theirs: at
    nice 19 on a 2-core VM it ran only once their compiles had ended, and the
    next launch, which came at once, probed for itself (2.4-2.8 s to its
    first step against 0.9 s)."""
    if not compiles_for_cpu():
        return None
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)  # stop() ends the probe's own interpreters with it
            if not beside_a_compile:
                os.nice(19)
            close_in_fork()
            os.close(read_fd)
            with contextlib.suppress(Exception):  # no verdicts: the workers probe
                data = json.dumps(probe_cpu_isa()).encode()
                while data:
                    data = data[os.write(write_fd, data) :]
                code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with contextlib.suppress(OSError):  # as the child does: stop() may come first
        os.setpgid(pid, pid)
    return CpuProbe(pid, read_fd)


def finish(probe: CpuProbe, status: int) -> str:
    """After the child has ended (reaped, with its wait `status`): this
    process's caches filled from its verdicts; what went wrong, or ""."""
    with os.fdopen(probe.verdicts_fd, "rb") as verdicts:
        data = verdicts.read(VERDICTS_MAX)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return "the CPU probe failed (left to the scripts that compile)"
    try:
        found = json.loads(data)
        if not isinstance(found, dict):
            raise ValueError("not an object")
        prime_cpu_isa(found)
    except Exception as error:  # the child's own output: still, never fatal here
        return f"the CPU probe's verdicts were not taken: {type(error).__name__}: {error!s:.200}"
    return ""


def stop(probe: CpuProbe) -> None:
    """A probe still running when the warm interpreter ends: killed with the
    interpreters it started (reaped by the caller's loop, or by init)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(probe.pid, signal.SIGKILL)
    os.close(probe.verdicts_fd)
