"""Errors keep their cause: a file that cannot be read is an OSError of the
right subclass with `filename` set to the path (exit 1, the errno text), bad
content is an InputError naming the file and line (exit 2), in both commands
and in the Python API. Unreadable files need an unprivileged user: root reads
everything, so those cases run under setpriv as nobody."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sysfs_fixtures
from conftest import run

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture(scope="module")
def public(tmp_path_factory) -> Path:
    """A folder nobody can enter (pytest's are private to root), holding a
    fixture tree and files that only root can read."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as nobody")
    top = Path(tempfile.mkdtemp(prefix="pod-init-errors-"))
    top.chmod(0o755)
    sysfs_fixtures.build_h200x2(top / "sys")
    for name, text in {
        "hosts": "127.0.0.1\n",
        "hints": "numa 0 0000:00:06.0\n",
        "thresholds.json": "{}",
        "shard-00000-of-00001.tok": "x" * 8192,
    }.items():
        (top / name).write_text(text)
        (top / name).chmod(0)
    yield top
    shutil.rmtree(top)


def as_nobody(*command, cwd=None) -> subprocess.CompletedProcess:
    return run([*NOBODY, *command], cwd=cwd)


@pytest.mark.root
@pytest.mark.parametrize("option", ["--hostfile", "--hints"])
def test_an_unreadable_input_is_a_system_error_in_both_commands(
    option, public, pod_init_bin, pyinit_bin
):
    path = public / ("hosts" if option == "--hostfile" else "hints")
    out = public / "out-never"
    for command in ([pod_init_bin, "nccl"], [pyinit_bin, "nccl", "--no-nvml"],
                    [pyinit_bin, "nccl", "--no-nvml", "--no-dns"]):  # fmt: skip
        proc = as_nobody(*command, "--sysfs-root", public / "sys", "--out", out, option, path)
        assert proc.returncode == 1, proc.stderr
        assert f"{path}: " in proc.stderr and "Permission denied" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert not out.exists()


@pytest.mark.root
def test_python_sees_the_subclass_with_the_path(public):
    code = f"""
import sys
from pyinit import _native
from pyinit.data import TokenShardDataset
from pyinit.monitor import Thresholds
from pyinit.nccl import configure
root = {str(public)!r}
cases = [
    ("hostfile", lambda: _native.load_node_list(root + "/hosts"), "read"),
    ("hints", lambda: configure(root + "/sys", hints=root + "/hints"), "read"),
    ("thresholds.json", lambda: Thresholds.from_file(root + "/thresholds.json"), None),
    ("shard-00000-of-00001.tok",
     lambda: TokenShardDataset([root + "/shard-00000-of-00001.tok"], 8), None),
]
for name, call, operation in cases:
    try:
        call()
    except PermissionError as e:
        assert e.filename.endswith(name.replace("hostfile", "hosts")), (name, e.filename)
        assert operation is None or e.strerror.startswith(operation + ": "), (name, e.strerror)
    else:
        sys.exit(name + ": no PermissionError")
print("ok")
"""
    proc = as_nobody(sys.executable, "-P", "-c", code, cwd=public)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


def test_a_missing_hostfile_is_exit_1_naming_it(pod_init_bin, pyinit_bin, h200x2_tree, tmp_path):
    missing = tmp_path / "missing"
    for command in ([pod_init_bin, "nccl"], [pyinit_bin, "nccl", "--no-nvml"]):
        proc = run([*command, "--sysfs-root", h200x2_tree, "--out", tmp_path / "out",
                    "--hostfile", missing])  # fmt: skip
        assert proc.returncode == 1
        assert f"{missing}: " in proc.stderr and "No such file or directory" in proc.stderr
        assert not (tmp_path / "out").exists()


def test_operations_without_a_path_leave_filename_empty():
    from pyinit import _native

    with pytest.raises(OSError) as raised:
        _native.DirectReader("/nonexistent/file")
    assert isinstance(raised.value, FileNotFoundError)
    assert raised.value.filename == "/nonexistent/file"
    assert raised.value.strerror == "open: No such file or directory"


def test_an_io_priority_of_no_process_names_it_and_a_negative_pid_is_refused():
    from pyinit import _native

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process (until the kernel hands it out again)
    with pytest.raises(ProcessLookupError) as raised:
        _native.io_priority(child.pid)
    assert raised.value.filename == f"/proc/{child.pid}"
    assert raised.value.strerror == "ioprio_get: No such process"
    with pytest.raises(ValueError, match=r"pid must be 0 \(this process\) or a process's id"):
        _native.io_priority(-1)
    assert _native.io_priority(0) == _native.io_priority(os.getpid())


def test_bad_content_is_exit_2_naming_file_and_line(pyinit_bin, tmp_path):
    thresholds = tmp_path / "t.json"
    thresholds.write_text('{\n "gpu_util_low": }')
    proc = run([pyinit_bin, "monitor", "--once", "--thresholds", thresholds])
    assert proc.returncode == 2 and f"{thresholds}:2: malformed JSON" in proc.stderr


def test_the_error_classes_need_no_compiled_module():
    proc = run([sys.executable, "-c", "import sys, pyinit.errors as e; "
                "assert issubclass(e.InputError, ValueError); "
                "assert 'pyinit._native' not in sys.modules; print(e.EXIT_USAGE)"])  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "2\n", proc.stderr


def test_exit_statuses_are_one_table_in_help_and_readme(pod_init_bin, pyinit_bin):
    from pyinit.errors import EXIT_STATUS_HELP

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert EXIT_STATUS_HELP in run([pyinit_bin, "--help"]).stdout
    assert EXIT_STATUS_HELP in run([pod_init_bin, "--help"]).stdout
    assert EXIT_STATUS_HELP in readme
