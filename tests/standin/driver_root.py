"""A stand-in NVIDIA driver installed in a folder, as `initramfs/build
--nvidia-driver ROOT` takes a real one: kernel modules built for the boot
tests' kernel (kernel/), GSP firmware files, libnvidia-ml.so.1 (nvml.c),
nvidia-persistenced and nv-fabricmanager (daemons.c) with the fabric
manager's configuration; and the probe a test boot runs as its command."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "580.95.05"
MODULE_DIR = "updates/dkms"  # where DKMS installs the driver's modules


def missing_parts(release: str) -> str | None:
    """Why the stand-ins cannot be built here, or None."""
    if not (Path("/lib/modules") / release / "build").is_dir():
        return f"no kernel headers for {release} (apt install linux-headers-{release})"
    for tool in ("make", "gcc"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt install build-essential)"
    if shutil.which("depmod") is None and not Path("/sbin/depmod").exists():
        return "no depmod (apt install kmod)"
    return None


def _run(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))}:\n{done.stdout}{done.stderr}")


def build_modules(work: Path, release: str) -> list[Path]:
    """The stand-in modules, built for `release` with its headers."""
    source = work / "kernel"
    shutil.copytree(HERE / "kernel", source)
    _run(["make", "-C", f"/lib/modules/{release}/build", f"M={source}",
          f"STANDIN_VERSION={VERSION}", "modules"])  # fmt: skip
    return sorted(source.glob("*.ko"))


def build_programs(work: Path) -> dict[str, Path]:
    """nvml (the library), daemons and probe (static executables)."""
    work.mkdir(parents=True, exist_ok=True)
    nvml, daemons, probe = work / "libnvidia-ml.so.1", work / "daemons", work / "probe"
    _run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", nvml,
          HERE / "nvml.c"])  # fmt: skip
    _run(["gcc", "-O1", "-static", "-o", daemons, HERE / "daemons.c"])
    _run(["gcc", "-O1", "-static", "-o", probe, HERE / "probe.c"])
    return {"nvml": nvml, "daemons": daemons, "probe": probe}


def install(
    root: Path,
    release: str,
    modules: list[Path],
    programs: dict[str, Path],
    persistenced: bool = True,
    fabric_manager: bool = True,
) -> Path:
    """A driver root as an installer leaves it, with modules.dep from depmod."""
    module_dir = root / "lib/modules" / release / MODULE_DIR
    module_dir.mkdir(parents=True)
    for module in modules:
        shutil.copy(module, module_dir / module.name)
    depmod = shutil.which("depmod") or "/sbin/depmod"
    _run([depmod, "-b", root, release])
    return install_user_space(root, programs, persistenced, fabric_manager)


def install_user_space(
    root: Path, programs: dict[str, Path], persistenced: bool = True, fabric_manager: bool = True
) -> Path:
    """The driver's files besides its modules: firmware, NVML, the daemons."""
    firmware = root / "lib/firmware/nvidia" / VERSION
    firmware.mkdir(parents=True)
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        (firmware / name).write_bytes(name.encode() * 1000)
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    shutil.copy(programs["nvml"], lib / "libnvidia-ml.so.1")
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    if persistenced:
        shutil.copy(programs["daemons"], bin_dir / "nvidia-persistenced")
    if fabric_manager:
        shutil.copy(programs["daemons"], bin_dir / "nv-fabricmanager")
        config = root / "usr/share/nvidia/nvswitch"
        config.mkdir(parents=True)
        (config / "fabricmanager.cfg").write_text("LOG_LEVEL=4\nDAEMONIZE=1\n")
    return root


def fake_module(path: Path, fields: dict[str, list[str]]) -> None:
    """An ELF file whose only content is a .modinfo section of `fields`: what
    the image builder reads of a module, without a kernel to build one for."""
    modinfo = b"".join(f"{k}={v}".encode() + b"\0" for k, vs in fields.items() for v in vs)
    names = b"\0.modinfo\0.shstrtab\0"
    body = modinfo + names
    shoff = 64 + len(body) + (-(64 + len(body)) % 8)
    # ELF64 header: class 2, little-endian, version 1; ET_REL for x86-64; sections at shoff.
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
    table = b"".join(
        struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)
        for name, kind, offset, size in (
            (0, 0, 0, 0),
            (1, 1, 64, len(modinfo)),  # .modinfo, PROGBITS
            (10, 3, 64 + len(modinfo), len(names)),  # .shstrtab, STRTAB
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body + bytes(shoff - 64 - len(body)) + table)


def fake_driver_root(root: Path, release: str, programs: dict[str, Path]) -> Path:
    """A driver root whose modules are fake_module files built for `release`."""
    module_dir = root / "lib/modules" / release / MODULE_DIR
    fields = {"version": [VERSION], "vermagic": [f"{release} SMP preempt mod_unload"]}
    fake_module(module_dir / "nvidia.ko", {**fields, "firmware": [
        f"nvidia/{VERSION}/gsp_ga10x.bin", f"nvidia/{VERSION}/gsp_tu10x.bin"]})  # fmt: skip
    for name in ("nvidia-modeset", "nvidia-uvm"):
        fake_module(module_dir / f"{name}.ko", fields)
    (module_dir.parent.parent / "modules.dep").write_text(
        f"{MODULE_DIR}/nvidia.ko:\n{MODULE_DIR}/nvidia-modeset.ko: {MODULE_DIR}/nvidia.ko\n"
        f"{MODULE_DIR}/nvidia-uvm.ko: {MODULE_DIR}/nvidia.ko\n"
    )
    return install_user_space(root, programs)
