"""NVIDIA XID events: read from the kernel log (``NVRM: Xid`` lines in
``/dev/kmsg``) and from NVML, and classified by NVIDIA's published Xid catalog
(docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid
Catalog": each Xid's description and its immediate-action resolution bucket)
into what an operator does next:

- ``restart_app``: the application's fault or a transient one; restart the job;
- ``reset_gpu``: the GPU needs a reset (nvidia-smi -r, or a node reboot);
- ``reboot_node``: the GPU is lost to the host until a reboot;
- ``check_hardware``: drain the node and look at the hardware.

The table below holds the Xids a training node meets; an Xid not in it is
reported as unknown (action ``unknown``), never dropped. NVIDIA's spreadsheet
for the driver branch in use is the authority where they differ.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

ACTIONS = {
    "restart_app": "restart the application",
    "reset_gpu": "reset the GPU",
    "reboot_node": "reboot the node",
    "check_hardware": "drain the node and check the hardware",
    "unknown": "not in pod-init's catalog: see NVIDIA's Xid catalog",
}

# xid: (what it means, the action)
CATALOG: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing (channel idle timeout)", "restart_app"),
    13: ("graphics engine exception (often an out-of-range access in a kernel)", "restart_app"),
    31: ("GPU memory page fault (an illegal address in a kernel)", "restart_app"),
    32: ("invalid or corrupted push buffer stream", "restart_app"),
    43: ("GPU stopped processing (a fault in the application's channel)", "restart_app"),
    45: ("preemptive cleanup after earlier errors", "restart_app"),
    48: ("double-bit (uncorrectable) ECC error", "reset_gpu"),
    61: ("internal micro-controller breakpoint or warning", "reset_gpu"),
    62: ("internal micro-controller halt", "reset_gpu"),
    63: ("ECC page retirement or row remap recorded; applied at the next reset", "reset_gpu"),
    64: ("ECC page retirement or row remap could not be recorded", "check_hardware"),
    69: ("graphics engine class error", "restart_app"),
    74: ("NVLink error", "reset_gpu"),
    79: ("GPU has fallen off the bus", "reboot_node"),
    92: ("high single-bit ECC error rate", "check_hardware"),
    94: ("contained ECC error (the affected application was stopped)", "restart_app"),
    95: ("uncontained ECC error", "reset_gpu"),
    109: ("context switch timeout", "restart_app"),
    119: ("GSP RPC timeout", "reset_gpu"),
    120: ("GSP error", "reset_gpu"),
    121: ("C2C link error", "reset_gpu"),
    140: ("unrecovered ECC error", "reset_gpu"),
    143: ("GPU initialisation failure", "reboot_node"),
    154: ("GPU recovery action changed (see the action it names)", "reset_gpu"),
}

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
# Xids are small numbers: a line claiming thousands of digits is not an Xid
# record (and int() of it would fail the whole probe, hiding real ones).
_KMSG_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<bus>[0-9A-Fa-f:.]+)\): (?P<xid>\d{1,9}), ?(?P<text>.*)$"
)


@dataclass(frozen=True)
class XidEvent:
    xid: int
    device: str  # PCI address (kernel log) or "gpuN" (NVML index)
    text: str  # the driver's own words, from the kernel log
    source: str  # "kmsg" or "nvml"

    @property
    def description(self) -> str:
        return CATALOG.get(self.xid, ("unknown Xid", "unknown"))[0]

    @property
    def action(self) -> str:
        return classify(self.xid)

    def to_dict(self) -> dict[str, object]:
        fields = ("xid", "device", "source", "description", "action", "text")
        return {name: getattr(self, name) for name in fields}


def classify(xid: int) -> str:
    """The catalog's action for `xid`, ``unknown`` outside it."""
    return CATALOG.get(xid, ("", "unknown"))[1]


def parse_kernel_line(line: str) -> XidEvent | None:
    """An Xid event from one kernel log line (a /dev/kmsg record or dmesg's
    text), or None for any other line."""
    match = _KMSG_XID.search(line.rstrip("\n"))
    if match is None:
        return None
    bus = match["bus"].lower()
    return XidEvent(int(match["xid"]), bus, match["text"].strip(), "kmsg")


def read_kernel_log(path: str = "/dev/kmsg") -> list[XidEvent]:
    """Every Xid in the kernel's ring buffer now: /dev/kmsg read without
    blocking, one record per read, until it has nothing more (or every line of
    a saved log file). OSError when it cannot be opened (reading /dev/kmsg
    needs root or kernel.dmesg_restrict=0)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    events = []
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # a saved log (dmesg's text, one per line)
            with os.fdopen(os.dup(fd), errors="replace") as saved:
                return [e for e in map(parse_kernel_line, saved) if e is not None]
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the record was overwritten while we read: go on
                continue
            if not record:
                break
            _prefix, _, message = record.decode(errors="replace").partition(";")
            event = parse_kernel_line(message.split("\n", 1)[0])
            if event is not None:
                events.append(event)
    finally:
        os.close(fd)
    return events
