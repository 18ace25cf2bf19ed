"""Compiled models under pyinit run: the compile's phases in the event log,
the timeline and the report, and inductor's caches found again by a
restarted worker group (inductor's C++ backend on CPU, two gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import BIN_DIR

PYINIT = str(BIN_DIR / "pyinit")

# A compiled model in DDP; rank 1 of the first attempt is KILLed after its
# third step when asked, so torchrun restarts the group.
COMPILED = """
import os, signal, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
model = torch.nn.parallel.DistributedDataParallel(torch.compile(net))
optimizer = torch.optim.AdamW(model.parameters())
for step in range(1, 6):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    if (step == 3 and "--kill" in sys.argv and dist.get_rank() == 1
            and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
"""


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_compile_is_phases_and_a_restart_finds_inductors_cache(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    run_dir = tmp_path / "run"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    result = subprocess.run([PYINIT, "run", "--nproc-per-node", "2", "--max-restarts", "1",
                             "--run-dir", str(run_dir), "--", str(script), "--kill"], env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    log = events(run_dir)
    for attempt in (0, 1):
        phases = [e for e in log if e["event"] == "phase" and e.get("attempt") == attempt]
        for rank in (0, 1):
            mine = {e["name"]: e for e in phases if e.get("rank") == rank}
            # A backward graph is compiled at the first backward; one found in
            # AOTAutograd's cache comes with its forward.
            backward = {"compile: backward"} if attempt == 0 else set()
            assert {"compile: dynamo", "compile: inductor", *backward} <= set(mine), attempt
            first_forward = mine["first forward"]
            inductor = mine["compile: inductor"]
            assert first_forward["start"] <= inductor["start"] <= inductor["end"]
            assert inductor["end"] <= first_forward["end"] + 1e-6
    summaries = {(e["attempt"], e["rank"]): e for e in log
                 if e["event"] == "compile summary" and e["at"] == "first step"}  # fmt: skip
    assert set(summaries) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for rank in (0, 1):
        first, again = summaries[0, rank], summaries[1, rank]
        assert first["graphs"] >= 1 and first["inductor_cache_misses"] >= 1
        # The restarted group compiles nothing: inductor's cache on disk (and
        # AOTAutograd's) has every graph the first attempt made.
        assert again["graphs"] >= 1
        assert again["inductor_cache_misses"] == 0 and again["aot_cache_misses"] == 0
        assert again["inductor_cache_hits"] >= 1 or again["aot_cache_hits"] >= 1
    timeline = subprocess.run([PYINIT, "timeline", str(run_dir)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    assert timeline.returncode == 0, timeline.stderr
    assert "compile: inductor (compile or cache load)" in timeline.stdout
    assert "inductor cache lookups hit" in timeline.stdout
    restart = next(x for x in timeline.stdout.splitlines() if x.startswith("restart 1:"))
    assert "inductor" in restart and "dynamo" in restart
