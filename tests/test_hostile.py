"""The hostile sweep, kept as tests: a table of bad inputs per command (the
arguments, the exit status and a fragment of the one line it must print; no
traceback, nothing written), then the fault cases (FIFOs and stray bytes in
sysfs, a reader closed under its readers, kill -9 of the supervisor and of the
sharder mid-publish, mixed shard sets, a full disk, too many open files). A new
command gets the same treatment by adding rows."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, run

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "initramfs" / "build"
BUILD_ROOT = REPO / "initramfs" / "build-root"
NON_UTF8 = os.fsdecode(b"/tmp/pod-init-\xff\xfe-root")

# (command, files to write {name: bytes}, exit status, what stderr must hold).
# In the command: {tmp} the test's folder, {sys} a fixture sysfs tree of the
# 2xH200 node, {NAME} a file written from the files column; "pod-init",
# "pod-init-nvml" and "pyinit" are the installed executables, "build"
# initramfs/build.
BIG_LIST = {"hosts": b"10.[0-255].[0-255].[0-255]\n"}
# 20,000 bracket groups on one 60 KB line: the expansion once recursed per group (exit 139).
DEEP_LIST = {"hosts": b"10.0.0.1" + b"[1]" * 20_000 + b"\n"}
FIFO = None  # in the files column: a FIFO with no writer, which must be refused, not waited on
ZEROED_GZ = {"in.jsonl.gz": gzip.compress(b'{"text": "hello"}\n' * 2000)[:40] + bytes(400)}


def events(*lines: str) -> dict[str, bytes]:
    """A run folder's event log of these lines (after a valid start event)."""
    return {"events.jsonl": ('{"event": "start", "boottime": 1.0}\n' + "\n".join(lines) + "\n"
                             ).encode()}  # fmt: skip


