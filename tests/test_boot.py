"""The boot image: initramfs/build (reproducible, modules with their
dependencies, bad input) and real boots under QEMU with Debian's kernel and
an emulated NVMe disk, pod-init as /init: reading the disk, switching root,
and training (initramfs/build-root's root, pyinit run, two CPU workers) with
the timeline from power-on to the steps."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_events

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "initramfs"))
import qemu_boot  # noqa: E402

BUILD = ROOT / "initramfs" / "build"
NVME_MODULES = ["crc64", "crc64_rocksoft", "crct10dif_common", "crc_t10dif", "t10_pi",
                "nvme_core", "nvme"]  # fmt: skip


def build_image(out: Path, init: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BUILD, "--out", out, "--init", init, *args],
                          capture_output=True, text=True)  # fmt: skip


def cpio_entries(image: Path) -> dict[str, tuple[int, bytes, tuple[int, int], int]]:
    """name -> (mode, data, rdev, mtime) from a gzip-compressed newc archive."""
    raw = gzip.decompress(image.read_bytes())
    entries, at = {}, 0
    while True:
        fields = [int(raw[at + 6 + 8 * i : at + 14 + 8 * i], 16) for i in range(13)]
        assert raw[at : at + 6] == b"070701"
        name_size, size = fields[11], fields[6]
        name = raw[at + 110 : at + 110 + name_size - 1].decode()
        at = (at + 110 + name_size + 3) // 4 * 4
        if name == "TRAILER!!!":
            return entries
        assert (fields[2], fields[3]) == (0, 0)  # owner root
        entries[name] = (fields[1], raw[at : at + size], (fields[9], fields[10]), fields[5])
        at = (at + size + 3) // 4 * 4


def test_image_is_reproducible_and_holds_what_was_asked(tmp_path, pod_init_bin):
    extra = tmp_path / "run.sh"
    extra.write_text("#!/bin/sh\necho hi\n")
    extra.chmod(0o755)
    args = ["--file", f"{extra}:/opt/run.sh", "--cmdline-default", "podinit.grace=3"]
    first = build_image(tmp_path / "a.img", pod_init_bin, *args)
    assert first.returncode == 0, first.stderr
    assert "bytes compressed" in first.stdout
    extra.touch()  # a newer mtime must not change the image
    assert build_image(tmp_path / "b.img", pod_init_bin, *args).returncode == 0
    assert (tmp_path / "a.img").read_bytes() == (tmp_path / "b.img").read_bytes()
    entries = cpio_entries(tmp_path / "a.img")
    assert entries["init"][1] == pod_init_bin.read_bytes()
    assert entries["init"][0] == stat.S_IFREG | 0o755
    assert entries["opt/run.sh"][1] == extra.read_bytes()
    assert entries["etc/pod-init.conf"][1] == b"podinit.grace=3\n"
    assert stat.S_ISCHR(entries["dev/console"][0]) and entries["dev/console"][2] == (5, 1)
    assert all(mtime == 0 for _, _, _, mtime in entries.values())
    assert all(rdev == (0, 0) for name, (_, _, rdev, _) in entries.items() if name != "dev/console")
    assert names_sorted(entries)


def names_sorted(entries: dict) -> bool:
    return list(entries) == sorted(entries)


def test_modules_come_with_their_dependencies(tmp_path, pod_init_bin):
    found = qemu_boot.kernel_and_release()
    if found is None:
        pytest.skip("no kernel modules here (apt install linux-image-amd64)")
    _, release = found
    result = build_image(tmp_path / "m.img", pod_init_bin, "--module", "nvme",
                         "--kernel-release", release)  # fmt: skip
    assert result.returncode == 0, result.stderr
    entries = cpio_entries(tmp_path / "m.img")
    prefix = f"lib/modules/{release}/"
    modules = sorted(Path(n).name.split(".ko")[0].replace("-", "_") for n in entries
                     if n.startswith(prefix) and ".ko" in n)  # fmt: skip
    assert modules == sorted(NVME_MODULES)
    dep = entries[prefix + "modules.dep"][1].decode()
    assert "kernel/drivers/nvme/host/nvme.ko: kernel/drivers/nvme/host/nvme-core.ko" in dep
    assert entries["etc/pod-init.conf"][1] == b"podinit.modules=nvme\n"


def test_bad_input(tmp_path, pod_init_bin):
    out = tmp_path / "x.img"
    dynamic = build_image(out, Path("/bin/ls"))
    assert dynamic.returncode == 2 and "/bin/ls: not a static" in dynamic.stderr
    missing = build_image(out, pod_init_bin, "--file", f"{tmp_path}/nope:/nope")
    assert missing.returncode == 2 and "nope is not a file" in missing.stderr
    relative = build_image(out, pod_init_bin, "--file", f"{BUILD}:relative")
    assert relative.returncode == 2 and "SRC:/absolute/destination" in relative.stderr
    setting = build_image(out, pod_init_bin, "--cmdline-default", "quiet")
    assert setting.returncode == 2 and "expected podinit.KEY=VALUE" in setting.stderr
    if qemu_boot.kernel_and_release():
        release = qemu_boot.kernel_and_release()[1]
        unknown = build_image(out, pod_init_bin, "--module", "no_such_module",
                              "--kernel-release", release)  # fmt: skip
        assert unknown.returncode == 2
        assert "module no_such_module: not in /lib/modules/" in unknown.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def qemu_parts():
    why = qemu_boot.missing_parts()
    if why:
        pytest.skip(why)
    return qemu_boot.kernel_and_release()


@pytest.mark.qemu
def test_boot_reads_the_nvme_disk_and_powers_off(tmp_path, pod_init_bin, qemu_parts):
    kernel, release = qemu_parts
    disk = tmp_path / "disk.img"
    data = hashlib.shake_256(b"pod-init").digest(8 << 20)
    disk.write_bytes(data)
    image = tmp_path / "boot.img"
    built = build_image(image, pod_init_bin, "--module", "nvme", "--kernel-release", release,
                        "--cmdline-default", "podinit.cmd=/init read /dev/nvme0n1",
                        "--cmdline-default", "podinit.wait=/dev/nvme0n1")  # fmt: skip
    assert built.returncode == 0, built.stderr
    run = qemu_boot.boot(kernel, image, "podinit.hostname=boot-test", [disk], timeout=240)
    log = run.console
    assert not run.timed_out, log
    assert run.returncode == 0, log
    lines = [message for _, message in run.pod_init_lines()]
    assert "started as the machine's init" in lines, log
    assert "hostname: boot-test" in lines, log
    loaded = [m.split()[1] for m in lines if m.startswith("module ") and "loaded" in m]
    assert loaded == NVME_MODULES, log  # dependencies before what needs them
    scan = next(m for m in lines if m.startswith("scan: "))
    assert ", nvme 1 " in scan, log
    # The scan is left for the command (pyinit run reuses it) before the command starts.
    assert lines.index("state: /run/pod-init/node.json written") < lines.index("exec: /init"), log
    digest = hashlib.sha256(data).hexdigest()
    assert f"/dev/nvme0n1: {len(data)} bytes at offset 0, sha256 {digest} (direct" in log, log
    assert "command exited with status 0" in lines, log
    assert "reboot: Power down" in log, log


@pytest.mark.qemu
def test_bad_configuration_is_reported_and_the_machine_still_powers_off(
    tmp_path, pod_init_bin, qemu_parts
):
    kernel, _ = qemu_parts
    image = tmp_path / "boot.img"
    assert build_image(image, pod_init_bin).returncode == 0
    run = qemu_boot.boot(kernel, image, "podinit.end=explode podinit.colour=red -- /init true",
                         timeout=240)  # fmt: skip
    log = run.console
    assert not run.timed_out and run.returncode == 0, log
    lines = [message for _, message in run.pod_init_lines()]
    assert any("podinit.end= must be poweroff, reboot or halt, not 'explode'" in m for m in lines)
    assert any("unknown parameter podinit.colour" in m for m in lines), log
    assert "command exited with status 0" not in lines  # nothing ran
    assert "reboot: Power down" in log, log


def partitioned_disk(path: Path, parts: list[bytes]) -> None:
    """An MBR disk with one primary partition per blob (type 0x83), 1 MiB aligned."""
    sector, start = 512, 2048
    table = b""
    layout = []
    for blob in parts:
        sectors = -(-len(blob) // sector)
        table += bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + start.to_bytes(4, "little")
        table += sectors.to_bytes(4, "little")
        layout.append((start, blob))
        start += -(-sectors // 2048) * 2048
    with open(path, "wb") as f:
        f.truncate(start * sector)
        f.seek(446)
        f.write(table.ljust(64, b"\0") + b"\x55\xaa")
        for first, blob in layout:
            f.seek(first * sector)
            f.write(blob)


def ext4_image(path: Path, source: Path, megabytes: int) -> bytes:
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", source, path, f"{megabytes}M"], check=True)
    return path.read_bytes()


@pytest.mark.qemu
def test_boot_switches_root_and_mounts_data(tmp_path, pod_init_bin, qemu_parts):
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("no mkfs.ext4 (apt install e2fsprogs)")
    kernel, release = qemu_parts
    root = tmp_path / "root"
    (root / "sbin").mkdir(parents=True)
    shutil.copy(pod_init_bin, root / "sbin" / "pod-init")
    data = tmp_path / "data"
    data.mkdir()
    blob = hashlib.shake_256(b"data").digest(3 << 20)
    (data / "blob.bin").write_bytes(blob)
    disk = tmp_path / "disk.img"
    partitioned_disk(disk, [ext4_image(tmp_path / "root.ext4", root, 16),
                            ext4_image(tmp_path / "data.ext4", data, 16)])  # fmt: skip
    image = tmp_path / "boot.img"
    built = build_image(image, pod_init_bin, "--kernel-release", release, "--module", "nvme",
                        "--module", "ext4", "--module", "crc32c_generic")  # fmt: skip
    assert built.returncode == 0, built.stderr
    # /sbin/pod-init exists only on the new root.
    append = ("podinit.root=/dev/nvme0n1p1 podinit.data=/dev/nvme0n1p2:/data "
              "podinit.cmd=\"/sbin/pod-init read /data/blob.bin\"")  # fmt: skip
    run = qemu_boot.boot(kernel, image, append, [disk], timeout=240)
    log = run.console
    assert not run.timed_out and run.returncode == 0, log
    lines = [message for _, message in run.pod_init_lines()]
    assert "root: switched to /dev/nvme0n1p1" in lines, log
    assert "data: /dev/nvme0n1p2 mounted at /data (ext4)" in lines, log
    digest = hashlib.sha256(blob).hexdigest()
    assert f"/data/blob.bin: {len(blob)} bytes at offset 0, sha256 {digest} (direct" in log, log
    assert "command exited with status 0" in lines, log
    # Before the power goes: the data disk unmounted, the root (busy: we run from it) read-only.
    assert lines.index("unmounted /data") < lines.index("remounted / read-only"), log
    assert "reboot: Power down" in log, log


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_tiny.py"
TINY_MODEL = ["--width", "32", "--layers", "1", "--seq-len", "32", "--batch-size", "4",
              "--log-every", "1"]  # fmt: skip
TRAIN_STEPS = 4


@pytest.fixture(scope="module")
def training_images(tmp_path_factory, pod_init_bin, qemu_parts):
    """The boot image and a training root (this Python environment, the
    example and its shards), built once."""
    if shutil.which("mkfs.ext4") is None or shutil.which("debugfs") is None:
        pytest.skip("no mkfs.ext4 or debugfs (apt install e2fsprogs)")
    folder = tmp_path_factory.mktemp("training-boot")
    subprocess.run([sys.executable, EXAMPLE.parent / "make_corpus.py", "--out",
                    folder / "corpus.jsonl", "--megabytes", "0.5"],
                   check=True, capture_output=True)  # fmt: skip
    from pyinit.data.sharder import shard

    shard([str(folder / "corpus.jsonl")], str(folder / "shards"), 2)
    return qemu_boot.build_training_images(folder, pod_init_bin, folder / "shards",
                                           [EXAMPLE])  # fmt: skip


def training_boot(images, append: str) -> qemu_boot.Boot:
    kernel, _ = qemu_boot.kernel_and_release()
    boot_image, root_image = images
    return qemu_boot.boot(kernel, boot_image, f"quiet podinit.hostname=trainer {append}",
                          [root_image], timeout=900, memory_mb=2048, cpus=2)  # fmt: skip


@pytest.mark.qemu
@pytest.mark.slow
def test_power_on_to_first_gradient(training_images, tmp_path, pyinit_bin):
    """PID 1 mounts the training root from the NVMe disk, runs pyinit run with
    two CPU workers, and the timeline accounts for every phase from power-on."""
    append = qemu_boot.training_command("train_tiny.py", 2, "--data", "/opt/train/shards",
                                        "--steps", str(TRAIN_STEPS), *TINY_MODEL)  # fmt: skip
    run = training_boot(training_images, append)
    log = run.console
    assert not run.timed_out and run.returncode == 0, log
    lines = [message for _, message in run.pod_init_lines()]
    assert "network: lo up" in lines, log
    assert "root: switched to /dev/nvme0n1" in lines, log
    assert "all-reduce: sum 3 over 2 ranks, expected 3" in log, log
    assert f"step     {TRAIN_STEPS}  loss" in log, log
    assert "command exited with status 0" in lines, log
    assert "reboot: Power down" in log, log
    run_dir = qemu_boot.copy_out(training_images[1], qemu_boot.GUEST_RUN_DIR, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == TRAIN_STEPS and summary["ranks"] == 2
    assert math.isfinite(summary["first_tenth_mean_loss"]) and math.isfinite(
        summary["last_tenth_mean_loss"]
    )
    done = subprocess.run([pyinit_bin, "timeline", run_dir, "--json", tmp_path / "t.json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    timeline = json.loads((tmp_path / "t.json").read_text())
    assert timeline["origin"] == "power-on" and timeline["missing"] == [], timeline
    phases = [row["phase"] for row in timeline["rows"]]
    # No GPU here: PID 1 writes no NCCL files, and no data disk was given.
    # The workers fork with torch loaded (no import of theirs); the first step in its parts.
    assert phases == ["kernel", "modules", "scan", "device wait", "root", "exec",
                      "supervisor start", "preflight", "agent start", "agent import torch",
                      "agent preload", "rendezvous", "worker start", "process group",
                      "script setup", "first forward", "first step", "first backward",
                      "first optimizer step", "steps"], phases  # fmt: skip
    ends = [row["start_s"] + row["seconds"] for row in timeline["rows"]]
    starts = [row["start_s"] for row in timeline["rows"]]
    assert starts == sorted(starts) and all(e >= s for s, e in zip(starts, ends, strict=True))
    assert 0 < timeline["first_step_s"] < run.pod_init_lines()[-1][0]


@pytest.mark.qemu
@pytest.mark.slow
def test_pid1_starts_a_warm_interpreter_beside_the_boot(training_images, tmp_path, pyinit_bin):
    """podinit.warm=on: the root first, then pyinit warm start beside the
    scan and the device waits; the command is handed to it, so neither the
    agent nor the workers import torch, and the timeline shows when its
    imports ran."""
    append = qemu_boot.training_command("train_tiny.py", 2, "--data", "/opt/train/shards",
                                        "--steps", str(TRAIN_STEPS), *TINY_MODEL)  # fmt: skip
    run = training_boot(training_images, f"{append} podinit.warm=on")
    lines = [message for _, message in run.pod_init_lines()]
    assert not run.timed_out and run.returncode == 0, run.console
    assert "warm: the warm interpreter's socket is bound" in lines, run.console
    assert "command exited with status 0" in lines, run.console
    run_dir = qemu_boot.copy_out(training_images[1], qemu_boot.GUEST_RUN_DIR, tmp_path)
    done = subprocess.run([pyinit_bin, "timeline", run_dir, "--json", tmp_path / "t.json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    timeline = json.loads((tmp_path / "t.json").read_text())
    rows = {row["phase"]: row for row in timeline["rows"]}
    assert timeline["origin"] == "power-on" and timeline["missing"] == [], timeline
    assert {"root wait", "root", "warm start", "scan", "warm imports"} <= set(rows), rows
    assert "import torch" not in rows  # the workers forked with torch loaded

    def end(name: str) -> float:
        return rows[name]["start_s"] + rows[name]["seconds"]

    # PID 1 mounted the root first and started the warm interpreter before the
    # scan; its start ran beside the scan and the device wait.
    assert end("root") <= rows["warm start"]["start_s"] <= rows["scan"]["start_s"]
    assert end("warm start") >= end("device wait")
    assert rows["warm imports"]["start_s"] < end("warm start") or (
        rows["warm imports"]["start_s"] < rows["supervisor start"]["start_s"])  # fmt: skip
    events = run_events(run_dir)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    events = events[starts[-1] :]  # the folder may hold an earlier boot's run too
    warm = next(e for e in events if e["event"] == "warm")
    assert warm["used"] is True, warm
    agent = next(e for e in events if e.get("name") == "agent import torch")
    assert agent["preloaded"] is True


@pytest.mark.qemu
@pytest.mark.slow
def test_check_reads_the_nvme_health_log_in_the_guest(training_images):
    """pyinit check as the guest's command, its root on an emulated NVMe disk
    whose SMART log carries a critical warning (QEMU's smart_critical_warning):
    the admin command reads it, the status is CRITICAL, and PID 1's console
    line gives the command's exit status 2 (pyinit run passing on a script's
    status is tested on the host)."""
    kernel, _ = qemu_boot.kernel_and_release()
    boot_image, root_image = training_images
    append = ('quiet podinit.root=/dev/nvme0n1 podinit.cmd="/usr/local/bin/pyinit check '
              '--kmsg /dev/null --deadline 60"')  # fmt: skip
    healthy = qemu_boot.boot(kernel, boot_image, append, [root_image], timeout=600,
                             memory_mb=1024, cpus=2)  # fmt: skip
    assert "POD-INIT CHECK OK - skipped: nvml |" in healthy.console, healthy.console
    run = qemu_boot.boot(kernel, boot_image, append, [root_image], timeout=600, memory_mb=1024,
                         cpus=2, nvme_options=",smart_critical_warning=1")  # fmt: skip
    lines = [message for _, message in run.pod_init_lines()]
    assert not run.timed_out and run.returncode == 0, run.console
    assert "CRITICAL nvme NVME_CRITICAL_WARNING nvme0: available spare below threshold" in (
        run.console
    ), run.console
    assert "command exited with status 2" in lines, run.console
