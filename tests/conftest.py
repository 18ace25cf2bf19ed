from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import netns
import sysfs_fixtures

BIN_DIR = Path(sys.executable).parent


# ./bootstrap test runs the files two at a time (pytest-xdist, a file to a worker
# at a time: its module fixtures are built once). These take longest on a
# 2-core machine, longest first: started late, one would run alone at the end.
LONGEST_FILES = ("test_boot.py", "test_compile.py", "test_warm.py", "test_slurm.py",
                 "test_docs.py", "test_run.py", "test_boot_nvidia.py", "test_stall.py",
                 "test_gpu_bench.py", "test_install.py", "test_launch_failures.py",
                 "test_report.py", "test_checkpoint.py")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """The tests start Pythons of their own in the checkout (`python -c`,
    `-m pyinit...`), which import the checkout's `pyinit/` before any installed
    copy: with a copy installed (`pip install .`), those find no native module."""
    import pyinit

    checkout = Path(__file__).resolve().parent.parent / "pyinit"
    if Path(pyinit.__file__).resolve().parent != checkout:
        raise pytest.UsageError(
            f"pyinit is imported from {Path(pyinit.__file__).parent}, not this checkout's "
            f"{checkout}: the tests need it installed editable (pip install -e .)"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the order inside each file and among the rest stays


@pytest.fixture(autouse=True, scope="session")
def private_warm_folder(tmp_path_factory) -> Iterator[Path]:
    """Every run the tests start looks for a warm interpreter here, never in
    the user's own folder (where one may be running), and leaves none
    behind unless the test asks; any left is stopped."""
    folder = tmp_path_factory.mktemp("warm")
    folder.chmod(0o700)
    os.environ["PYINIT_WARM_DIR"] = str(folder)
    # A run leaves a warm interpreter behind by default: tests that want one say so.
    os.environ["PYINIT_WARM"] = "off"
    # Nor a bytecode cache in the user's home (tests/test_bytecode.py gives its own).
    os.environ["PYINIT_BYTECODE_CACHE"] = "off"
    yield folder
    subprocess.run([str(BIN_DIR / "pyinit"), "warm", "stop"], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def pod_init_bin() -> Path:
    path = BIN_DIR / "pod-init"
    assert path.exists(), f"{path} missing: install the package with pip first"
    return path


@pytest.fixture(scope="session")
def pyinit_bin() -> Path:
    path = BIN_DIR / "pyinit"
    assert path.exists(), f"{path} missing: install the package with pip first"
    return path


@pytest.fixture(scope="session")
def nvml_stand_in(tmp_path_factory) -> Path:
    """tests/standin/nvml_replay.c built (the NVML that answers from
    $NVML_REPLAY_FILE), under a name of its own: loaded into a test process
    by its path (and never unloaded), it must not answer for the driver's
    libnvidia-ml.so.1 to later tests there. Its folder's driver/ holds it by
    that name, for a command run with LD_LIBRARY_PATH there."""
    folder = tmp_path_factory.mktemp("nvml")
    built = folder / "libnvml-replay.so"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-shared", "-fPIC",
                    "-Wl,-soname,libnvml-replay.so", "-o", str(built),
                    str(Path(__file__).parent / "standin" / "nvml_replay.c")],
                   check=True)  # fmt: skip
    (folder / "driver").mkdir()
    (folder / "driver" / "libnvidia-ml.so.1").symlink_to(built)
    return built


@pytest.fixture(scope="session")
def h200x2_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sysfs") / "h200x2"
    sysfs_fixtures.build_h200x2(root)
    return root


@pytest.fixture(scope="session")
def eightgpu_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sysfs") / "8gpu"
    sysfs_fixtures.build_8gpu(root)
    return root


@pytest.fixture
def fresh_8gpu(tmp_path) -> sysfs_fixtures.SysfsTree:
    """An 8-GPU tree a test may damage."""
    return sysfs_fixtures.build_8gpu(tmp_path / "8gpu")


