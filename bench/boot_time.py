"""Boot figures for pod-init's image under QEMU (software emulation): guest
time from /init's start to the command's exec with module loading taken out,
the module loading itself, and the image size with and without modules.

    python bench/boot_time.py [--runs 3] [--init PATH] [--out DIR]

Times are the guest's CLOCK_BOOTTIME stamps on pod-init's console lines. Under
TCG the guest's clock runs at wall-clock speed while its CPU is emulated, so
every figure is an upper bound for the same steps on hardware.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyinit.jsonfile import write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "initramfs"))
import qemu_boot  # noqa: E402

TARGET_INIT_TO_EXEC_MS = 20.0
STAMPS = (
    ("start", "started as"),
    ("modules", "modules: "),
    ("scan", "scan: "),
    ("exec", "exec: "),
    ("end", "command exited"),
)
TARGET_IMAGE_BYTES = 2 << 20


def build(out: Path, init: str, *args: str) -> int:
    subprocess.run([sys.executable, ROOT / "initramfs" / "build", "--out", out, "--init", init,
                    *args], check=True, capture_output=True)  # fmt: skip
    return out.stat().st_size


def figures(run: qemu_boot.Boot) -> dict[str, float]:
    stamps: dict[str, float] = {}
    module_ms = device_wait_ms = 0.0
    for at, message in run.pod_init_lines():
        for key, prefix in STAMPS:
            if message.startswith(prefix):
                stamps.setdefault(key, at)
        if message.startswith("modules: "):
            module_ms = float(message.rsplit(" in ", 1)[1].split()[0])
        if message.startswith("wait: "):  # the device's probe, not pod-init's work
            device_wait_ms += float(message.rsplit(" after ", 1)[1].split()[0])
    if not {"start", "exec", "end"} <= set(stamps):
        raise RuntimeError("the boot did not reach the command:\n" + run.console)
    module_wall_ms = (stamps.get("modules", stamps["start"]) - stamps["start"]) * 1e3
    return {
        "init_to_exec_ms": (stamps["exec"] - stamps["start"]) * 1e3
        - module_wall_ms
        - device_wait_ms,
        "device_wait_ms": device_wait_ms,
        "module_loading_ms": module_wall_ms,
        "module_finit_ms": module_ms,
        "scan_ms": (stamps["scan"] - stamps.get("modules", stamps["start"])) * 1e3,
        "kernel_to_init_s": stamps["start"],
        "wall_s": run.wall_seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--init", default=shutil.which("pod-init"), help="the static pod-init")
    parser.add_argument("--out", help="folder for boot_time.json")
    parser.add_argument("--console", action="store_true", help="print the first boot's console")
    args = parser.parse_args()
    why = qemu_boot.missing_parts()
    if why or not args.init:
        print(f"boot_time: {why or 'no pod-init on PATH (--init)'}", file=sys.stderr)
        return 2
    kernel, release = qemu_boot.kernel_and_release()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        bare = build(folder / "bare.img", args.init)
        image = folder / "nvme.img"
        command = "podinit.cmd=/init read /dev/nvme0n1"
        with_modules = build(
            image, args.init, "--module", "nvme", "--kernel-release", release,
            "--cmdline-default", command, "--cmdline-default", "podinit.wait=/dev/nvme0n1",
        )  # fmt: skip
        disk = folder / "disk.img"
        disk.write_bytes(hashlib.shake_256(b"boot").digest(8 << 20))
        runs = []
        for i in range(args.runs):
            boot = qemu_boot.boot(kernel, image, "quiet", [disk])
            if args.console and i == 0:
                text = boot.console.split("Booting from ROM..")[-1]
                print(re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|c)", "", text).strip())
            runs.append(figures(boot))
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(f"kernel {release}, QEMU {qemu_version()} (TCG), median of {args.runs} boots")
    print(f"{'figure':38} {'value':>12} {'target':>10}")
    print(f"{'/init start to exec, modules excluded':38} {median['init_to_exec_ms']:9.1f} ms "
          f"{'< 20 ms':>10}")  # fmt: skip
    print(f"{'  of which the topology scan':38} {median['scan_ms']:9.1f} ms")
    print(f"{'module loading (7 modules, nvme)':38} {median['module_loading_ms']:9.1f} ms")
    print(f"{'waiting for /dev/nvme0n1 (the probe)':38} {median['device_wait_ms']:9.1f} ms")
    print(f"{'image without modules':38} {bare / 1024:9.0f} KiB {'< 2048 KiB':>10}")
    print(f"{'image with the nvme modules':38} {with_modules / 1024:9.0f} KiB")
    print(f"{'kernel start to /init':38} {median['kernel_to_init_s']:9.2f} s")
    print(f"{'QEMU wall time per boot':38} {median['wall_s']:9.1f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        document = {
            "date": time.strftime("%Y-%m-%d"),
            "kernel": release,
            "qemu": qemu_version(),
            "image_bytes": {"without_modules": bare, "with_nvme_modules": with_modules},
            "runs": runs,
            "median": median,
            "targets": {
                "init_to_exec_ms": TARGET_INIT_TO_EXEC_MS,
                "image_bytes": TARGET_IMAGE_BYTES,
            },
        }
        write_json(out / "boot_time.json", document)
    return 0


def qemu_version() -> str:
    line = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True)
    return line.stdout.split()[3] if line.returncode == 0 else "?"


if __name__ == "__main__":
    sys.exit(main())
