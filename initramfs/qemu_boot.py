"""Booting a pod-init image under QEMU with software emulation (TCG: no KVM
needed), an emulated NVMe disk per image file, the console on the serial
port. Used by the boot test and bench/boot_time.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

LOG_LINE = re.compile(r"\[\s*(\d+)\.(\d{6})\] pod-init: (.*)$")


@dataclass
class Boot:
    console: str
    returncode: int
    wall_seconds: float
    timed_out: bool

    def pod_init_lines(self) -> list[tuple[float, str]]:
        """(seconds since boot, message) for every pod-init console line."""
        found = []
        for line in self.console.splitlines():
            match = LOG_LINE.search(line.rstrip())  # the first may follow BIOS escape codes
            if match:
                found.append((int(match[1]) + int(match[2]) / 1e6, match[3]))
        return found


def kernel_and_release() -> tuple[Path, str] | None:
    """Debian's kernel (linux-image-amd64) with its modules, when installed."""
    for kernel in sorted(Path("/boot").glob("vmlinuz-*"), reverse=True):
        release = kernel.name.removeprefix("vmlinuz-")
        if (Path("/lib/modules") / release / "modules.dep").exists():
            return kernel, release
    return None


def missing_parts() -> str | None:
    """Why a boot cannot run here, or None."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (apt install qemu-system-x86)"
    if kernel_and_release() is None:
        return "no /boot/vmlinuz-* with modules (apt install linux-image-amd64)"
    return None


def boot(
    kernel: Path,
    initrd: Path,
    append: str,
    disks: list[Path] = (),
    timeout: float = 180,
    memory_mb: int = 512,
) -> Boot:
    command = [
        "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-m", str(memory_mb),
        "-smp", "1", "-nographic", "-no-reboot", "-nic", "none",
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", f"console=ttyS0 panic=-1 {append}",
    ]  # fmt: skip
    for i, disk in enumerate(disks):
        command += ["-drive", f"file={disk},if=none,id=disk{i},format=raw",
                    "-device", f"nvme,serial=podinit{i},drive=disk{i}"]  # fmt: skip
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        return Boot(done.stdout + done.stderr, done.returncode, time.monotonic() - start, False)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        return Boot(out, -1, time.monotonic() - start, True)
