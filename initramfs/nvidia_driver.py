"""An installed NVIDIA driver, gathered for a boot image (initramfs/build
--nvidia-driver ROOT): its kernel modules for the image's kernel with what
they depend on, the GSP firmware the nvidia module names, nvidia-persistenced
and nv-fabricmanager with their configuration when installed, libnvidia-ml,
pod-init-nvml (PID 1's NVML reader), and the shared libraries all of them
load. Every refusal names the file. Standard library only: ELF headers, the
modules' .modinfo and their compression are read here.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DRIVER_MODULES = ["nvidia", "nvidia_modeset", "nvidia_uvm"]
OPTIONAL_MODULES = ["nvidia_peermem"]  # GPUDirect RDMA, where the InfiniBand core is there
PERSISTENCED = "usr/bin/nvidia-persistenced"
FABRIC_MANAGER = "usr/bin/nv-fabricmanager"
FABRIC_CONFIG_DIR = "usr/share/nvidia/nvswitch"
NVML = "libnvidia-ml.so.1"
HELPER_IN_IMAGE = "sbin/pod-init-nvml"
MANIFEST = "etc/pod-init/nvidia-driver.json"
# Where a root's shared libraries are looked for, in order (PID 1 gives the
# same folders to the programs it starts from the image).
LIBRARY_DIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib",
                "usr/lib"]  # fmt: skip


class DriverError(Exception):
    """The driver cannot go into the image: the message names the file."""


@dataclass
class ImageFile:
    path: str  # in the image, without the leading "/"
    data: bytes
    mode: int
    source: str  # where it came from, for the manifest


@dataclass
class Driver:
    version: str
    files: list[ImageFile] = field(default_factory=list)
    dep_lines: list[str] = field(default_factory=list)  # for the image's modules.dep

    def manifest(self, release: str, root: str) -> dict:
        return {
            "driver_version": self.version,
            "kernel_release": release,
            "root": root,
            "files": [
                {
                    "path": "/" + f.path,
                    "source": f.source,
                    "bytes": len(f.data),
                    "sha256": hashlib.sha256(f.data).hexdigest(),
                }
                for f in sorted(self.files, key=lambda f: f.path)
            ],
        }


def module_bytes(path: Path) -> bytes:
    """A module file's ELF bytes, decompressed as the kernel would."""
    data = path.read_bytes()
    name = path.name
    try:
        if name.endswith(".xz"):
            return lzma.decompress(data)
        if name.endswith(".gz"):
            return gzip.decompress(data)
    except (lzma.LZMAError, OSError, EOFError) as e:
        raise DriverError(f"{path}: cannot decompress: {e}") from None
    if name.endswith(".zst"):
        if shutil.which("zstd") is None:
            raise DriverError(f"{path}: compressed with zstd, and no zstd here (apt install zstd)")
        done = subprocess.run(["zstd", "-dc", str(path)], capture_output=True)
        if done.returncode != 0:
            raise DriverError(f"{path}: zstd cannot decompress it")
        return done.stdout
    return data


