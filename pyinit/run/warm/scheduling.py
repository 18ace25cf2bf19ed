"""How the kernel treats a launch's processes: its nice value, its
scheduling policy and its OOM score adjustment, which a cold agent and
its workers inherit from the shell that ran ``nice -n 10 pyinit run``,
``chrt --idle 0 pyinit run`` or ``choom -n 500 pyinit run``. A warm
interpreter's fork inherits the warm interpreter's instead, so the launch
sends its own and the fork that serves it takes them on.

A process may always be made nicer, moved from the normal policy to the
batch or idle one, and made likelier to be chosen by the OOM killer; the
opposite needs CAP_SYS_NICE (CAP_SYS_RESOURCE for the OOM score). Where the
fork could not take on what the launch has, the launch starts cold, and
says why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")
CAP_SYS_NICE, CAP_SYS_RESOURCE = 23, 24
# The policies a process without privileges may be moved to from the normal one.
ORDINARY = {os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE}
FIELDS = ("nice", "policy", "rt_priority", "oom_score_adj")


def here() -> dict[str, int]:
    """This process's nice value, policy (with its real-time priority) and
    OOM score adjustment."""
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "policy": os.sched_getscheduler(0),
        "rt_priority": os.sched_getparam(0).sched_priority,
        "oom_score_adj": int(OOM_SCORE_ADJ.read_text()),
    }


POLICIES = ORDINARY | {os.SCHED_FIFO, os.SCHED_RR}
RANGES = {"nice": range(-20, 20), "rt_priority": range(100), "oom_score_adj": range(-1000, 1001)}


def malformed(theirs: Any) -> bool:
    """Whether a launch's record is not one here() could give (a client may send anything)."""
    return not (
        isinstance(theirs, dict)
        and set(theirs) == set(FIELDS)
        and all(type(theirs[name]) is int for name in FIELDS)
        and theirs["policy"] in POLICIES
        and all(theirs[name] in values for name, values in RANGES.items())
    )


def _capable(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def refusal(theirs: dict[str, int], mine: dict[str, int]) -> str:
    """Why a fork of this process cannot take on `theirs`; "" when it can."""
    if theirs["nice"] < mine["nice"] and not _capable(CAP_SYS_NICE):
        return f"the warm interpreter runs at nice {mine['nice']}, this launch at {theirs['nice']}"
    policy = (theirs["policy"], theirs["rt_priority"])
    if policy != (mine["policy"], mine["rt_priority"]) and not (
        mine["policy"] == os.SCHED_OTHER and theirs["policy"] in ORDINARY
    ) and not _capable(CAP_SYS_NICE):  # fmt: skip
        return "this launch has another scheduling policy than the warm interpreter"
    if theirs["oom_score_adj"] < mine["oom_score_adj"] and not _capable(CAP_SYS_RESOURCE):
        return (f"the warm interpreter's OOM score adjustment is {mine['oom_score_adj']}, "
                f"this launch's {theirs['oom_score_adj']}")  # fmt: skip
    return ""


def take_on(theirs: dict[str, int]) -> None:
    """This process scheduled as `theirs` (refusal() said it may be)."""
    OOM_SCORE_ADJ.write_text(str(theirs["oom_score_adj"]))
    if (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) != (
        theirs["policy"], theirs["rt_priority"]
    ):  # fmt: skip
        os.sched_setscheduler(0, theirs["policy"], os.sched_param(theirs["rt_priority"]))
    os.setpriority(os.PRIO_PROCESS, 0, theirs["nice"])
