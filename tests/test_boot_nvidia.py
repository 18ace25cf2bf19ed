"""A boot image that brings up an NVIDIA node: initramfs/build --nvidia-driver
(what goes in, its manifest, what is refused) with a stand-in driver
(tests/standin), and QEMU boots of Debian's kernel where PID 1 loads the
stand-in modules with their parameters, waits for the GPUs of a recorded
HGX board (tests/sysfs_fixtures.py hgx), starts persistence and the fabric
manager, waits for the fabric through NVML (a stand-in libnvidia-ml), writes
the NCCL files with the NVLinks it learnt, and locks module loading."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "initramfs"))
sys.path.insert(0, str(ROOT / "tests" / "standin"))
import driver_root  # noqa: E402
import qemu_boot  # noqa: E402
from sysfs_fixtures import NVSWITCHES, build_hgx  # noqa: E402
from test_boot import build_image, cpio_entries  # noqa: E402

RELEASE = "6.1.0-test-amd64"
HGX_GPUS = ["0000:03:00.0", "0000:04:00.0", "0000:1c:00.0", "0000:1d:00.0", "0000:83:00.0",
            "0000:84:00.0", "0000:c3:00.0", "0000:c4:00.0"]  # fmt: skip


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc (apt install gcc)")
    return driver_root.build_programs(tmp_path_factory.mktemp("standin-programs"))


def manifest_of(entries: dict) -> dict:
    return json.loads(entries["etc/pod-init/nvidia-driver.json"][1])


def test_a_driver_goes_into_the_image_with_what_it_needs_and_a_manifest(
    tmp_path, pod_init_bin, programs
):
    root = driver_root.fake_driver_root(tmp_path / "driver", RELEASE, programs)
    image = tmp_path / "gpu.img"
    built = build_image(image, pod_init_bin, "--kernel-release", RELEASE,
                        "--nvidia-driver", root)  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert f"NVIDIA driver {driver_root.VERSION}" in built.stdout
    entries = cpio_entries(image)
    modules = f"lib/modules/{RELEASE}/{driver_root.MODULE_DIR}"
    wanted = [f"{modules}/nvidia.ko", f"{modules}/nvidia-modeset.ko", f"{modules}/nvidia-uvm.ko",
              f"lib/firmware/nvidia/{driver_root.VERSION}/gsp_ga10x.bin",
              f"lib/firmware/nvidia/{driver_root.VERSION}/gsp_tu10x.bin",
              "usr/bin/nvidia-persistenced", "usr/bin/nv-fabricmanager",
              "usr/share/nvidia/nvswitch/fabricmanager.cfg",
              "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "sbin/pod-init-nvml"]  # fmt: skip
    for name in wanted:
        assert name in entries, name
    # pod-init-nvml's own libraries came from this machine: the driver root has none.
    interp = next(n for n in entries if "ld-linux" in n)
    assert entries[interp][1] == Path("/" + interp).resolve().read_bytes()
    assert any(n.endswith("/libc.so.6") for n in entries)
    assert entries["var/run"][0] == stat.S_IFLNK | 0o777 and entries["var/run"][1] == b"../run"
    dep = entries[f"lib/modules/{RELEASE}/modules.dep"][1].decode()
    assert f"{driver_root.MODULE_DIR}/nvidia-uvm.ko: {driver_root.MODULE_DIR}/nvidia.ko" in dep
    manifest = manifest_of(entries)
    assert manifest["driver_version"] == driver_root.VERSION
    assert manifest["kernel_release"] == RELEASE
    listed = {f["path"].lstrip("/"): f for f in manifest["files"]}
    assert set(wanted) <= set(listed)
    for name, item in listed.items():  # every file it names is in the image, as it says
        data = entries[name][1]
        assert (item["bytes"], item["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    sources = {item["source"] for item in manifest["files"]}
    assert str(root / "usr/bin/nv-fabricmanager") in sources
    # The same inputs, the same bytes.
    again = build_image(tmp_path / "again.img", pod_init_bin, "--kernel-release", RELEASE,
                        "--nvidia-driver", root)  # fmt: skip
    assert again.returncode == 0 and (tmp_path / "again.img").read_bytes() == image.read_bytes()


def test_a_driver_for_another_kernel_or_missing_a_part_is_refused_by_name(
    tmp_path, pod_init_bin, programs
):
    root = driver_root.fake_driver_root(tmp_path / "driver", RELEASE, programs)
    out = tmp_path / "x.img"

    def refused(*extra: str) -> str:
        done = build_image(out, pod_init_bin, "--kernel-release", RELEASE, "--nvidia-driver",
                           root, *extra)  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        assert not out.exists() and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        return done.stderr.strip()

    uvm = root / "lib/modules" / RELEASE / driver_root.MODULE_DIR / "nvidia-uvm.ko"
    driver_root.fake_module(uvm, {"version": [driver_root.VERSION],
                                  "vermagic": ["5.10.0-99-amd64 SMP mod_unload"]})  # fmt: skip
    assert refused() == (f"initramfs/build: {uvm}: built for kernel 5.10.0-99-amd64, not "
                         f"{RELEASE}, the image's kernel")  # fmt: skip
    driver_root.fake_module(uvm, {"version": [driver_root.VERSION],
                                  "vermagic": [f"{RELEASE} SMP"]})  # fmt: skip
    firmware = root / "lib/firmware/nvidia" / driver_root.VERSION / "gsp_tu10x.bin"
    firmware.unlink()
    assert refused() == (f"initramfs/build: {firmware}: missing (the nvidia module "
                         f"{driver_root.VERSION} names it)")  # fmt: skip
    firmware.write_bytes(b"gsp")
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").unlink()
    assert "no libnvidia-ml.so.1 in any of lib/x86_64-linux-gnu" in refused()
    dep = root / "lib/modules" / RELEASE / "modules.dep"
    dep.write_text("kernel/drivers/nvme/host/nvme.ko:\n")
    assert refused() == (f"initramfs/build: {dep}: no nvidia, nvidia-modeset and nvidia-uvm "
                         "modules in it")  # fmt: skip
    dep.write_text("kernel/drivers/nvme/host/nvme.ko\n")
    assert refused() == f"initramfs/build: {dep}:1: expected 'path: dependencies'"
    assert (
        "missing (is a driver installed for kernel 9.9.9?)"
        in build_image(
            out, pod_init_bin, "--kernel-release", "9.9.9", "--nvidia-driver", root
        ).stderr
    )


# The QEMU boots: Debian's kernel with stand-in modules built for it.


@pytest.fixture(scope="module")
def gpu_images(tmp_path_factory, pod_init_bin, programs):
    """Boot images for an HGX board: the stand-in driver (with and without
    nvidia-persistenced), the recorded sysfs tree at /fixture/sys, the probe."""
    why = qemu_boot.missing_parts()
    if why:
        pytest.skip(why)
    kernel, release = qemu_boot.kernel_and_release()
    why = driver_root.missing_parts(release)
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("gpu-boot")
    modules = driver_root.build_modules(folder, release)
    build_hgx(folder / "sys")
    images = {}
    for name, persistenced in (("daemons", True), ("no-persistenced", False)):
        root = driver_root.install(folder / name, release, modules, programs,
                                   persistenced=persistenced)  # fmt: skip
        images[name] = folder / f"{name}.img"
        built = build_image(images[name], pod_init_bin, "--kernel-release", release,
                            "--nvidia-driver", root, "--file", f"{folder / 'sys'}:/fixture/sys",
                            "--file", f"{programs['probe']}:/probe")  # fmt: skip
        assert built.returncode == 0, built.stderr
    return kernel, release, images


def gpu_boot(gpu_images, image: str, gpus: list[str], extra: str = "") -> qemu_boot.Boot:
    kernel, release, images = gpu_images
    nvreg = ",".join([
        "NVreg_EnableGpuFirmware=0",
        "standin_gpus=" + "+".join(gpus),
        "standin_nvswitches=" + "+".join(NVSWITCHES),
        "standin_delay_ms=300",
    ])  # fmt: skip
    module = f"/lib/modules/{release}/{driver_root.MODULE_DIR}/nvidia.ko"
    append = (f'quiet podinit.sysfs=/fixture/sys podinit.nvreg={nvreg} podinit.cmd="/probe '
              f'{module}" {extra}')  # fmt: skip
    return qemu_boot.boot(kernel, images[image], append, timeout=240)


def probe(console: str, name: str) -> str:
    found = re.search(rf"^probe: {re.escape(name)} (.*)$", console, re.M)
    assert found, console
    return found[1].strip()


@pytest.mark.qemu
def test_pid1_brings_up_an_hgx_node_in_order_then_locks_modules(gpu_images):
    run = gpu_boot(gpu_images, "daemons", HGX_GPUS, "podinit.gpu_wait=60")
    log = run.console
    assert not run.timed_out and run.returncode == 0, log
    lines = [message for _, message in run.pod_init_lines()]

    def at(prefix: str) -> int:
        found = [i for i, m in enumerate(lines) if m.startswith(prefix)]
        assert found, (prefix, log)
        return found[0]

    assert [m.split()[1] for m in lines if m.startswith("module ")] == [
        "nvidia", "nvidia_modeset", "nvidia_uvm"]  # fmt: skip
    assert "nvidia: parameters NVreg_EnableGpuFirmware=0 standin_gpus=" in log
    assert re.search(r"nvidia: 8 GPUs bound by the driver after (\d+) ms", log), log
    # Counted from the driver's load, which schedules the bind 300 ms on: no less, but a timer tick.
    assert int(re.search(r"bound by the driver after (\d+) ms", log)[1]) >= 290
    # The order a node needs: scan, modules, GPUs, nodes, persistence, fabric, NCCL, lock, exec.
    order = [at("scan: "), at("module nvidia "), at("nvidia: 8 GPUs bound"),
             at("nvidia: 11 device nodes made"), at("persistence: nvidia-persistenced started"),
             at("fabric: nv-fabricmanager started for 4 NVSwitches"),
             at("fabric: complete on 8 GPUs after"), at("modules: loading locked"),
             at("state: /run/pod-init/node.json written"), at("exec: /probe")]  # fmt: skip
    assert order == sorted(order), lines
    waited = int(re.search(r"fabric: complete on 8 GPUs after (\d+) ms", log)[1])
    assert waited >= 1000, log  # the stand-in fabric manager takes 1.5 s
    assert "nvidia: 0000:c4:00.0 persistence on, fabric completed, sm 90, 1 NVLink peers" in lines
    # What the command finds: loading locked, the parameters taken, the nodes made.
    assert probe(log, "modules_disabled") == "1"
    assert "Operation not permitted" in probe(log, f"finit_module /lib/modules/{gpu_images[1]}"
                                              f"/{driver_root.MODULE_DIR}/nvidia.ko:")  # fmt: skip
    assert probe(log, "NVreg_EnableGpuFirmware") == "0"
    assert probe(log, "/dev/nvidia0") == "195:0"
    # The NCCL files were written after the fabric, with the NVSwitch links NVML gave.
    assert '<nvlink target="fffffff:ff:ff.0" count="18"' in probe(log, "nccl-topo.xml")
    node = json.loads(probe(log, "node.json"))
    phases = {row["phase"]: row for row in node["timeline"]}
    for name in ("nvidia modules", "gpu wait", "persistence", "fabric", "nccl", "modules lock"):
        assert name in phases, phases
    fabric_end = phases["fabric"]["start_s"] + phases["fabric"]["seconds"]
    # The wait starts once every module is in; the bind, 300 ms after the driver's load began.
    driver_and_wait = phases["nvidia modules"]["seconds"] + phases["gpu wait"]["seconds"]
    assert driver_and_wait >= 0.29 and phases["fabric"]["seconds"] >= 1.0
    assert fabric_end <= phases["nccl"]["start_s"] <= phases["modules lock"]["start_s"]
    assert "command exited with status 0" in lines and "reboot: Power down" in log


def stopped_before_the_command(run: qemu_boot.Boot) -> list[str]:
    """The boot's pod-init lines, once it is seen to have powered off without
    starting its command."""
    lines = [message for _, message in run.pod_init_lines()]
    assert not run.timed_out and run.returncode == 0, run.console
    assert not any(m.startswith("exec:") for m in lines) and "reboot: Power down" in run.console
    return lines


@pytest.mark.qemu
def test_a_gpu_the_driver_never_binds_stops_the_boot_with_one_line(gpu_images):
    run = gpu_boot(gpu_images, "daemons", HGX_GPUS[:-1], "podinit.gpu_wait=3")
    lines = stopped_before_the_command(run)
    assert (
        "fatal: nvidia: 1 of 8 GPUs not bound by the driver after 3 s: 0000:c4:00.0 "
        "(no /proc/driver/nvidia/gpus/BDF; the kernel log says why)"
    ) in lines, run.console


@pytest.mark.qemu
def test_without_persistenced_pid1_holds_the_gpus_and_a_stuck_fabric_stops_the_boot(gpu_images):
    run = gpu_boot(gpu_images, "no-persistenced", HGX_GPUS,
                   "podinit.gpu_wait=4 standin_fabric_ms=600000")  # fmt: skip
    lines = stopped_before_the_command(run)
    assert (
        "persistence: PID 1 holds /dev/nvidiactl and 8 GPUs open (the image has no "
        "nvidia-persistenced); NVML sets their persistence mode"
    ) in lines, run.console
    fatal = next(m for m in lines if m.startswith("fatal: "))
    assert fatal.startswith("fatal: fabric: not complete after 4 s: 0000:03:00.0 in-progress, "
                            "0000:04:00.0 in-progress"), fatal  # fmt: skip


@pytest.mark.qemu
def test_a_driver_image_on_a_node_without_nvidia_hardware_boots_as_before(gpu_images):
    kernel, _, images = gpu_images
    run = qemu_boot.boot(kernel, images["daemons"], "quiet podinit.cmd=/probe", timeout=240)
    lines = [message for _, message in run.pod_init_lines()]
    assert not run.timed_out and run.returncode == 0, run.console
    assert "nvidia: no NVIDIA GPU or NVSwitch here: the driver is not started" in lines
    assert not any(m.startswith(("module ", "modules: loading locked")) for m in lines), lines
    assert probe(run.console, "modules_disabled") == "0"
    assert "command exited with status 0" in lines