def _elf(data: bytes, where: str) -> tuple[str, int, int, int, int, int, int]:
    """(byte order, phoff, phentsize, phnum, shoff, shentsize, shnum) of a 64-bit ELF."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2:
        raise DriverError(f"{where}: not a 64-bit ELF file")
    order = "little" if data[5] == 1 else "big"

    def num(at: int, size: int) -> int:
        return int.from_bytes(data[at : at + size], order)

    return order, num(32, 8), num(54, 2), num(56, 2), num(40, 8), num(58, 2), num(60, 2)


def elf_section(data: bytes, name: str, where: str) -> bytes | None:
    """The bytes of section `name`, None when the file has none."""
    order, _, _, _, shoff, shentsize, shnum = _elf(data, where)
    stridx = int.from_bytes(data[62:64], order)

    def header(i: int) -> tuple[int, int, int]:
        at = shoff + i * shentsize
        return (int.from_bytes(data[at : at + 4], order),
                int.from_bytes(data[at + 24 : at + 32], order),
                int.from_bytes(data[at + 32 : at + 40], order))  # fmt: skip

    if shoff == 0 or stridx >= shnum or shoff + shnum * shentsize > len(data):
        raise DriverError(f"{where}: its ELF section table is damaged")
    _, names_at, _ = header(stridx)
    for i in range(shnum):
        name_at, offset, size = header(i)
        end = data.index(b"\0", names_at + name_at)
        if data[names_at + name_at : end].decode(errors="replace") == name:
            return data[offset : offset + size]
    return None


def modinfo(data: bytes, where: str) -> dict[str, list[str]]:
    """A module's .modinfo fields (key=value strings), each key's values in order."""
    section = elf_section(data, ".modinfo", where)
    if section is None:
        raise DriverError(f"{where}: no .modinfo section: not a kernel module")
    fields: dict[str, list[str]] = {}
    for item in section.split(b"\0"):
        key, equals, value = item.decode(errors="replace").partition("=")
        if equals:
            fields.setdefault(key, []).append(value)
    return fields


def dynamic_needs(data: bytes, where: str) -> tuple[str, list[str]]:
    """(program interpreter or "", DT_NEEDED names) of an executable or library."""
    order, phoff, phentsize, phnum, _, _, _ = _elf(data, where)

    def num(at: int, size: int = 8) -> int:
        return int.from_bytes(data[at : at + size], order)

    interp, dynamic, loads = "", None, []
    for i in range(phnum):
        at = phoff + i * phentsize
        kind, offset, vaddr, filesz = num(at, 4), num(at + 8), num(at + 16), num(at + 32)
        if kind == 3:  # PT_INTERP
            interp = data[offset : offset + filesz].split(b"\0")[0].decode()
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
        elif kind == 1:  # PT_LOAD: maps addresses (DT_STRTAB's) to file offsets
            loads.append((vaddr, offset, filesz))
    if dynamic is None:
        return interp, []
    entries = [(num(a), num(a + 8)) for a in range(dynamic[0], dynamic[0] + dynamic[1], 16)]
    strtab = next((value for tag, value in entries if tag == 5), None)  # DT_STRTAB
    if strtab is None:
        return interp, []
    for vaddr, offset, size in loads:
        if vaddr <= strtab < vaddr + size:
            strtab = strtab - vaddr + offset
            break
    needed = []
    for tag, value in entries:
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            end = data.index(b"\0", strtab + value)
            needed.append(data[strtab + value : end].decode())
    return interp, needed


class Libraries:
    """Shared libraries found in `roots` in order (the driver's root first, then
    this machine), each stored at the path it has there, links followed."""

    def __init__(self, roots: list[Path]):
        self.roots = roots
        self.files: dict[str, ImageFile] = {}

    def find(self, name: str) -> tuple[Path, str] | None:
        for root in self.roots:
            for folder in LIBRARY_DIRS:
                candidate = root / folder / name
                if candidate.exists():
                    return candidate, f"{folder}/{name}"
        return None

    def add_needs_of(self, data: bytes, where: str) -> None:
        interp, needed = dynamic_needs(data, where)
        if interp and interp.lstrip("/") not in self.files:
            for root in self.roots:
                if (root / interp.lstrip("/")).exists():
                    self.add(root / interp.lstrip("/"), interp.lstrip("/"))
                    break
            else:
                raise DriverError(f"{where}: its loader {interp} is in none of {self._where()}")
        for name in needed:
            if any(path.endswith("/" + name) for path in self.files):
                continue
            found = self.find(name)
            if found is None:
                raise DriverError(f"{where}: needs {name}, in none of {self._where()}")
            self.add(*found)

    def add(self, source: Path, path: str) -> None:
        data = source.read_bytes()  # the link's target's bytes, at the link's path
        self.files[path] = ImageFile(path, data, 0o755, str(source))
        self.add_needs_of(data, str(source))

    def _where(self) -> str:
        return ", ".join(str(r) for r in self.roots)


def gather(root: Path, release: str, init: Path, helper: Path) -> Driver:
    """The driver of `root` for kernel `release`, pod-init's own NVML reader
    `helper` included; `init` (the static pod-init) resolves the modules."""
    release_dir = root / "lib/modules" / release
    dep_file = release_dir / "modules.dep"
    if not dep_file.is_file():
        raise DriverError(f"{dep_file}: missing (is a driver installed for kernel {release}?)")
    dep_lines, _ = _dep_lines(init, release_dir, DRIVER_MODULES + OPTIONAL_MODULES)
    if dep_lines is None:
        dep_lines, why = _dep_lines(init, release_dir, DRIVER_MODULES)
        if dep_lines is None and "not in" in why:
            raise DriverError(f"{dep_file}: no nvidia, nvidia-modeset and nvidia-uvm modules in it")
        if dep_lines is None:
            raise DriverError(why)  # pod-init's own line: the file and what is wrong there
    driver = Driver(version="")
    firmware: list[str] = []
    for line in dep_lines:
        path = line.partition(":")[0]
        source = release_dir / path
        data = source.read_bytes()
        info = modinfo(module_bytes(source), str(source))
        built_for = (info.get("vermagic") or [""])[0].split(" ")[0]
        if built_for != release:
            raise DriverError(f"{source}: built for kernel {built_for or '(none named)'}, "
                              f"not {release}, the image's kernel")  # fmt: skip
        if Path(path).name.split(".ko")[0].replace("-", "_") == "nvidia":
            driver.version = (info.get("version") or [""])[0]
            firmware = info.get("firmware", [])
        driver.files.append(ImageFile(f"lib/modules/{release}/{path}", data, 0o644, str(source)))
    driver.dep_lines = dep_lines
    for name in firmware:
        driver.files.append(_firmware(root, name, driver.version))
    libraries = Libraries([root, Path("/")] if root != Path("/") else [root])
    nvml = Libraries([root]).find(NVML)  # the driver's own, never this machine's
    if nvml is None:
        raise DriverError(f"{root}: no {NVML} in any of {', '.join(LIBRARY_DIRS)}")
    libraries.add(*nvml)
    for program in (PERSISTENCED, FABRIC_MANAGER):
        if (root / program).is_file():
            data = (root / program).read_bytes()
            driver.files.append(ImageFile(program, data, 0o755, str(root / program)))
            libraries.add_needs_of(data, str(root / program))
    if (root / FABRIC_MANAGER).is_file():
        config = root / FABRIC_CONFIG_DIR
        if not (config / "fabricmanager.cfg").is_file():
            raise DriverError(f"{config / 'fabricmanager.cfg'}: missing beside {FABRIC_MANAGER}")
        for item in sorted(config.rglob("*")):
            if item.is_file():
                driver.files.append(ImageFile(f"{FABRIC_CONFIG_DIR}/{item.relative_to(config)}",
                                              item.read_bytes(), 0o644, str(item)))  # fmt: skip
    helper_data = helper.read_bytes()
    driver.files.append(ImageFile(HELPER_IN_IMAGE, helper_data, 0o755, str(helper)))
    libraries.add_needs_of(helper_data, str(helper))
    driver.files.extend(libraries.files.values())
    return driver


def _dep_lines(init: Path, release_dir: Path, names: list[str]) -> tuple[list[str] | None, str]:
    """The modules.dep lines `init` resolves for `names`, or None and its message."""
    done = subprocess.run([str(init), "modules", "--release-dir", str(release_dir), *names],
                          capture_output=True, text=True, errors="replace")  # fmt: skip
    if done.returncode == 0:
        return done.stdout.splitlines(), ""
    lines = done.stderr.strip().splitlines()
    return None, (lines[0] if lines else "pod-init modules failed").removeprefix("pod-init: ")


def _firmware(root: Path, name: str, version: str) -> ImageFile:
    """The firmware file `name` (as the module names it, under lib/firmware),
    compressed or not: the kernel's loader tries both."""
    base = root / "lib/firmware" / name
    for suffix in ("", ".xz", ".zst"):
        candidate = base.with_name(base.name + suffix)
        if candidate.is_file():
            rel = f"lib/firmware/{name}{suffix}"
            return ImageFile(rel, candidate.read_bytes(), 0o644, str(candidate))
    raise DriverError(f"{base}: missing (the nvidia module {version} names it)")
