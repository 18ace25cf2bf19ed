"""How the kernel treats a launch's processes: its nice value, its
scheduling policy, its IO priority and its OOM score adjustment, which a
cold agent and its workers inherit from the shell that ran ``nice -n 10
pyinit run``, ``chrt --idle 0 pyinit run``, ``ionice -c 3 pyinit run`` or
``choom -n 500 pyinit run``. A warm interpreter's fork inherits the warm
interpreter's instead: the warm interpreter reads the caller's from the
kernel (pyinit.run.warm.caller), and the fork that serves it takes them on.

A process may always be made nicer, moved from the normal policy to the
batch or idle one, given any IO priority but the real-time class, and made
likelier to be chosen by the OOM killer; the opposite needs CAP_SYS_NICE
(CAP_SYS_RESOURCE for the OOM score). Where the fork could not take on what
the caller has, the launch starts cold, and says why.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyinit import _native
from pyinit.run.warm import protocol

CAP_SYS_NICE, CAP_SYS_RESOURCE = 23, 24
# The policies a process without privileges may be moved to from the normal one.
ORDINARY = {os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE}
IO_REAL_TIME = 1  # ioprio's classes: 0 none, 1 real time, 2 best effort, 3 idle
IO_CLASS_SHIFT = 13


def of(pid: int) -> dict[str, int]:
    """The nice value, policy (with its real-time priority), IO priority and
    OOM score adjustment of process `pid` (0: this one), as the kernel
    tells them. OSError when it cannot (the process has ended)."""
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "policy": os.sched_getscheduler(pid),
        "rt_priority": os.sched_getparam(pid).sched_priority,
        "io_priority": _native.io_priority(pid),
        "oom_score_adj": int(Path(f"/proc/{pid or 'self'}/oom_score_adj").read_text()),
    }


def _capable(bit: int) -> bool:
    return bool(int(protocol.process_status("self").get("CapEff", "0"), 16) >> bit & 1)


def refusal(theirs: dict[str, int], mine: dict[str, int]) -> str:
    """Why a fork of this process cannot take on `theirs`; "" when it can."""
    if theirs["nice"] < mine["nice"] and not _capable(CAP_SYS_NICE):
        return f"the warm interpreter runs at nice {mine['nice']}, this launch at {theirs['nice']}"
    policy = (theirs["policy"], theirs["rt_priority"])
    if policy != (mine["policy"], mine["rt_priority"]) and not (
        mine["policy"] == os.SCHED_OTHER and theirs["policy"] in ORDINARY
    ) and not _capable(CAP_SYS_NICE):  # fmt: skip
        return "this launch has another scheduling policy than the warm interpreter"
    io_real_time = theirs["io_priority"] >> IO_CLASS_SHIFT == IO_REAL_TIME
    if io_real_time and theirs["io_priority"] != mine["io_priority"] and not _capable(
            CAP_SYS_NICE):  # fmt: skip
        return "this launch has a real-time IO priority the warm interpreter has not"
    if theirs["oom_score_adj"] < mine["oom_score_adj"] and not _capable(CAP_SYS_RESOURCE):
        return (f"the warm interpreter's OOM score adjustment is {mine['oom_score_adj']}, "
                f"this launch's {theirs['oom_score_adj']}")  # fmt: skip
    return ""


def take_on(theirs: dict[str, int]) -> None:
    """This process scheduled as `theirs` (refusal() said it may be). Only
    what differs is set: a /proc mounted read-only, as some containers have
    it, refuses even a write of the same OOM score."""
    mine = of(0)
    if theirs["oom_score_adj"] != mine["oom_score_adj"]:
        Path("/proc/self/oom_score_adj").write_text(str(theirs["oom_score_adj"]))
    if (theirs["policy"], theirs["rt_priority"]) != (mine["policy"], mine["rt_priority"]):
        os.sched_setscheduler(0, theirs["policy"], os.sched_param(theirs["rt_priority"]))
    if theirs["nice"] != mine["nice"]:
        os.setpriority(os.PRIO_PROCESS, 0, theirs["nice"])
    if theirs["io_priority"] != mine["io_priority"]:
        _native.set_io_priority(theirs["io_priority"])
