"""`pyinit bench allreduce` and the other collectives, `p2p` and `h2d`: the
sweeps run for real (gloo on CPU here, NCCL on GPU machines) and
report nccl-tests' sizes and columns;
the copy benchmarks measure where there are GPUs and refuse plainly where
there are none."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest
import torch

from pyinit.bench.collectives import COLLECTIVES
from pyinit.nccl.timing import nccl_tests_sizes


def test_sizes_step_as_nccl_tests():
    # all_reduce_perf -b 8 -e 128M -f 2 steps 8, 16, ... 128M; -f 1 adds -i.
    sizes = nccl_tests_sizes(8, 128 << 20, 2, 1 << 20)
    assert sizes[0] == 8 and sizes[-1] == 128 << 20 and len(sizes) == 25
    assert nccl_tests_sizes(1024, 4096, 1, 1024) == [1024, 2048, 3072, 4096]
    assert nccl_tests_sizes(8, 100, 4, 0) == [8, 32]


# (size given, ranks, datatype bytes) -> (bytes, count) in nccl-tests' first two columns,
# as all_gather_perf / reduce_scatter_perf / alltoall_perf -g 8 print them.
@pytest.mark.parametrize(
    "command, size, ranks, word, printed",
    [
        ("allreduce", 8, 8, 4, (8, 2)),
        ("allgather", 64, 8, 4, (0, 0)),
        ("allgather", 128, 8, 4, (128, 4)),
        ("allgather", 1 << 20, 2, 4, (1 << 20, 131072)),
        ("reducescatter", 128, 8, 4, (128, 4)),
        ("reducescatter", 100, 2, 1, (96, 48)),
        ("alltoall", 128, 8, 4, (128, 4)),
        ("broadcast", 12, 8, 2, (12, 6)),
    ],
)
def test_sizes_and_counts_as_nccl_tests(command, size, ranks, word, printed):
    send, receive, count = COLLECTIVES[command].counts(size, word, ranks)
    assert (max(send, receive) * word, count) == printed


def test_bus_factors_as_nccl_tests():
    factors = {c: COLLECTIVES[c].bus_factor(8) for c in COLLECTIVES}
    split = {"allgather": 0.875, "reducescatter": 0.875, "alltoall": 0.875}
    assert factors == pytest.approx({"allreduce": 1.75, "broadcast": 1, **split})


@pytest.mark.parametrize("command", sorted(COLLECTIVES))
def test_collective_sweep(pyinit_bin, tmp_path, command):
    collective = COLLECTIVES[command]
    ranks = torch.cuda.device_count() or 2  # one rank per GPU, or two on gloo
    flags = ["-g", str(ranks), "-b", "8", "-e", "64K", "-f", "4", "-n", "3", "-w", "1"]
    flags += ["-d", "half"] if command == "broadcast" else []
    flags += ["-o", "max"] if collective.reduces else []
    scratch = tmp_path / "tmp"  # torchrun's default log folder went here, and stayed
    scratch.mkdir()
    result = subprocess.run(
        [pyinit_bin, "bench", command, *flags, "--out", tmp_path],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(scratch.iterdir())
    lines = result.stdout.splitlines()
    assert lines[3].split()[1:6] == ["size", "count", "type", "redop", "root"]
    assert f"{command} [7/7] " in result.stderr  # progress, one line per size
    assert "# Out of bounds values : 0 OK" in lines
    document = json.loads((tmp_path / f"{command}.json").read_text())
    assert document["ranks"] == ranks and document["collective"] == collective.name
    rows = document["results"]
    assert len(rows) == 7
    word = 2 if command == "broadcast" else 4
    cells = []
    for row, size in zip(rows, nccl_tests_sizes(8, 64 << 10, 4, 0), strict=True):
        send, receive, count = collective.counts(size, word, ranks)
        assert (row["size"], row["count"]) == (max(send, receive) * word, count)
        for mode, supported in (("out_of_place", collective.out_of_place),
                                ("in_place", collective.in_place)):  # fmt: skip
            cell = row[mode]
            assert (cell is not None) == supported
            if cell is None:
                continue
            assert cell["nwrong"] == 0
            assert cell["bus_bw"] == pytest.approx(cell["alg_bw"] * collective.bus_factor(ranks))
            moved = collective.algbw_bytes(count, word, ranks)
            assert cell["alg_bw"] == pytest.approx(moved / cell["time"] / 1e3, rel=1e-6)
            cells.append(cell["bus_bw"])
    average = next(line for line in lines if line.startswith("# Avg bus bandwidth"))
    assert float(average.split(":")[1]) == pytest.approx(sum(cells) / len(cells), rel=1e-4)
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / f"{command}.png").stat().st_size > 0


def test_collective_bad_flags(pyinit_bin, tmp_path):
    cases = (
        (["-o", "avg"], "gloo has no average"),
        (["-b", "1M", "-e", "1K"], "above"),
        (["-d", "mulsum"], "invalid choice"),
    )
    for flags, words in cases:
        if flags[0] == "-o" and torch.cuda.is_available():
            continue
        result = subprocess.run([pyinit_bin, "bench", "allreduce", *flags, "--out", tmp_path],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_more_ranks_than_gpus_is_one_line(pyinit_bin, tmp_path):
    """Once torch's `invalid device ordinal` traceback from every worker."""
    ranks = torch.cuda.device_count() + 1
    result = subprocess.run([pyinit_bin, "bench", "allreduce", "-g", str(ranks), "--out", tmp_path],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"-g {ranks}: this node has {ranks - 1} GPU" in result.stderr
