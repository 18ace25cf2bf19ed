"""A user's first minutes: `pip install .` without extras in a fresh virtual
environment, then every subcommand's minimal invocation either works or says
in one line which extra it needs (exit 2, no traceback); the source tree
imported without its compiled module says what to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import sysfs_fixtures

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """packaging/release's folder: the sdist and the manylinux wheel it built
    and tried in a venv of its own."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(["bash", REPO / "packaging" / "release", dist], capture_output=True,
                           text=True, timeout=1200)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    assert "pod-init 0." in built.stdout and "release: " in built.stdout
    return dist


@pytest.fixture(scope="module")
def bare_env(release, tmp_path_factory) -> Path:
    """A virtual environment holding the release wheel and its required dependencies only."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    venv.create(env, with_pip=True)
    wheel = next(release.glob("pod_init-*manylinux*.whl"))
    installed = subprocess.run([env / "bin/pip", "install", "-q", wheel],
                               capture_output=True, text=True)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    return env


@pytest.mark.slow
def test_the_release_is_an_sdist_and_a_manylinux_wheel(release):
    import tarfile
    import zipfile

    wheel = next(release.glob("pod_init-*.whl"))
    assert re.search(r"-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(n.endswith("/scripts/pod-init") for n in names)  # the static executable
    assert any(re.search(r"pyinit/_native\..*\.so$", n) for n in names)
    with tarfile.open(next(release.glob("pod_init-*.tar.gz"))) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "CMakeLists.txt", "csrc/init/supervisor.cpp"} <= members
    assert not any(m.startswith((".venv/", "build/", "bench/results/")) for m in members)


# The reader's plain calls, a stream and a crash-safe write, with numpy alone.
IO_WALK = """
import sys
import numpy as np
from pyinit.io import DirectReader, verify, write_file
with DirectReader(sys.argv[1]) as reader:
    rows = [row.tobytes() for row in reader.stream(np.arange(8) * 4096, 100, depth=4)]
    assert rows[3] == reader.read(3 * 4096, 100).tobytes()
    write_file("copy.bin", reader.read_batch(np.arange(8) * 4096, 100))
assert verify("copy.bin") and open("copy.bin", "rb").read() == b"".join(rows)
print("written and streamed")
"""


@pytest.mark.slow
def test_every_command_works_or_names_its_extra(bare_env, tmp_path):
    sysfs = tmp_path / "sys"
    sysfs_fixtures.build_h200x2(sysfs)
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"text": "hello world"}\n{"text": "another record"}\n')
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1 << 20))
    (tmp_path / "t.json").write_text("{}")
    hosts64 = tmp_path / "hosts64"
    hosts64.write_text("".join(f"10.1.0.{i + 1}\n" for i in range(64)))
    pyinit = str(bare_env / "bin/pyinit")
    cases = [
        ([pyinit, "--version"], 0, "pyinit "),
        ([pyinit, "topo", "--sysfs-root", sysfs, "--no-nvml"], 0, "GPU0"),
        ([pyinit, "nccl", "--sysfs-root", sysfs, "--out", tmp_path / "nccl", "--no-nvml"], 0,
         "wrote:"),
        ([pyinit, "shard", corpus, "--out", tmp_path / "shards", "--shards", "1"], 0, "records"),
        ([pyinit, "shard", corpus, "--out", tmp_path / "s2", "--shards", "1", "--tokenizer",
          tmp_path / "t.json"], 2, "pip install 'pod-init[tokenizers]'"),
        # A mistyped tokenizer path is said before the missing package.
        ([pyinit, "shard", corpus, "--out", tmp_path / "s2", "--shards", "1", "--tokenizer",
          tmp_path / "nope.json"], 1, "nope.json: no such tokenizer file"),
        ([pyinit, "run", "--", corpus], 2, "pyinit run (torchrun) needs torch: pip install "
         "'pod-init[train]'"),
        ([pyinit, "monitor", "--once", "--json", "--interval", "0.1"], 0, '"block"'),
        ([pyinit, "bench", "io", "--no-fio", "--runtime", "0.2", "--rounds", "1", data], 0,
         "pip install 'pod-init[plots]'"),
        ([pyinit, "bench", "data"], 2, "pip install 'pod-init[train]'"),
        ([pyinit, "bench", "allreduce"], 2, "pip install 'pod-init[train]'"),
        ([pyinit, "bench", "p2p"], 2, "pip install 'pod-init[train]'"),
        ([pyinit, "bench", "allgather"], 2, "pip install 'pod-init[train]'"),
        ([pyinit, "check", "--sysfs-root", sysfs, "--kmsg", os.devnull], 1,
         "POD-INIT CHECK WARNING"),  # the fixture binds GPUs to nvidia; no NVML here
        ([pyinit, "timeline", REPO / "tests/data/qemu-training-events.jsonl"], 0,
         "first step done on every rank"),
        ([pyinit, "timeline", REPO / "tests/data/qemu-training-events.jsonl", "--png",
          tmp_path / "t.png"], 2, "pip install 'pod-init[plots]'"),
        # A folder that is not a run's is named before the missing package.
        ([pyinit, "timeline", sysfs, "--png", tmp_path / "t.png"], 2,
         "not a pyinit run folder"),
        ([bare_env / "bin/python", "-c", "from pyinit.data import TokenShardDataset"], 1,
         "pip install 'pod-init[train]'"),
        ([bare_env / "bin/python", "-c", "from pyinit import checkpoint"], 1,
         "pyinit.checkpoint needs torch: pip install 'pod-init[train]'"),
        ([pyinit, "bench", "checkpoint"], 2, "pip install 'pod-init[train]'"),
        ([pyinit, "warm", "start"], 2, "pyinit warm start needs torch: pip install "
         "'pod-init[train]'"),
        *(([pyinit, "bench", kind, "--help"], 0, f"usage: pyinit bench {kind}")
          for kind in ("data", "checkpoint", "allreduce", "broadcast", "p2p", "h2d")),
        ([pyinit, "report", REPO / "tests/data/run-report", "--out", tmp_path / "r.html",
          "--price-per-gpu-hour", "2"], 0, "effective training time 62.2%"),
        ([pyinit, "nccl", "--sysfs-root", sysfs, "--no-nvml", "--hostfile", hosts64, "--node",
          "63", "--out", tmp_path / "n63"], 0, "this is node-63"),
        ([bare_env / "bin/python", "-c", IO_WALK, data], 0, "written and streamed"),
        # Bad usage is its own one line: no note about the missing plot before it.
        ([pyinit, "bench", "io", "--bs", "1000", data], 2, "pyinit: --bs 1000 is not a multiple"),
        ([pyinit, "bench", "io", "--no-fio", "--runtime", "0.2", "--rounds", "1", data,
          "--out", tmp_path / "io"], 0, f"wrote {tmp_path / 'io' / 'io.json'}\n"),
    ]  # fmt: skip
    for command, status, fragment in cases:
        proc = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # fmt: skip
        shown = proc.stdout + proc.stderr
        assert proc.returncode == status, (command, shown[-2000:])
        assert fragment in shown, (command, shown[-2000:])
        if status != 1:
            assert "Traceback" not in shown, (command, shown[-2000:])
        if status == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, (command, proc.stderr)


def test_the_source_tree_without_its_module_says_what_to_do():
    # -S: without site-packages, so no installed or editable copy can supply the module.
    proc = subprocess.run([sys.executable, "-S", "-c", "import pyinit; pyinit.scan"],
                          capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pyinit._native is not built in ")
    assert "pip install ." in last
