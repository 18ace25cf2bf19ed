"""What the kernel says of the process that asks for a launch: who it is
(protocol.Identity), how it is scheduled (pyinit.run.warm.scheduling), its
resource limits, umask and CPU affinity. The warm interpreter reads them
for the peer's pid (SO_PEERCRED) and takes none of them from the request:
a client of this user's may send anything, and a process in a sandbox
(without a capability, under no_new_privs or seccomp, in a chroot, with a
lower hard limit or a higher nice value) that claimed the warm
interpreter's would have its script run outside the sandbox.

The pid is held by a pidfd while it is read: a caller that ends meanwhile
is not served, so a process that took its pid is never read in its place.
"""

from __future__ import annotations

import os
import resource
import select
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinit.run.warm import protocol, scheduling

# The limits a cold agent would inherit and a warm launch's fork takes on.
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_STACK", "RLIMIT_MEMLOCK",
          "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_RTPRIO",
          "RLIMIT_NICE", "RLIMIT_MSGQUEUE", "RLIMIT_SIGPENDING", "RLIMIT_LOCKS", "RLIMIT_RSS",
          "RLIMIT_RTTIME")  # fmt: skip


class Unknown(Exception):
    """The caller could not be read; the message says why, in a few words."""


@dataclass(frozen=True)
class Caller:
    identity: protocol.Identity
    scheduling: dict[str, int]
    limits: dict[str, tuple[int, int]]
    umask: int
    affinity: list[int]

    def settings(self) -> dict[str, Any]:
        """What the fork that serves the launch takes on (pyinit.run.warm.keeper)."""
        return {"scheduling": self.scheduling, "limits": self.limits, "umask": self.umask,
                "affinity": self.affinity}  # fmt: skip


def read(pid: int, interpreter: Mapping[str, Any], environ: Mapping[str, str]) -> Caller:
    """Process `pid`, which says it runs `interpreter` with `environ`.
    Unknown when it cannot be read whole (pid 0: a PID namespace this one
    cannot see)."""
    if pid <= 0:
        raise Unknown("the caller is in a PID namespace the warm interpreter cannot see")
    try:
        held = os.pidfd_open(pid)
    except OSError as error:
        raise Unknown(f"the caller cannot be read ({error.strerror})") from None
    try:
        limits = {name: resource.prlimit(pid, getattr(resource, name))
                  for name in LIMITS if hasattr(resource, name)}  # fmt: skip
        status = protocol.process_status(pid)
        if "Umask" not in status:
            raise ValueError("no Umask in /proc/PID/status (a kernel before 4.7)")
        caller = Caller(identity=protocol.Identity.of(pid, interpreter, environ, status),
                        scheduling=scheduling.of(pid), limits=limits,
                        umask=int(status["Umask"], 8),
                        affinity=sorted(os.sched_getaffinity(pid)))  # fmt: skip
        ended, _, _ = select.select([held], [], [], 0)
    except (OSError, KeyError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise Unknown(f"the caller cannot be read ({reason})") from None
    finally:
        os.close(held)
    if ended:
        raise Unknown("the caller ended before it was served")
    return caller