BINARY = {"bin": bytes(range(256)) * 4}
SHARD_IN = {"in.jsonl": b'{"text": "hello"}\n{"text": "world"}\n'}
RUN = ["pyinit", "run", "--run-dir", "{tmp}/run"]
BAD_INPUT = [
    (["pod-init", "topo", "--expect-gpus", "4294967296"], {}, 2, "--expect-gpus needs"),
    (["pod-init", "read", "--queue-depth", "0", "{tmp}"], {}, 2,
     "--queue-depth needs a whole number from 1 to 4096"),
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{hosts}"],
     BIG_LIST, 2, "expands to more than 65536 names"),
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hints", "{bin}"],
     BINARY, 2, "{bin}:1: "),
    (["pod-init", "modules", "--release-dir", "{tmp}", "nvme"], {}, 1, "modules.dep: read: "),
    # A number is its digits alone (strtoull would skip the space), and -- ends
    # every subcommand's options.
    (["pod-init", "read", "--offset", " 5", "{bin}"], BINARY, 2, "--offset needs a byte count"),
    (["pod-init", "-e", " 5", "--", "true"], {}, 2, "-e needs an exit status from 0 to 255"),
    (["pod-init", "--grace", " 5", "--", "true"], {}, 2, "--grace needs"),
    (["pod-init", "topo", "--expect-gpus", " 5"], {}, 2, "--expect-gpus needs"),
    (["pod-init", "read", "--", "-x"], {}, 1, "pod-init: -x: open: No such file or directory"),
    (["pod-init", "topo", "--", "-x"], {}, 2, "topo: unexpected argument '-x'"),
    (["pod-init", "params", "podinit.bogus=1"], {}, 2,
     "pod-init: argument 1: unknown parameter podinit.bogus"),
    (["pod-init", "bringup"], {}, 2, "bringup runs only with --dry-run"),
    (["pod-init", "bringup", "--dry-run", "--deadline", "0"], {}, 2,
     "--deadline needs seconds from 1 to 3600"),
    (["pod-init-nvml"], {}, 2, "pod-init-nvml: no GPU named"),
    (["pod-init-nvml", "--wait-fabric", "9999", "0000:01:00.0"], {}, 2,
     "--wait-fabric needs 0 to 3600 seconds, not '9999'"),
    (["pod-init-nvml", "01:00"], {}, 2, "not a PCI address or option: '01:00'"),
    (["pyinit", "topo", "--expect-gpus", "4294967296"], {}, 2, "must be from 0 to 4096"),
    (["pyinit", "topo", "--sysfs-root", NON_UTF8], {}, 1, "bus/pci/devices: list: No such"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--socket-ifname", ""],
     {}, 2, "--socket-ifname: must not be empty"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{h}"],
     {"h": b"10.0.0.1\n\xff\xfe\n"}, 2, "{h}:2: not UTF-8 text (byte 0xff)"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{hosts}"],
     BIG_LIST, 2, "expands to more than 65536 names"),
    ([*RUN, "--nproc-per-node", "99999999999", "--", "{tmp}"], {}, 2, "from 1 to 1024"),
    ([*RUN, "--nproc-per-node", "0", "--", "{tmp}"], {}, 2, "from 1 to 1024"),
    ([*RUN, "--monitor-interval", "-1", "--", "x.py"], {}, 2, "--monitor-interval: must be"),
    ([*RUN, "--monitor-interval", "nan", "--", "x.py"], {}, 2, "--monitor-interval: must be"),
    ([*RUN, "--monitor-interval", "inf", "--", "x.py"], {}, 2, "--monitor-interval: must be"),
    ([*RUN, "--monitor-interval", "1e-7", "--", "x.py"], {}, 2, "--monitor-interval: must be"),
    (["pyinit", "run", "--run-dir", "{bin}", "--", "{bin}"], BINARY, 2, "exists and is not a f"),
    (["pyinit", "monitor", "--once", "--thresholds", "{t}"], {"t": b'{"nvme_for_s": NaN}'}, 2,
     "NaN is not a JSON number"),
    (["pyinit", "monitor", "--once", "--thresholds", "{t}"], {"t": b'{"nvme_for_s": 1e400}'}, 2,
     "must be a finite number"),
    (["pyinit", "monitor", "--once", "--thresholds", "{t}"], {"t": b"[" * 100_000}, 2,
     "{t}: malformed JSON: nested too deeply"),
    (["pyinit", "monitor", "--once", "--thresholds", "{bin}"], BINARY, 2,
     "{bin}:1: malformed JSON"),
    (["pyinit", "monitor", "--once", "--webhook", "http://"], {}, 2, "expected an http(s) URL"),
    (["pyinit", "shard", "/dev/zero", "--out", "{tmp}/out", "--shards", "1"], {}, 2,
     "/dev/zero:1: longer than 256 MiB: not a line of text"),
    (["pyinit", "shard", "{deep}", "--out", "{tmp}/out", "--shards", "1"],
     {"deep": b"[" * 100_000 + b"\n"}, 2, "{deep}:1: malformed JSON: nested too deeply"),
    (["pyinit", "shard", "{tmp}/in.jsonl", "--out", "{tmp}/out", "--shards", "1", "--tokenizer",
      "{fifo}"], {**SHARD_IN, "fifo": FIFO}, 2, "{fifo}: a FIFO or pipe, not a regular file"),
    (["pyinit", "shard", "{tmp}/in.jsonl", "--out", "{tmp}/out", "--shards", "1", "--tokenizer",
      "{tmp}"], SHARD_IN, 2, "{tmp}: a folder, not a regular file"),
    (["pyinit", "bench", "io", "--rounds", "0", "{tmp}"], {}, 2, "--rounds: must be from 1"),
    (["pyinit", "bench", "io", "--runtime", "-1", "{tmp}"], {}, 2, "--runtime: must be from"),
    (["pyinit", "bench", "io", "--no-fio", "--runtime", "0.1", "--rounds", "1", "{empty}"],
     {"empty": b""}, 2, "holds 0 bytes, less than one 1048576-byte block"),
    (["pyinit", "run", "--run-dir", "{tmp}/run", "--", "{fifo}"], {"fifo": FIFO}, 2,
     "{fifo}: a FIFO or pipe, not a script file"),
    (["pyinit", "bench", "io", "--no-fio", "--runtime", "0.1", "--rounds", "1", "{fifo}"],
     {"fifo": FIFO}, 2, "{fifo}: a FIFO or pipe, not a file or block device to read"),
    (["pyinit", "bench", "data", "--shards", "0", "--dir", "{tmp}/out"], {}, 2, "--shards: must"),
    (["pyinit", "bench", "data", "--dir", "{fifo}"], {"fifo": FIFO}, 2,
     "--dir {fifo}: exists and is not a folder"),
    (["pyinit", "bench", "data", "--batch", "-1", "--dir", "{tmp}/out"], {}, 2, "--batch: must"),
    (["pyinit", "bench", "allreduce", "--iterations", "0", "--out", "{tmp}/out"], {}, 2,
     "--iterations: must be from 1"),
    (["pyinit", "bench", "allreduce", "--nproc", "0", "--out", "{tmp}/out"], {}, 2,
     "--nproc: must be from 1"),
    (["build", "--out", "{tmp}/out", "--cmdline-default", "podinit.bogus=1"], {}, 2,
     "unknown parameter podinit.bogus"),
    (["build", "--out", "{tmp}/out", "--cmdline-default", "podinit.end=explode"], {}, 2,
     "must be poweroff, reboot or halt"),
    (["build", "--out", "{tmp}/out", "--cmdline-default", "podinit.grace=-5"], {}, 2,
     "podinit.grace= needs a whole number"),
    (["build", "--out", "{tmp}"], {}, 1, "--out is a folder"),
    (["pyinit", "run", "--join-timeout", "0", "--run-dir", "{tmp}/run", "--", "{ok}"],
     {"ok": b"pass\n"}, 2, "--join-timeout: must be from 1 to 86400, not 0"),
    (["pyinit", "run", "--master-port", "65535", "--run-dir", "{tmp}/run", "--", "{ok}"],
     {"ok": b"pass\n"}, 2, "--master-port: must be from 1 to 65534, not 65535"),
    (["pyinit", "run", "--stall-timeout", "-1", "--run-dir", "{tmp}/run", "--", "{ok}"],
     {"ok": b"pass\n"}, 2, "--stall-timeout: must be from 1"),
    (["pyinit", "run", "--worker-start", "thread", "--run-dir", "{tmp}/run", "--", "{ok}"],
     {"ok": b"pass\n"}, 2, "--worker-start: invalid choice: 'thread'"),
    (["pyinit", "run", "--torchrun", "--start-method spawn", "--run-dir", "{tmp}/run", "--",
      "{ok}"], {"ok": b"pass\n"}, 2, "pyinit run sets --start-method itself"),
    (["pyinit", "timeline", "{tmp}/nowhere"], {}, 2, "no events.jsonl here"),
    (["pyinit", "timeline", "{log}"], {"log": b'{"event": "phase"\n{"event": "end"}\n'}, 2,
     "{log}:1: malformed JSON"),
    (["pyinit", "timeline", "{log}"], {"log": b'{"event": "start"}\n'}, 2,
     "the event log has no phases"),
    (["pyinit", "report", "{tmp}/nowhere"], {}, 2, "{tmp}/nowhere: not a folder"),
    (["pyinit", "report", "{tmp}"], {}, 2, "{tmp}: no events.jsonl here"),
    (["pyinit", "report", "{tmp}"], {"events.jsonl": b'{"event": "start"}\n{"event": \n{}\n'},
     2, "{tmp}/events.jsonl:2: malformed JSON"),
    (["pyinit", "report", "{tmp}"], {"events.jsonl": b'{"event": "start"}\n'}, 2,
     "the event log has no timestamps"),
    # A folder of nodes' folders (pyinit-run/nodeN): each node's log is read, and named.
    (["pyinit", "report", "{tmp}"], {"node0/events.jsonl": b'{"event": "start"}\n{"event": \n{}\n',
                                     "node0-old/events.jsonl": b"{}\n"}, 2,
     "{tmp}/node0/events.jsonl:2: malformed JSON"),
    (["pyinit", "timeline", "{tmp}"], {"node0/events.jsonl": b"", "node1/events.jsonl": b""}, 2,
     "{tmp}: holds 2 nodes' run folders (node0, node1): give one"),
    (["pyinit", "report", "{tmp}", "--price-per-gpu-hour", "nan"], {}, 2,
     "--price-per-gpu-hour: must be from 0"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--node", "-1"], {}, 2,
     "--node: must be from 0"),
    (["pyinit", "check", "--deadline", "0"], {}, 3, "--deadline: must be from 0.1"),
    (["pyinit", "check", "--nvml-replay", "{bin}"], BINARY, 3, "{bin}"),
    (["pyinit", "check", "--slurm-node"], {}, 3, "--slurm-node: expected one argument"),
    (["pyinit", "bench", "allreduce", "-d", "mulsum", "--out", "{tmp}/out"], {}, 2,
     "--datatype: invalid choice: 'mulsum'"),
    (["pyinit", "bench", "allgather", "-b", "1M", "-e", "1K", "--out", "{tmp}/out"], {}, 2,
     "-b 1048576 is above -e 1024"),
    (["pyinit", "bench", "io", "--bs", "1000", "{empty}"], {"empty": b""}, 2,
     "--bs 1000 is not a multiple of 512"),
    (["pyinit", "bench", "io", "--rw", "write", "{tmp}"], {}, 2, "--rw: invalid choice: 'write'"),
    (["pyinit", "bench", "io", "--iodepth", "4", "--api", "read", "{tmp}"], {}, 2,
     "--api read makes one IO per call"),
    (["pyinit", "bench", "io", "--api", "stream-batch", "--iodepth", "8", "{empty}"],
     {"empty": b""}, 2, "holds 0 bytes, less than one 4096-byte block"),
    (["pyinit", "warm", "start", "--no-wait", "--preload", "nosuchmodule"], {}, 2,
     "--preload nosuchmodule: no module named 'nosuchmodule'"),
    (["pyinit", "warm", "start", "--no-wait", "--idle-timeout", "-1"], {}, 2,
     "--idle-timeout: must be from 1 to 604800"),
    (["pyinit", "bench", "checkpoint", "--dir", "{tmp}/missing"], {}, 2, "no such folder"),
    (["pyinit", "bench", "checkpoint", "--size", "1K"], {}, 2, "--size: must be"),
    (["pyinit", "bench", "checkpoint", "--device", "tpu:0"], {}, 2, "--device tpu:0: not a device"),
    (["pyinit", "bench", "checkpoint", "--device", "meta"], {}, 2, "--device meta: not a device"),
    (["pyinit", "bench", "checkpoint", "--no-files"], {}, 2, "--no-files leaves nothing"),
    (["pyinit", "bench", "checkpoint", "--device", "cuda:63"], {}, 1, "this machine has"),
    (["pyinit", "bench", "checkpoint", "--ranks", "0"], {}, 2, "--ranks: must be"),
    # More than the disk holds: said before a byte is written (or a tensor made).
    (["pyinit", "bench", "checkpoint", "--size", "64T", "--dir", "{tmp}", "--no-fio"], {}, 1,
     "{tmp}: the benchmark's files need 194.1 TiB here, and "),
    (["pyinit", "bench", "io", "--loop", "64T", "--loop-dir", "{tmp}", "--no-fio"], {}, 1,
     "{tmp}: the benchmark's files need 64 TiB here, and "),
    (["build-root", "--out", "{tmp}/out", "--file", "{tmp}/nope:/x"], {}, 2,
     "{tmp}/nope is neither a file nor a folder"),
    (["build-root", "--out", "{tmp}/out", "--file", "{ok}:relative"], {"ok": b"x"}, 2,
     "expected SRC:/absolute/destination"),
    (["build-root", "--out", "{tmp}/out", "--extra", "nosuch"], {}, 2,
     "--extra nosuch: pod-init has no such extra"),
    # One owner per check: the core's, the same line from both commands.
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--node", "3"], {}, 2,
     "--node needs --hostfile: the cluster it is a node of"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--node", "3"], {}, 2,
     "--node needs --hostfile: the cluster it is a node of"),
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--channels", "33"], {},
     2, "--channels needs a whole number from 1 to 32"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--channels", "33"], {},
     2, "--channels: must be from 1 to 32"),
    # The second sweep (crashes, hangs, wrong shapes).
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{hosts}"],
     DEEP_LIST, 2, "expands to names longer than 255 characters"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{hosts}"],
     DEEP_LIST, 2, "expands to names longer than 255 characters"),
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{f}"],
     {"f": FIFO}, 2, "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hints", "{f}"],
     {"f": FIFO}, 2, "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    (["pyinit", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{f}"],
     {"f": FIFO}, 2, "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    ([*RUN, "--hostfile", "{f}", "--", "{ok}"], {"f": FIFO, "ok": b"pass\n"}, 2,
     "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    (["pyinit", "monitor", "--once", "--thresholds", "{f}"], {"f": FIFO}, 2,
     "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    (["pyinit", "topo", "--nvml-replay", "{f}"], {"f": FIFO}, 2,
     "{f}: a FIFO or pipe, not a regular file: give the path of a file to read"),
    (["pyinit", "timeline", "{tmp}"], {"events.jsonl": FIFO}, 2,
     "{tmp}/events.jsonl: a FIFO or pipe, not a regular file"),
    # A folder where a file is read is named as one (C++ and Python readers).
    (["pod-init", "nccl", "--sysfs-root", "{sys}", "--out", "{tmp}/out", "--hostfile", "{sys}"],
     {}, 2, "{sys}: a folder, not a regular file: give the path of a file to read"),
    (["pyinit", "monitor", "--once", "--thresholds", "{sys}"], {}, 2,
     "{sys}: a folder, not a regular file: give the path of a file to read"),
    (["pyinit", "shard", "{tmp}/in.jsonl.gz", "--out", "{tmp}/out", "--shards", "1"], ZEROED_GZ, 2,
     "{tmp}/in.jsonl.gz: damaged gzip stream"),
    (["pyinit", "timeline", "{tmp}"], events('{"event": "phase", "start": 1, "end": 2}'), 2,
     "{tmp}/events.jsonl:2: a phase event needs a name"),
    (["pyinit", "timeline", "{tmp}"], events('{"event": "phase", "name": "x", "end": 2}'), 2,
     "{tmp}/events.jsonl:2: a phase event needs start and end"),
    (["pyinit", "timeline", "{tmp}"], events('{"event": "phase", "name": "x", "start": "1", '
     '"end": 2}'), 2, "{tmp}/events.jsonl:2: start must be a finite number of seconds, not '1'"),
    (["pyinit", "timeline", "{tmp}"], events('{"event": "phase", "name": "x", "start": 1e999, '
     '"end": 2}'), 2, "start must be a finite number of seconds, not inf"),
    # A clock's nonsense (a phase from a billion seconds before power-on): the
    # bars are clipped to the axis, not drawn a billion seconds long.
    (["pyinit", "timeline", "{tmp}"], events(
        '{"event": "phase", "name": "kernel", "start": -1e9, "end": 2}',
        '{"event": "phase", "name": "supervisor start", "start": 2, "end": 3}'), 0, ""),
    (["pyinit", "report", "{tmp}"], events('{"event": "phase", "name": "x", "start": 1, '
     '"end": 2, "rank": [0]}'), 2, "{tmp}/events.jsonl:2: rank must be a whole number"),
    (["pyinit", "report", "{tmp}"], events('{"event": "end", "status": 0}'), 2,
     "{tmp}/events.jsonl:2: an end event needs its boottime"),
    (["pyinit", "report", "{tmp}"], events('{"event": "end", "boottime": "9"}'), 2,
     "{tmp}/events.jsonl:2: boottime must be a finite number of seconds"),
]  # fmt: skip


