"""``pyinit check``: the node's health for schedulers (SLURM's
HealthCheckProgram, a prolog or epilog, a Kubernetes probe), in a bounded time.

    pyinit check [--deadline 5] [--expect-gpus N] [--json] [--sysfs-root DIR]
                 [--kmsg /dev/kmsg] [--nvml-replay FILE | --no-nvml]

Probes, each in a thread of its own under one deadline: ``topology`` (the C++
scan's findings: link width and generation, ACS, BAR1, the GPU count),
``nvml`` (GPU health as `pyinit run`'s preflight reads it: ECC, row remaps,
BAR1 below memory; none with ``--no-nvml``), ``nvme`` (each NVMe
namespace's read-only flag and controller state from sysfs), ``xid`` (the
kernel log's Xids, classified). A probe that has not answered at the
deadline is UNKNOWN, named, and never waited for: the check returns and the
process exits even with that thread still blocked (a FIFO where a sysfs file
should be, a driver call that hangs).

Nagios' exit codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (also for bad
usage, as Nagios plugins do); the first line is the summary SLURM shows as a
drain reason, then one line per problem; ``--json`` for machines.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATE_NAMES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
# Which state wins the summary: a CRITICAL finding (an Xid 79) must drain the
# node even when another probe could not answer, so CRITICAL outranks UNKNOWN.
PRECEDENCE = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}
SEVERITY_STATE = {"error": CRITICAL, "warning": WARNING}


@dataclass(frozen=True)
class Problem:
    state: int
    probe: str
    code: str
    device: str
    message: str

    def line(self) -> str:
        where = f" {self.device}" if self.device else ""
        return f"{STATE_NAMES[self.state]} {self.probe} {self.code}{where}: {self.message}"


def probe_topology(args: argparse.Namespace) -> list[Problem]:
    from pyinit.finding import scan_findings
    from pyinit.pci_scan import scan_native

    native = scan_native(args.sysfs_root, expect_gpus=args.expect_gpus, probe_bar0=False)
    return [Problem(SEVERITY_STATE[f.severity], "topology", f.code, f.device, f.message)
            for f in scan_findings(native) if f.severity in SEVERITY_STATE]  # fmt: skip


def probe_nvml(args: argparse.Namespace) -> list[Problem]:
    from pyinit.health import gpu_health
    from pyinit.nvml import NvmlUnavailable, read_nvml

    if args.no_nvml:
        return []  # asked for sysfs alone: nothing NVML could say is missing
    try:
        view = read_nvml(args.nvml_backend)
    except NvmlUnavailable as e:
        if Path(args.sysfs_root, "bus/pci/drivers/nvidia").exists():
            return [Problem(WARNING, "nvml", "NVML_UNAVAILABLE", "", str(e))]
        # Nothing for NVML to look at: OK by Nagios' rules (a check that does
        # not apply is not a failure), and said, so no one takes it for a look.
        return [Problem(OK, "nvml", "SKIPPED", "", f"no GPU bound to the nvidia driver; {e}")]
    problems = [Problem(SEVERITY_STATE[f.severity], "nvml", f.code, f.device, f.message)
                for f in gpu_health(view) if f.severity in SEVERITY_STATE]  # fmt: skip
    if args.expect_gpus is not None and len(view.gpus) != args.expect_gpus:
        seen = f"NVML sees {len(view.gpus)} GPUs, expected {args.expect_gpus}"
        problems.append(Problem(CRITICAL, "nvml", "GPU_COUNT", "", seen))
    return problems


# struct nvme_passthru_cmd (linux/nvme_ioctl.h): opcode, flags, rsvd1, nsid, cdw2,
# cdw3, metadata, addr, metadata_len, data_len, cdw10-15, timeout_ms, result.
_PASSTHRU = struct.Struct("<BBHIIIQQII6III")
NVME_IOCTL_ADMIN_CMD = 0xC0484E41  # _IOWR('N', 0x41, struct nvme_passthru_cmd)
SMART_LOG_BYTES = 512
# The SMART / Health log's critical warning bits (NVMe base specification).
CRITICAL_WARNINGS = ("available spare below threshold", "temperature outside its thresholds",
                     "reliability degraded by media or internal errors",
                     "media placed in read-only mode", "volatile memory backup failed",
                     "persistent memory region read-only")  # fmt: skip


def smart_log(controller: str) -> bytes:
    """The controller's SMART / Health Information log page (Get Log Page 02h,
    every namespace) through the admin passthrough ioctl. OSError when the
    device cannot be opened or the command is refused (needs root)."""
    buffer = ctypes.create_string_buffer(SMART_LOG_BYTES)
    dwords = SMART_LOG_BYTES // 4 - 1
    command = bytearray(_PASSTHRU.pack(0x02, 0, 0, 0xFFFFFFFF, 0, 0, 0, ctypes.addressof(buffer),
                                       0, SMART_LOG_BYTES, (dwords << 16) | 0x02, 0, 0, 0, 0, 0,
                                       0, 0))  # fmt: skip
    fd = os.open(controller, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, command)
    finally:
        os.close(fd)
    return buffer.raw


def smart_problems(name: str, log: bytes) -> list[Problem]:
    warning, spare, threshold, used = log[0], log[3], log[4], log[5]
    problems = [Problem(CRITICAL, "nvme", "NVME_CRITICAL_WARNING", name, text)
                for bit, text in enumerate(CRITICAL_WARNINGS) if warning & (1 << bit)]  # fmt: skip
    if spare < threshold and not warning & 1:
        low = f"available spare {spare} % below its threshold {threshold} %"
        problems.append(Problem(CRITICAL, "nvme", "NVME_SPARE_LOW", name, low))
    if used >= 100:
        problems.append(Problem(WARNING, "nvme", "NVME_WORN", name,
                                f"{used} % of the rated endurance used"))  # fmt: skip
    return problems


def probe_nvme(args: argparse.Namespace) -> list[Problem]:
    """Each NVMe namespace: read-only (the controller's own protection after
    media errors, or a forced ro) and its controller's state from sysfs, and
    the controller's SMART log (critical warning, spare, wear) where its
    /dev node answers the admin command."""
    problems = []
    asked = set()
    for block in sorted(Path(args.sysfs_root, "class/block").glob("nvme*n*")):
        if "p" in block.name.split("n", 1)[1]:
            continue  # a partition: its namespace speaks for it
        if (block / "ro").read_text().strip() == "1":
            problems.append(Problem(CRITICAL, "nvme", "NVME_READ_ONLY", block.name,
                                    "the namespace is read-only"))  # fmt: skip
        state_file = block / "device" / "state"
        if state_file.exists():
            state = state_file.read_text().strip()
            if state != "live":
                problems.append(Problem(CRITICAL, "nvme", "NVME_CONTROLLER_STATE", block.name,
                                        f"controller state {state!r}, not 'live'"))  # fmt: skip
        controller = Path(args.dev_root, block.name.rsplit("n", 1)[0])
        if controller not in asked and controller.exists():
            asked.add(controller)
            # Not readable here (not root, a virtual disk): sysfs has spoken.
            with contextlib.suppress(OSError):
                problems += smart_problems(controller.name, smart_log(str(controller)))
    return problems


def probe_xid(args: argparse.Namespace) -> list[Problem]:
    from pyinit.health.xid import ACTIONS, read_kernel_log

    try:
        events = read_kernel_log(args.kmsg)
    except PermissionError as e:
        return [Problem(UNKNOWN, "xid", "KMSG_UNREADABLE", args.kmsg, e.strerror or str(e))]
    except FileNotFoundError:
        return []  # no kernel log here (a container without /dev/kmsg)
    problems = []
    for event in events:
        # The application's own faults warn; anything a job restart does not fix is critical.
        state = WARNING if event.action == "restart_app" else CRITICAL
        problems.append(Problem(state, "xid", f"XID_{event.xid}", event.device,
                                f"{event.description}: {ACTIONS[event.action]}"))  # fmt: skip
    return problems


PROBES: dict[str, Callable[[argparse.Namespace], list[Problem]]] = {
    "topology": probe_topology,
    "nvml": probe_nvml,
    "nvme": probe_nvme,
    "xid": probe_xid,
}


def run_probes(args: argparse.Namespace) -> tuple[list[Problem], dict[str, float], bool]:
    """Every probe under the deadline: (problems, seconds per probe that
    answered, whether one is still running)."""
    results: dict[str, list[Problem]] = {}
    seconds: dict[str, float] = {}
    lock = threading.Lock()

    def run(name: str, probe: Callable[[argparse.Namespace], list[Problem]]) -> None:
        began = time.monotonic()
        try:
            found = probe(args)
        except Exception as e:  # a probe that fails says so; the others still count
            found = [Problem(UNKNOWN, name, "PROBE_FAILED", "", f"{type(e).__name__}: {e}")]
        with lock:
            results[name] = found
            seconds[name] = round(time.monotonic() - began, 4)

    deadline = time.monotonic() + args.deadline
    threads = [threading.Thread(target=run, args=item, name=f"probe-{item[0]}", daemon=True)
               for item in PROBES.items()]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    problems = []
    with lock:
        for name in PROBES:
            if name in results:
                problems += results[name]
            else:
                late = f"no answer within the {args.deadline:g} s deadline"
                problems.append(Problem(UNKNOWN, name, "PROBE_TIMEOUT", "", late))
        hung = len(results) < len(PROBES)
        return problems, dict(seconds), hung


def by_precedence(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: -PRECEDENCE[p.state])


def summary(problems: list[Problem], elapsed: float) -> tuple[int, str]:
    state = max((p.state for p in problems), key=PRECEDENCE.__getitem__, default=OK)
    counts = {name: sum(p.state == i for p in problems) for i, name in enumerate(STATE_NAMES)}
    first = next(iter(by_precedence(problems)), None)
    text = f"POD-INIT CHECK {STATE_NAMES[state]}"
    named = ("CRITICAL", "WARNING", "UNKNOWN")
    if any(counts[n] for n in named):
        parts = [f"{counts[n]} {n.lower()}" for n in named if counts[n]]
        text += f" - {', '.join(parts)}; first: {first.line()}"
    skipped = sorted({p.probe for p in problems if p.state == OK})
    if skipped:
        text += f" - skipped: {', '.join(skipped)}"
    return state, f"{text} | seconds={elapsed:.3f}"


def drain(node: str | None, reason: str) -> None:
    """Tells SLURM to drain this node (no new jobs; running ones finish):
    slurmd runs a HealthCheckProgram but leaves the draining to it. A failure
    to reach the controller is said on stderr; the exit status stays the
    check's."""
    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    command = ["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason[:200]}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.stderr.write(f"pyinit check: could not drain {name}: {e}\n")
        return
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        sys.stderr.write(f"pyinit check: could not drain {name}: {said}\n")