@contextlib.contextmanager
def resident(*paths: os.PathLike) -> Iterator[None]:
    """The files written back and held in the page cache while inside: mapped
    and touched, since pages a process maps survive the drop_caches that a
    benchmark's test running beside (the suite runs two files at a time)
    would otherwise make of a test's "just written, so resident"."""
    with contextlib.ExitStack() as held:
        for path in paths:
            f = held.enter_context(open(path, "rb"))
            os.fsync(f.fileno())  # a page the flusher held locked would not be read from the cache
            mapped = held.enter_context(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
            sum(mapped[::4096])  # each page faulted in
        yield


def run(cmd: list[str | os.PathLike], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", 60)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


@dataclass
class TerminalRun:
    output: str
    status: int


def ctrl_c_at_a_terminal(argv: list[str], ready: str, times: int = 1, timeout: float = 120.0,
                         **env: str) -> TerminalRun:  # fmt: skip
    """`argv` run in a terminal of its own (a pseudo-terminal, as an ssh
    session gives), its foreground job; once its output holds `ready`
    `times` times, Ctrl-C typed once, as a user would. Its output and exit
    status once it has ended."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.execve(argv[0], argv, {**os.environ, **env})
        finally:
            os._exit(127)
    output, typed = b"", False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not typed and output.count(ready.encode()) >= times:
                os.write(fd, b"\x03")
                typed = True
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's last process has gone
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        if time.monotonic() >= deadline:  # its job, the terminal's session leader's group
            os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return TerminalRun(output.decode(errors="replace").replace("\r\n", "\n"),
                       os.waitstatus_to_exitcode(status))  # fmt: skip


def run_events(run_dir: Path) -> list[dict]:
    """Every event of a run folder's log; a line that is not whole JSON fails the test."""
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def run_json(cmd: list[str | os.PathLike]) -> tuple[int, dict]:
    proc = run(cmd)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def node_addresses(count: int) -> list[str]:
    return [f"10.77.0.{i + 1}" for i in range(count)]


# Addresses of the nodes `three_namespaces` makes, node 0 first (tests import it).
NODES = node_addresses(3)
NAMESPACE_SETS = itertools.count()


@contextlib.contextmanager
def namespaces(count: int) -> Iterator[list[str]]:
    """`count` network namespaces on one bridge, node i at node_addresses(count)[i]."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("no ip command (apt install iproute2)")
    # Fresh names per use: deleting a namespace frees its veth pair asynchronously,
    # so reusing the last test's names can meet "File exists".
    tag = f"p{os.getpid() % 10000}{next(NAMESPACE_SETS)}"
    try:
        yield netns.add_nodes(tag, node_addresses(count))
    finally:
        netns.remove_nodes(tag, count)


@pytest.fixture
def three_namespaces():
    """Three network namespaces on one bridge, each with its own address (NODES)."""
    with namespaces(3) as names:
        yield names


@pytest.fixture
def eight_namespaces():
    """Eight, at node_addresses(8): the width of the reference deployment."""
    with namespaces(8) as names:
        yield names


@pytest.fixture
def folder() -> Iterator[Path]:
    """A fresh folder on the root filesystem, which takes O_DIRECT (/tmp may be tmpfs)."""
    path = Path(tempfile.mkdtemp(prefix="pyinit-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


@contextlib.contextmanager
def loop_filesystem(folder: Path, megabytes: int) -> Iterator[Path]:
    """An ext4 of `megabytes` on a loop device, mounted under `folder` (root only)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 for a loop-mounted filesystem")
    image, mount = folder / "fs.img", folder / "mnt"
    with open(image, "wb") as f:
        f.truncate(megabytes << 20)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", image], check=True)
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", image, mount], check=True)
    try:
        yield mount
    finally:
        unmount(mount)


def unmount(mount: Path) -> None:
    """Unmounts `mount`: io_uring drops its references to closed files a
    moment later, and the mount is busy until then."""
    for _ in range(50):
        if subprocess.run(["umount", mount], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", mount], check=True)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 16 MiB ext4 on a loop device, mounted (root only)."""
    with loop_filesystem(tmp_path, 16) as mount:
        yield mount


def fill(mount: Path) -> None:
    """Takes every free block of the filesystem."""
    with open(mount / "filler", "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1024):  # down to the block size of a small ext4
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError as e:
                assert e.errno == 28, e  # ENOSPC: full at this chunk size
        os.fsync(f.fileno())


ROOT = Path(__file__).resolve().parent.parent
# The example, made as small as it goes: these tests are about the runtime.
EXAMPLE = ROOT / "examples" / "train_tiny.py"
TINY = ["--seq-len", "32", "--batch-size", "8", "--width", "32", "--layers", "1",
        "--log-every", "5"]  # fmt: skip


@pytest.fixture(scope="session")
def shards() -> Iterator[Path]:
    """Two token shards of the project's own text, for the example."""
    folder = Path("/var/tmp") / f"pyinit-shards-{os.getpid()}"
    subprocess.run([sys.executable, ROOT / "examples" / "make_corpus.py", "--out",
                    folder / "corpus.jsonl", "--megabytes", "0.5"], check=True,
                   capture_output=True)  # fmt: skip
    from pyinit.data.sharder import shard

    shard([str(folder / "corpus.jsonl")], str(folder / "shards"), 2)
    yield folder / "shards"
    shutil.rmtree(folder, ignore_errors=True)
