"""Boot figures for pod-init's image under QEMU (software emulation): guest
time from /init's start to the command's exec with module loading taken out,
the module loading itself, and the image size with and without modules; with
--train, the whole path from power-on to the training's steps (the training
root of initramfs/build-root, pyinit run with two CPU workers), as the
timeline of every phase.

    python bench/boot_time.py [--runs 3] [--init PATH] [--out DIR]
    python bench/boot_time.py --train [--runs 3] [--console] [--out DIR]

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

from pyinit.analysis.timeline import Timeline, read_events
from pyinit.analysis.timeline import build as build_timeline
from pyinit.analysis.timeline import plot as plot_timeline
from pyinit.analysis.timeline import table as timeline_table
from pyinit.data.sharder import shard
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


TRAIN_STEPS = 10
TINY_MODEL = ["--width", "32", "--layers", "1", "--seq-len", "32", "--batch-size", "4",
              "--log-every", "1"]  # fmt: skip
# PID 1's phases that are the kernel's or the hardware's work, not pod-init's own.
NOT_POD_INIT = ("modules", "device wait", "root", "data")


def training_figures(timeline: Timeline) -> dict[str, float]:
    rows = {row.phase: row for row in timeline.rows}
    figures = {f"{name} s": row.seconds for name, row in rows.items()}
    init_start = rows["kernel"].start_s + rows["kernel"].seconds
    exec_end = rows["exec"].start_s + rows["exec"].seconds
    others = sum(rows[name].seconds for name in NOT_POD_INIT if name in rows)
    figures["pod-init in PID 1 ms"] = (exec_end - init_start - others) * 1e3
    figures["power-on to first step s"] = timeline.first_step_s or float("nan")
    return figures


def train(args: argparse.Namespace, kernel: Path, folder: Path) -> dict:
    """The training boots; their timelines and figures."""
    subprocess.run([sys.executable, ROOT / "examples" / "make_corpus.py", "--out",
                    folder / "corpus.jsonl", "--megabytes", "0.5"],
                   check=True, capture_output=True)  # fmt: skip
    shard([str(folder / "corpus.jsonl")], str(folder / "shards"), 2)
    example = ROOT / "examples" / "train_tiny.py"
    boot_image, root_image = qemu_boot.build_training_images(
        folder, Path(args.init), folder / "shards", [example]
    )
    timelines = []
    for i in range(args.runs):
        guest_dir = f"{qemu_boot.GUEST_RUN_DIR}{i}"
        append = qemu_boot.training_command(
            "train_tiny.py", 2, "--data", f"{qemu_boot.GUEST_TRAIN_DIR}/shards",
            "--steps", str(TRAIN_STEPS), *TINY_MODEL, run_dir=guest_dir,
        )  # fmt: skip
        run = qemu_boot.boot(kernel, boot_image, f"quiet podinit.hostname=trainer {append}",
                             [root_image], timeout=900, memory_mb=2048, cpus=2,
                             echo=args.console and i == 0)  # fmt: skip
        if run.returncode != 0 or "command exited with status 0" not in run.console:
            raise RuntimeError("the training boot failed:\n" + run.console[-3000:])
        run_dir = qemu_boot.copy_out(root_image, guest_dir, folder / f"out{i}")
        timelines.append(build_timeline(read_events(run_dir)))
    runs = [training_figures(t) for t in timelines]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print()
    print(timeline_table(timelines[0]), end="")
    print()
    print(f"median of {args.runs} training boots (guest time, TCG):")
    for key in ("power-on to first step s", "kernel s", "modules s", "pod-init in PID 1 ms",
                "supervisor start s", "agent import torch s", "first step s"):  # fmt: skip
        print(f"  {key:28} {median[key]:9.3f}")
    return {"runs": runs, "median": median, "timelines": [t.to_dict() for t in timelines],
            "first": timelines[0]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--init", default=shutil.which("pod-init"), help="the static pod-init")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for boot_time.json (and boot_timeline.json, "
                        "timeline.png with --train)")  # fmt: skip
    parser.add_argument("--console", action="store_true", help="print the first boot's console")
    parser.add_argument("--train", action="store_true",
                        help="boot the training root; time the path to the steps")  # fmt: skip
    args = parser.parse_args()
    why = qemu_boot.missing_parts()
    if why or not args.init:
        print(f"boot_time: {why or 'no pod-init on PATH (--init)'}", file=sys.stderr)
        return 2
    kernel, release = qemu_boot.kernel_and_release()
    if args.train:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            result = train(args, kernel, Path(scratch))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        first = result.pop("first")
        document = {"date": time.strftime("%Y-%m-%d"), "kernel": release,
                    "qemu": qemu_version(), **result}  # fmt: skip
        write_json(out / "boot_timeline.json", document)
        if plot_timeline(first, out / "boot_timeline.png"):
            print(f"wrote {out / 'boot_timeline.json'} and boot_timeline.png")
        return 0
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
