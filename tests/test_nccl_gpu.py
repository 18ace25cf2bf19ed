"""NCCL configuration against the real driver and NCCL (GPU machines).

Skipped, with the reason printed, where there is no NVIDIA driver or fewer
than two GPUs: NVML and NCCL cannot run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_events

from pyinit.nccl.timing import MULTICAST_OFF
from pyinit.nvml import NvmlUnavailable, read_nvml


def _nvml_view():
    try:
        return read_nvml()
    except NvmlUnavailable as e:
        pytest.skip(f"no NVML here: {e}")


pytestmark = pytest.mark.gpu


def test_nvml_view_matches_sysfs():
    from pyinit.topology import scan

    view = _nvml_view()
    topo = scan("/sys", probe_bar0=False, nvml=view)
    gpus = [d.bdf for d in topo.devices if d.kind == "gpu"]
    assert [g.bdf for g in view.gpus] == gpus  # NVML's index order is PCI order
    for pair in view.pairs:
        a, b = gpus[pair.a], gpus[pair.b]
        assert pair.common_ancestor == topo.matrix.level(a, b)
        if view.gpus[pair.a].nvlinks and view.gpus[pair.b].nvlinks:
            assert topo.matrix.cell(a, b).startswith("NV")
            assert pair.p2p["nvlink"] == "OK"


def test_nccl_loads_the_topology_file_and_sums_right(tmp_path: Path, pyinit_bin: Path):
    view = _nvml_view()
    if len(view.gpus) < 2:
        pytest.skip(f"{len(view.gpus)} GPU here; an all-reduce needs two")
    subprocess.run([str(pyinit_bin), "nccl", "--out", str(tmp_path)], check=True)
    xml = (tmp_path / "nccl-topo.xml").read_text()
    assert "<nvlink " in xml or not view.gpus[0].nvlinks
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(MULTICAST_OFF)
    for line in (tmp_path / "nccl.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"})
    result = tmp_path / "allreduce.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--log-dir={tmp_path / 'torchrun'}",  # not a new /tmp folder that stays
            "--nproc-per-node=2",
            "-m",
            "pyinit.bench.collectives",
            "all_reduce",
            "--sizes",
            "4M,64M",
            "--iterations",
            "5",
            "--out",
            str(result),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert f"NCCL_TOPO_FILE set by environment to {tmp_path}/nccl-topo.xml" in log
    import json

    rows = json.loads(result.read_text())["results"]
    assert [r["in_place"]["nwrong"] for r in rows] == [0, 0]
    assert all(r["in_place"]["bus_bw"] > 0 for r in rows)


ALLREDUCE_SCRIPT = """\
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
n = dist.get_world_size()
wrong = 0
for size in (1 << 10, 1 << 20, 64 << 20):
    x = torch.full((size // 4,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(x)
    wrong += int((x != n * (n + 1) / 2).sum())
print(f"#wrong {wrong}", flush=True)
dist.destroy_process_group()
"""


def _tuning_for(ranks: int, nccl_version: str, rules: list[dict]):
    """A table for this node as --tune would write it, with the given rules."""
    from pyinit.nccl.tuning import Tuning, installed_nccl_version, node_kind
    from pyinit.topology import scan

    view = _nvml_view()
    version = installed_nccl_version()
    key = node_kind(scan("/sys", probe_bar0=False), view, version or "unknown")
    key = type(key)(**{**key.to_dict(), "nvlinks": key.nvlinks, "nccl_version": nccl_version})
    return Tuning(key, ranks, 1, 0, {}, [], rules)


def _torch_nccl_version() -> str:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return ".".join(map(str, torch.cuda.nccl.version()))


RING_EVERYWHERE = [{"collective": "allreduce", "min_bytes": 0, "max_bytes": 1 << 40,
                    "algorithm": "ring", "protocol": "simple", "channels": 2}]  # fmt: skip


@pytest.mark.parametrize("stale", [False, True])
def test_nccl_loads_the_tuner_plugin_and_refuses_a_stale_table(tmp_path: Path, stale: bool):
    """NCCL itself loads the plugin; the plugin takes a table of this NCCL
    and refuses one of another, and the sums are right either way."""
    from pyinit.nccl.tuning import TABLE_ENV, installed_nccl_version, plugin_path, write_table

    version = _torch_nccl_version()
    # pyinit run knows NCCL's version from its package without loading it: the same one.
    assert installed_nccl_version() in (None, version)
    ranks = min(len(_nvml_view().gpus), 2)
    tuning = _tuning_for(ranks, "2.0.0" if stale else version, RING_EVERYWHERE)
    table = write_table(tmp_path / "t.json", tuning)
    (tmp_path / "allreduce.py").write_text(ALLREDUCE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(MULTICAST_OFF, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING",
               NCCL_TUNER_PLUGIN=str(plugin_path()), **{TABLE_ENV: str(table)})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--log-dir={tmp_path / 'torchrun'}", f"--nproc-per-node={ranks}",
         str(tmp_path / "allreduce.py")],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert f"Successfully loaded external tuner plugin {plugin_path()}" in log
    assert "TUNER/Plugin: Using pod-init (v5)" in log
    if stale:
        assert f"{table} was measured with NCCL 2.0.0, this is NCCL {version}" in log
    else:
        assert f"pod-init tuner: {table}: 1 rules for NCCL {version}, {ranks} ranks" in log
    assert log.count("#wrong 0") == ranks


def test_pyinit_run_uses_the_cached_tuning(tmp_path: Path, pyinit_bin: Path):
    from pyinit.nccl.tuning import installed_nccl_version
    from pyinit.nccl.tuning_cache import store

    version = _torch_nccl_version()
    if installed_nccl_version() is None:
        pytest.skip("NCCL did not come from an nvidia-nccl-cu* package here: pyinit run "
                    "cannot know its version without loading it")  # fmt: skip
    ranks = min(len(_nvml_view().gpus), 2)
    tuning = _tuning_for(ranks, version, RING_EVERYWHERE)
    store(tuning, tmp_path / "cache" / "nccl-tuning")
    (tmp_path / "allreduce.py").write_text(ALLREDUCE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(MULTICAST_OFF, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING",
               POD_INIT_CACHE=str(tmp_path / "cache"))  # fmt: skip
    done = subprocess.run(
        [str(pyinit_bin), "run", "--nproc-per-node", str(ranks), "--run-dir",
         str(tmp_path / "run"), "--monitor-interval", "0", str(tmp_path / "allreduce.py")],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    table = tmp_path / "run" / "nccl" / "nccl-tuning.json"
    assert f"pod-init tuner: {table}: 1 rules for NCCL {version}, {ranks} ranks" in log
    assert log.count("#wrong 0") == ranks
    events = run_events(tmp_path / "run")
    used = [e for e in events if e.get("event") == "nccl_tuning"]
    assert used and used[0]["used"] is True and used[0]["key"] == tuning.key.id


def test_tune_on_this_node(tmp_path: Path, pyinit_bin: Path):
    view = _nvml_view()
    if len(view.gpus) < 2:
        pytest.skip(f"{len(view.gpus)} GPU here; tuning times collectives between two or more")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(MULTICAST_OFF)
    command = [str(pyinit_bin), "nccl", "--tune", "--cache", str(tmp_path / "cache"),
               "--out", str(tmp_path / "out")]  # fmt: skip
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    from pyinit.nccl.tuning import read_table

    tuning = read_table(tmp_path / "out" / "nccl-tuning.json")
    assert tuning.seconds < 60
    assert {r.collective for r in tuning.results} == {"allreduce", "reducescatter", "allgather"}
    again = subprocess.run(command, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "measured before on this kind of node" in again.stderr