def command_line(words: list[str], fill: dict[str, str], pod_init_bin: Path) -> list[str]:
    tools = {
        "pod-init": [str(pod_init_bin)],
        "pod-init-nvml": [str(pod_init_bin.parent / "pod-init-nvml")],
        "pyinit": [str(pod_init_bin.parent / "pyinit")],
        "build": [sys.executable, str(BUILD), "--init", str(pod_init_bin)],
        "build-root": [sys.executable, str(BUILD_ROOT), "--init", str(pod_init_bin)],
    }
    return tools[words[0]] + [w.format(**fill) for w in words[1:]]


@pytest.mark.parametrize(("words", "files", "status", "message"), BAD_INPUT,
                         ids=[" ".join(row[0][:3]) for row in BAD_INPUT])  # fmt: skip
def test_bad_input_is_one_line_and_no_output(words, files, status, message, pod_init_bin,
                                             h200x2_tree, tmp_path):  # fmt: skip
    fill = {"tmp": str(tmp_path), "sys": str(h200x2_tree)}
    for name, data in files.items():
        if data is FIFO:
            os.mkfifo(tmp_path / name)
        else:
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_bytes(data)
        fill[name] = str(tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SLURM_"))}
    proc = subprocess.run(command_line(words, fill, pod_init_bin), capture_output=True,
                          timeout=30, env=env, cwd=tmp_path)  # fmt: skip
    err = proc.stderr.decode("utf-8")  # strict: no stray bytes reach the terminal
    assert proc.returncode == status, err
    assert message.format(**fill) in err, err
    assert "Traceback" not in err
    assert not any(c < " " and c != "\n" for c in err), repr(err)  # no control characters
    for folder in ("out", "run"):
        assert not (tmp_path / folder).exists(), f"{folder} was created for refused input"


def test_a_script_the_user_cannot_read_is_one_line_before_torchrun(pyinit_bin, tmp_path):
    script = tmp_path / "secret.py"
    script.write_text("print('ran')\n")
    script.chmod(0o600)
    command = [str(pyinit_bin), "run", "--run-dir", str(tmp_path / "run"), "--", str(script)]
    if os.geteuid() == 0:  # root reads any file: it runs without the capabilities that allow it
        os.chown(script, 65534, 65534)
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    else:
        script.chmod(0)
    proc = run(command, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"pyinit: {script}: a script this user cannot read (its mode or "
                           "owner): make it readable\n")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_bad_slurm_node_list_is_named(pyinit_bin, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    env = {**os.environ, "SLURM_JOB_NODELIST": "node[1-", "SLURM_NODEID": "0"}
    proc = run([pyinit_bin, "run", "--run-dir", tmp_path / "run", "--", script], env=env)
    assert proc.returncode == 2
    assert "SLURM_JOB_NODELIST='node[1-': " in proc.stderr


def test_rank_that_is_not_a_number_is_named(tmp_path):
    code = "from pyinit.data.dataset import _distributed_rank; _distributed_rank()"
    proc = run([sys.executable, "-c", code], env={**os.environ, "RANK": "x"}, cwd=tmp_path)
    assert "RANK='x' in the environment is not a whole number" in proc.stderr


def test_reader_arguments_are_value_errors(tmp_path):
    from pyinit import _native
    from pyinit.io import DirectReader, DirectWriter

    data = tmp_path / "data"
    data.write_bytes(bytes(8192))
    with DirectReader(data) as reader:
        for call, fragment in (
            (lambda: reader.read(0, 2**63), "length must be from 0 to 2**63 - 1"),
            (lambda: reader.read(-1, 10), "offset must be from 0"),
            (lambda: reader.read_batch(np.array([0.5, 4096.0]), 16), "must be whole numbers"),
            (lambda: reader.read_batch([0], 16, files=[0.0]), "must be whole numbers"),
        ):
            with pytest.raises(ValueError, match=fragment.replace("*", r"\*")):
                call()
    with pytest.raises(ValueError, match="queue_depth must be from 1 to 4096"):
        DirectReader(data, queue_depth=2**40)
    # Checked in the core, so the binding's own callers are held to it too.
    for opened in (DirectReader, DirectWriter, _native.DirectReader):
        with pytest.raises(ValueError, match=r"\\x00x: a path with a NUL byte"):
            opened(f"{data}\0x")


def test_a_fifo_in_the_tree_does_not_block_the_scan(pod_init_bin, pyinit_bin, fresh_8gpu):
    attribute = fresh_8gpu.paths["0000:04:00.0"] / "numa_node"
    attribute.unlink()
    os.mkfifo(attribute)
    os.unlink(fresh_8gpu.paths["0000:05:00.0"] / "config")
    os.mkfifo(fresh_8gpu.paths["0000:05:00.0"] / "config")
    for tool in (pod_init_bin, pyinit_bin):
        proc = run([tool, "topo", "--json", "--sysfs-root", fresh_8gpu.root])
        doc = json.loads(proc.stdout)
        messages = [f["message"] for f in doc["findings"] if f["code"] == "SYSFS_UNREADABLE"]
        assert any(m.startswith(str(attribute)) for m in messages), messages


def test_bytes_that_are_not_utf8_stay_out_of_the_json(pod_init_bin, pyinit_bin, fresh_8gpu):
    (fresh_8gpu.paths["0000:04:00.0"] / "numa_node").write_bytes(b"\xff\xfe\x1b[31m\n")
    proc = subprocess.run([pod_init_bin, "topo", "--json", "--sysfs-root", fresh_8gpu.root],
                          capture_output=True, timeout=20)  # fmt: skip
    doc = json.loads(proc.stdout.decode("utf-8"))  # strict UTF-8, valid JSON
    [bad] = [f for f in doc["findings"] if f["code"] == "SYSFS_MALFORMED"]
    assert "'\\xff\\xfe\\x1b[31m'" in bad["message"]
    text = subprocess.run([pyinit_bin, "topo", "--sysfs-root", fresh_8gpu.root, "--no-nvml"],
                          capture_output=True, timeout=20)  # fmt: skip
    assert b"\x1b" not in text.stdout and b"\xff" not in text.stdout
    assert "\\xff\\xfe" in text.stdout.decode("utf-8")


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
@pytest.mark.parametrize("call", ["read", "read_batch"])
def test_closing_under_reading_threads_is_a_clean_error(tmp_path, backend, call):
    from pyinit.io import DirectReader

    data = tmp_path / "data"
    data.write_bytes(os.urandom(16 << 20))
    for _round in range(3):
        reader = DirectReader(data, queue_depth=8, backend=backend)
        errors: list[BaseException] = []
        reads = [0]
        threads = [
            threading.Thread(target=read_until_closed, args=(reader, call, reads, errors))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        while reads[0] < 20:
            time.sleep(0.001)
        reader.close()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert len(errors) == 4
        assert all(type(e).__name__ == "InputError" and "closed reader" in str(e) for e in errors)


def read_until_closed(reader, call: str, reads: list[int], errors: list[BaseException]) -> None:
    rng = np.random.default_rng()
    try:
        while True:
            offsets = rng.integers(0, 4000, 16) * 4096
            if call == "read":
                reader.read(int(offsets[0]), 65536)
            else:
                reader.read_batch(offsets, 4096)
            reads[0] += 1
    except BaseException as e:  # what the thread met is the result
        errors.append(e)


def children_of(pid: int) -> set[int]:
    """Every live descendant of pid."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.slow
def test_kill_9_of_pyinit_run_leaves_nothing_running(pyinit_bin, tmp_path):
    script = tmp_path / "forever.py"
    script.write_text("import time\ntime.sleep(600)\n")
    proc = subprocess.Popen([pyinit_bin, "run", "--nproc-per-node", "2", "--monitor-interval",
                             "1", "--run-dir", tmp_path / "run", "--", script],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    # Wait for both workers: torchrun, its workers and the monitor all under pyinit run.
    while (
        len(list((tmp_path / "run" / "status").glob("attempt-*"))) == 0
        or len(children_of(proc.pid)) < 4
    ):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)
    time.sleep(1)
    kill_9_leaves_nothing(proc)


def kill_9_leaves_nothing(proc: subprocess.Popen) -> None:
    """kill -9 of proc: within 20 s, none of its descendants runs any more."""
    alive = children_of(proc.pid)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {p for p in alive if Path(f"/proc/{p}").exists() and not zombie(p)}
    assert not alive, f"still running after kill -9 of {' '.join(map(str, proc.args[:3]))}: {alive}"


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def shard_killed_at(tmp_path: Path, out: Path, stage: str, count: int = 4) -> None:
    """`pyinit shard` killed (SIGKILL, no cleanup) while writing or after it
    published 2 of `count` shards."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"record {i} " * 20}) + "\n" for i in range(400)))
    code = f"""
import os, signal
from pyinit.data import sharder
from pyinit.data.shard_format import ShardWriter
published = []
real_publish = ShardWriter.publish
def publish(self):
    if len(published) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    published.append(self)
    real_publish(self)
def finish(self):
    os.kill(os.getpid(), signal.SIGKILL)
if {stage!r} == "publishing":
    ShardWriter.publish = publish
else:
    ShardWriter.finish = finish
sharder.shard([{str(source)!r}], {str(out)!r}, {count}, force=True)
"""
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_kill_9_while_publishing_leaves_a_set_no_reader_takes(pyinit_bin, tmp_path):
    from pyinit.data import TokenShardDataset

    out = tmp_path / "shards"
    shard_killed_at(tmp_path, out, "publishing")
    whole = sorted(p.name for p in out.glob("shard-*.tok"))
    assert len(whole) == 2 and not (out / "shards.json").exists()
    assert len(list(out.glob(".shard-*.tmp-*"))) == 2
    with pytest.raises(ValueError, match=r"no shards\.json: not a whole set"):
        TokenShardDataset(out, 8, 0, 1)
    with pytest.raises(ValueError, match=r"2 of the 4 shards of this set are missing"):
        TokenShardDataset(sorted(out.glob("shard-*.tok")), 8, 0, 1)
    with pytest.raises(ValueError, match=r"shard 0 of 4 is given twice"):
        TokenShardDataset([out / whole[0], out / whole[0]], 8, 0, 1)
    # A rerun refuses the leftover shards without --force, and cleans up with it.
    source = tmp_path / "in.jsonl"
    again = run([pyinit_bin, "shard", source, "--out", out, "--shards", "4", "--quiet"])
    assert again.returncode == 2 and "--force" in again.stderr
    forced = run([pyinit_bin, "shard", source, "--out", out, "--shards", "4", "--force"])
    assert forced.returncode == 0, forced.stderr
    assert "removed 2 temporary shard files of an interrupted run" in forced.stdout
    assert not list(out.glob(".*tmp*"))
    assert len(TokenShardDataset(out, 8, 0, 1).paths) == 4


def test_kill_9_while_writing_leaves_temporaries_the_next_run_removes(pyinit_bin, tmp_path):
    out = tmp_path / "shards"
    shard_killed_at(tmp_path, out, "writing")
    assert len(list(out.glob(".shard-*.tmp-*"))) == 4 and not list(out.glob("shard-*"))
    rerun = run([pyinit_bin, "shard", tmp_path / "in.jsonl", "--out", out, "--shards", "2"])
    assert rerun.returncode == 0, rerun.stderr
    assert "removed 4 temporary shard files" in rerun.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "shard-00000-of-00002.tok", "shard-00001-of-00002.tok", "shards.json"
    ]  # fmt: skip


def test_shards_of_two_runs_are_not_mixed(tmp_path):
    from pyinit.data import TokenShardDataset, shard

    source, other = tmp_path / "in.jsonl", tmp_path / "other.jsonl"
    source.write_text("".join(json.dumps({"text": f"doc {i} " * 30}) + "\n" for i in range(200)))
    other.write_text("".join(json.dumps({"text": f"page {i} " * 30}) + "\n" for i in range(200)))
    shard([str(source)], str(tmp_path / "a"), 2)
    shard([str(other)], str(tmp_path / "b"), 2)  # another set: its run id differs
    a0, b1 = tmp_path / "a/shard-00000-of-00002.tok", tmp_path / "b/shard-00001-of-00002.tok"
    with pytest.raises(ValueError, match="come from different `pyinit shard` runs"):
        TokenShardDataset([a0, b1], 8, 0, 1)
    # A folder whose manifest names another run than its shards (a copy gone wrong).
    shutil.copy(b1, tmp_path / "a" / b1.name)
    with pytest.raises(ValueError, match="written by another run than the manifest names"):
        TokenShardDataset(tmp_path / "a", 8, 0, 1)


@pytest.mark.root
def test_a_full_disk_names_the_file_and_leaves_nothing_half_written(
    small_filesystem, pod_init_bin, pyinit_bin, h200x2_tree, tmp_path
):
    mount = small_filesystem
    nccl = mount / "nccl"
    first = run([pod_init_bin, "nccl", "--sysfs-root", h200x2_tree, "--out", nccl])
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in nccl.iterdir()}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": "x" * 2000}) + "\n" for _ in range(2000)))
    fill(mount)
    # The NCCL files: the previous set stays whole, no temporary is left.
    again = run([pod_init_bin, "nccl", "--sysfs-root", h200x2_tree, "--out", nccl,
                 "--force-rings"])  # fmt: skip
    assert again.returncode == 1
    assert "No space left on device" in again.stderr and str(nccl) in again.stderr
    assert {p.name: p.read_bytes() for p in nccl.iterdir()} == before
    # The sharder: exit 1 naming a file, no shard, no temporary, no manifest.
    shards = mount / "shards"
    result = run([pyinit_bin, "shard", source, "--out", shards, "--shards", "2", "--quiet"])
    assert result.returncode == 1, result.stderr
    assert "No space left on device" in result.stderr and str(shards) in result.stderr
    assert not shards.exists()
    # The boot image builder.
    image = run([sys.executable, BUILD, "--init", pod_init_bin, "--out", mount / "boot.img"])
    assert image.returncode == 1 and "No space left on device" in image.stderr
    assert "Traceback" not in image.stderr
    assert sorted(p.name for p in mount.iterdir()) == ["filler", "lost+found", "nccl"]


def test_too_many_shards_for_the_open_file_limit(pyinit_bin, tmp_path):
    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) is not installed")
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"r{i}"}) + "\n" for i in range(1200)))
    out = tmp_path / "out"
    proc = run(["prlimit", "--nofile=1024:1024", pyinit_bin, "shard", source, "--out", out,
                "--shards", "1100"])  # fmt: skip
    assert proc.returncode == 2
    assert "--shards 1100 keeps 1100 files open" in proc.stderr and "at most 1024" in proc.stderr
    assert not out.exists()
    # Below the hard limit the soft one is raised as needed.
    proc = run(["prlimit", "--nofile=256:4096", pyinit_bin, "shard", source, "--out", out,
                "--shards", "1100", "--quiet"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(list(out.glob("shard-*.tok"))) == 1100


@pytest.mark.parametrize("kind", ["relative", "a file", "open to others"])
def test_a_bad_bytecode_cache_is_one_line(pyinit_bin, tmp_path, kind):
    """A relative PYINIT_BYTECODE_CACHE is bad usage; a folder that is a file
    or that others could write is refused in one line, and the run goes on
    compiling from source."""
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    cache = tmp_path / "cache"
    if kind == "a file":
        cache.write_text("not a folder\n")
    elif kind == "open to others":
        cache.mkdir()
        cache.chmod(0o777)
    env = dict(os.environ, PYINIT_BYTECODE_CACHE="cache" if kind == "relative" else str(cache))
    proc = subprocess.run([pyinit_bin, "run", "--cold", "--nproc-per-node", "1", "--run-dir",
                           tmp_path / "run", "--", script], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path)  # fmt: skip
    said = [line for line in proc.stderr.splitlines() if "cache" in line]
    if kind == "relative":
        assert proc.returncode == 2 and not (tmp_path / "run").exists()
        assert said == ["pyinit: PYINIT_BYTECODE_CACHE='cache' is not an absolute path (a "
                        "folder, or off)"]  # fmt: skip
        return
    why = "not a folder" if kind == "a file" else "mode 0777 lets others in (0700 wanted)"
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "ran", proc.stderr
    assert said == [f"pyinit: {cache}: the bytecode cache is refused: {why}; compiling from "
                    "source"]  # fmt: skip
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("closed", [">&-", "<&-", ">&- <&-"])
def test_a_command_started_with_stdio_closed_does_its_work_without_a_traceback(
        pyinit_bin, tmp_path, closed):  # fmt: skip
    """`pyinit check >&-`: Python has no stdout then, and a print raised as
    a bug's traceback. The check still runs and returns its status; a
    closed stdout is said in one line."""
    done = subprocess.run(["bash", "-c", f"'{pyinit_bin}' check --no-nvml {closed}; echo $? > "
                           f"'{tmp_path}/status'"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert "Traceback" not in done.stderr
    assert (tmp_path / "status").read_text().strip() in ("0", "1", "2")
    if ">&-" in closed:
        said = "pyinit: stdout is closed; what the command prints there is discarded\n"
        assert done.stderr == said
    else:
        assert done.stderr == ""


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_a_run_started_with_stdout_or_stderr_closed_gives_its_script_dev_null(
        pyinit_bin, tmp_path, closed):  # fmt: skip
    """The stand-in for a closed stdout or stderr was closed again at the
    exec of pod-init, so the workers found the number free: their stream
    was None (a traceback vanished) and the descriptor was torchrun's agent
    log, which the next native print would have written into."""
    (tmp_path / "where.py").write_text(
        "import os, sys\n"
        "with open(sys.argv[1], 'w') as out:\n"
        "    for name, number in (('stdout', 1), ('stderr', 2)):\n"
        "        out.write(f'{name} {getattr(sys, name) is not None} "
        "{os.readlink(f\"/proc/self/fd/{number}\")}\\n')\n")  # fmt: skip
    done = subprocess.run(["bash", "-c", f"'{pyinit_bin}' run --cold --nproc-per-node 1 "
                           f"--run-dir '{tmp_path}/run' -- where.py '{tmp_path}/seen' {closed}"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in (tmp_path / "seen").read_text().splitlines())
    closed_name = "stdout" if closed == ">&-" else "stderr"
    assert seen[closed_name] == f"True {os.devnull}"
