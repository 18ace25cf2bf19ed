"""NCCL configuration against the real driver and NCCL (the lent GPU machines).

Skipped, with the reason printed, where there is no NVIDIA driver or fewer
than two GPUs: NVML and NCCL cannot run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyinit.nvml import NvmlUnavailable, read_nvml

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


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
