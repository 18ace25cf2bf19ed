"""`pyinit bench allreduce`, `p2p` and `h2d`: the sweep runs for real (gloo
on CPU here, NCCL on the lent GPU machines) and reports nccl-tests' columns;
the copy benchmarks measure where there are GPUs and refuse plainly where
there are none."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
import torch

from pyinit.bench.allreduce import bus_factor, sweep


def test_sweep_and_bus_factor():
    assert sweep(8, 64, 2) == [8, 16, 32, 64]
    sizes = sweep(8, 4 << 30, 4)
    assert sizes[0] == 8 and sizes[-1] == 2 << 30 and len(sizes) == 15
    assert bus_factor(2) == 1.0 and bus_factor(8) == pytest.approx(1.75)


def test_allreduce_sweep(pyinit_bin, tmp_path):
    ranks = max(2, torch.cuda.device_count())
    result = subprocess.run(
        [pyinit_bin, "bench", "allreduce", "--nproc", str(ranks), "--max", "64K", "--factor", "4",
         "--iterations", "3", "--warmup", "1", "--out", tmp_path],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    header = result.stdout.splitlines()[0].split()
    assert header[:4] == ["size", "count", "type", "redop"] and header[-1] == "#wrong"
    assert "allreduce [7/7] 32K" in result.stderr  # progress, one line per size
    document = json.loads((tmp_path / "allreduce.json").read_text())
    assert document["ranks"] == ranks
    rows = document["rows"]
    assert [r["size"] for r in rows] == sweep(8, 64 << 10, 4)
    for row in rows:
        assert row["wrong"] == 0 and row["count"] == row["size"] // 4
        assert row["busbw"] == pytest.approx(row["algbw"] * bus_factor(ranks))
        assert row["algbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3, rel=1e-6)
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "allreduce.png").stat().st_size > 0


@pytest.mark.parametrize("kind", ["p2p", "h2d"])
def test_copy_benchmarks(pyinit_bin, tmp_path, kind):
    needed = 2 if kind == "p2p" else 1
    gpus = torch.cuda.device_count()
    result = subprocess.run(
        [pyinit_bin, "bench", kind, "--size", "64M", "--iterations", "3", "--out", tmp_path],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    if gpus < needed:
        assert result.returncode == 1
        assert f"needs {needed} CUDA GPU" in result.stderr and "Traceback" not in result.stderr
        return
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / f"{kind}.json").read_text())
    if kind == "p2p":
        matrix = document["unidirectional_gbs"]
        assert len(matrix) == gpus
        assert all(
            (v is None) == (a == b) for a, row in enumerate(matrix) for b, v in enumerate(row)
        )
        assert all(v > 1 for row in matrix for v in row if v is not None)
    else:
        assert [r["gpu"] for r in document["rows"]] == list(range(gpus))
        assert all(r["h2d_gbs"] > 1 and r["d2h_gbs"] > 1 for r in document["rows"])
