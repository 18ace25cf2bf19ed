"""Booting a pod-init image under QEMU with software emulation (TCG: no KVM
needed), an emulated NVMe disk per image file, the console on the serial
port; and the training boot: a root image made by initramfs/build-root, on
which PID 1 runs `pyinit run` with examples/train_tiny.py. Used by the boot
tests, bench/boot_time.py and `./bootstrap main`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
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
    cpus: int = 1,
    echo: bool = False,
    nvme_options: str = "",
) -> Boot:
    """Boots and waits for the power-off; `echo` shows the console as it comes;
    `nvme_options` are more properties for each NVMe device (",smart_critical_warning=1")."""
    # -cpu max: TCG's full instruction set (torch and numpy need more than qemu64's).
    command = [
        "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-cpu", "max",
        "-m", str(memory_mb), "-smp", str(cpus), "-nographic", "-no-reboot", "-nic", "none",
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", f"console=ttyS0 panic=-1 {append}",
    ]  # fmt: skip
    for i, disk in enumerate(disks):
        command += ["-drive", f"file={disk},if=none,id=disk{i},format=raw",
                    "-device", f"nvme,serial=podinit{i},drive=disk{i}{nvme_options}"]  # fmt: skip
    start = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", stdin=subprocess.DEVNULL) as qemu:  # fmt: skip
        timer = threading.Timer(timeout, qemu.kill)
        timer.start()
        try:
            for line in qemu.stdout:
                lines.append(line)
                if echo:
                    sys.stdout.write(strip_escapes(line))
                    sys.stdout.flush()
        finally:
            timer.cancel()
        code = qemu.wait()
    timed_out = time.monotonic() - start >= timeout
    return Boot("".join(lines), -1 if timed_out else code, time.monotonic() - start, timed_out)


def strip_escapes(text: str) -> str:
    """The console without the BIOS's terminal escape codes."""
    return re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|c)", "", text)


# Where the training boot puts things in its root image.
GUEST_TRAIN_DIR = "/opt/train"
GUEST_RUN_DIR = "/var/lib/pod-init/run"
TRAINING_MODULES = ("nvme", "ext4", "crc32c_generic")


def build_training_images(
    folder: Path, init: Path, shards: Path, scripts: list[Path]
) -> tuple[Path, Path]:
    """(boot image, root image) in `folder`: /init with the NVMe and ext4
    modules, and a root with this Python environment, the shards and `scripts`
    under /opt/train."""
    _, release = kernel_and_release()
    here = Path(__file__).resolve().parent
    boot_image, root_image = folder / "boot.img", folder / "root.ext4"
    modules = [word for name in TRAINING_MODULES for word in ("--module", name)]
    subprocess.run([sys.executable, here / "build", "--out", boot_image, "--init", init,
                    "--kernel-release", release, *modules],
                   check=True, capture_output=True)  # fmt: skip
    files = [f"{shards}:{GUEST_TRAIN_DIR}/shards"]
    files += [f"{script}:{GUEST_TRAIN_DIR}/{script.name}" for script in scripts]
    subprocess.run([sys.executable, here / "build-root", "--out", root_image, "--init", init,
                    *[word for f in files for word in ("--file", f)]],
                   check=True, capture_output=True)  # fmt: skip
    return boot_image, root_image


def training_command(
    script: str, nproc: int, *script_args: str, run_dir: str = GUEST_RUN_DIR
) -> str:
    """The kernel parameters for PID 1 to switch to the training root and run
    `pyinit run` of a script there."""
    words = ["/usr/local/bin/pyinit", "run", "--nproc-per-node", str(nproc), "--run-dir",
             run_dir, "--", f"{GUEST_TRAIN_DIR}/{script}", *script_args]  # fmt: skip
    return f'podinit.root=/dev/nvme0n1 podinit.cmd="{" ".join(words)}"'


def copy_out(image: Path, guest_path: str, dest: Path) -> Path:
    """A folder of the (unmounted, journal-less) ext4 image, copied to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debugfs", "-R", f"rdump {guest_path} {dest}", str(image)],
                   check=True, capture_output=True)  # fmt: skip
    return dest / Path(guest_path).name
