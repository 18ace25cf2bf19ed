"""Compiled models under pyinit run: the compile's phases in the event log,
the timeline and the report, and inductor's caches found again by a
restarted worker group (inductor's C++ backend on CPU, two gloo ranks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN_DIR
from conftest import run_events as events

PYINIT = str(BIN_DIR / "pyinit")

# A compiled model in DDP, its 2 MiB of weights in two of DDP's buckets (so
# torch splits the graph there, as it does for any model past 1 MiB); rank 1
# of the first attempt is KILLed after its third step when asked, so torchrun
# restarts the group.
COMPILED = """
import gc, os, signal, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if "--freeze-counts" in sys.argv:  # what this worker was forked with, out of the collector's reach
    name = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{dist.get_rank()}"
    with open(os.path.join(sys.argv[sys.argv.index("--freeze-counts") + 1], name), "w") as f:
        f.write(str(gc.get_freeze_count()))
torch.manual_seed(0)
# --one-graph: no DDP optimizer, so AOTAutograd's cache answers for the graph.
torch._dynamo.config.optimize_ddp = "--one-graph" not in sys.argv
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16384),
                          torch.nn.GELU(), torch.nn.Linear(16384, 4))
model = torch.nn.parallel.DistributedDataParallel(torch.compile(net), bucket_cap_mb=1)
optimizer = torch.optim.AdamW(model.parameters())
losses = []
for step in range(1, 6):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    losses.append(loss.item())
    optimizer.step()
    optimizer.zero_grad()
    if (step == 3 and "--kill" in sys.argv and dist.get_rank() == 1
            and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
        os.kill(os.getpid(), signal.SIGKILL)
print(f"rank {dist.get_rank()} losses {losses}")
dist.destroy_process_group()
"""
# torch's own rule for DDP's pieces: AOTAutograd's cache passes them over.
TORCHS_AOT_CACHE = {"PYINIT_DDP_AOT_CACHE": "off"}


@pytest.mark.slow
def test_the_compile_is_phases_and_a_restart_finds_inductors_cache(tmp_path):
    """With torch's own rule for DDP's pieces (past AOTAutograd's cache), so
    that the restart traces them again and finds where its rank did."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    run_dir = tmp_path / "run"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), **TORCHS_AOT_CACHE)
    result = subprocess.run([PYINIT, "run", "--nproc-per-node", "2", "--max-restarts", "1",
                             "--run-dir", str(run_dir), "--", str(script), "--kill",
                             "--freeze-counts", str(tmp_path)], env=env,
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
            # On the CPU the patterns stay inside the compile (pyinit.run.pattern_setup).
            assert "compile: pattern set-up" not in mine
    # The agent imported the compile set once the first compile began, so the
    # restarted workers were forked with it (the first, cold, were not).
    starts = {(e["attempt"], e["rank"]): e for e in log
              if e["event"] == "phase" and e["name"] == "worker start"}  # fmt: skip
    loaded = {key: start["compile_loaded"] for key, start in starts.items()}
    assert loaded == {(0, 0): False, (0, 1): False, (1, 0): True, (1, 1): True}
    # ... and frozen out of the collector's reach, as the agent's own imports
    # are: a restarted worker's collections pass over none of it.
    frozen = {name: int((tmp_path / name).read_text()) for name in ("0-0", "0-1", "1-0", "1-1")}
    for rank in (0, 1):
        assert frozen[f"1-{rank}"] > frozen[f"0-{rank}"] + 100_000, frozen
    # The device each rank's first step compiled past AOTAutograd's cache on,
    # found by its restart through the agent's memory (for a GPU, the patterns'
    # thread starts from it).
    noted = {key: start["last_compiled_on"] for key, start in starts.items()}
    assert noted == {(0, 0): None, (0, 1): None, (1, 0): "cpu", (1, 1): "cpu"}
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
        # torch's DDP optimizer splits the graph at the buckets, and AOTAutograd
        # will not cache the pieces: the timeline names them, and what tracing
        # them again took.
        assert again["aot_cache_bypasses"] >= 1
        assert again["aot_trace_s"] > 0
        assert first["pattern_setups"] == again["pattern_setups"] == 1
    timeline = subprocess.run([PYINIT, "timeline", str(run_dir)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    assert timeline.returncode == 0, timeline.stderr
    assert "compile: inductor (compile or cache load)" in timeline.stdout
    assert "inductor cache lookups hit" in timeline.stdout
    assert "graphs past AOTAutograd's cache (traced at every start)" in timeline.stdout
    assert "AOTAutograd tracing " in timeline.stdout
    restart = next(x for x in timeline.stdout.splitlines() if x.startswith("restart 1:"))
    assert "inductor" in restart and "dynamo" in restart


def losses(output: str) -> dict[int, str]:
    """Each rank's losses, as the script printed them (its last attempt's).
    The ranks share one stdout and print writes a line and its newline
    apart, so one rank's line may end inside another's: found by pattern,
    not by line."""
    return {
        int(rank): found for rank, found in re.findall(r"rank (\d+) losses (\[[^\]]*\])", output)
    }


# Every record in AOTAutograd's cache folder (argv[1]) rewritten without its
# last field; prints how many entries it rewrote.
OTHER_FORM = """
import pathlib, pickle, sys
from pyinit.run.ddp_pieces import RECORD
rewritten = 0
for path in pathlib.Path(sys.argv[1], "aotautograd").rglob("*"):
    entry = pickle.loads(path.read_bytes()) if path.is_file() else None
    if getattr(entry, RECORD, None):
        setattr(entry, RECORD, tuple(output[:-1] for output in getattr(entry, RECORD)))
        path.write_bytes(pickle.dumps(entry))
        rewritten += 1
print(rewritten)
"""


@pytest.mark.slow
def test_ddps_pieces_found_in_aotautograds_cache_compute_what_traced_ones_do(tmp_path):
    """pyinit.run.ddp_pieces: DDP's pieces are saved in AOTAutograd's cache
    at the first start, and a later start, and a restart, find every piece
    there, trace none, and train to the same losses, bit for bit, as
    torch's own rule (every piece traced) does."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))

    def run(name: str, env: dict, *args: str) -> tuple[dict, dict]:
        result = subprocess.run([PYINIT, "run", "--cold", "--nproc-per-node", "2",
                                 "--max-restarts", "1", "--run-dir", str(tmp_path / name), "--",
                                 str(script), *args], env=env, capture_output=True, text=True,
                                timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        summaries = {(e["attempt"], e["rank"]): e for e in events(tmp_path / name)
                     if e["event"] == "compile summary" and e["at"] == "first step"}  # fmt: skip
        return losses(result.stdout), summaries

    traced, torchs = run("torch", dict(env, **TORCHS_AOT_CACHE))
    assert all(s["aot_cache_bypasses"] == 2 for s in torchs.values()), torchs
    first, saved = run("first", env)
    # Compiled and saved (a rank may find a piece the other has saved meanwhile).
    assert all(s["aot_cache_misses"] + s["aot_cache_hits"] == 2 and s["aot_cache_bypasses"] == 0
               for s in saved.values()), saved  # fmt: skip
    assert saved[0, 0]["aot_cache_misses"] + saved[0, 1]["aot_cache_misses"] >= 2, saved
    again, found = run("again", env, "--kill")
    assert set(found) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for summary in found.values():
        assert summary["aot_cache_hits"] == 2 and summary["aot_cache_misses"] == 0, summary
        assert summary["aot_cache_bypasses"] == 0 and summary["aot_trace_s"] == 0, summary
    assert len(traced) == 2 and traced == first == again
    timeline = subprocess.run([PYINIT, "timeline", str(tmp_path / "again")], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    assert "2 of 2 AOTAutograd cache lookups hit" in timeline.stdout, timeline.stdout
    assert "AOTAutograd tracing" not in timeline.stdout
    # Entries whose record is in another form (another pod-init's, say): each
    # piece is passed over and traced, as under torch's rule, never replayed.
    rewritten = subprocess.run([sys.executable, "-c", OTHER_FORM, str(tmp_path / "inductor")],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rewritten.returncode == 0 and int(rewritten.stdout) >= 2, rewritten
    other, passed_over = run("other", env)
    assert all(s["aot_cache_bypasses"] == 2 for s in passed_over.values()), passed_over
    assert other == traced


def last_compiled_on(run_dir: Path) -> dict[int, str | None]:
    """Per rank, the device its start found noted for its command."""
    return {e["rank"]: e["last_compiled_on"] for e in events(run_dir)
            if e["event"] == "phase" and e["name"] == "worker start"}  # fmt: skip


@pytest.mark.slow
def test_the_next_warm_launch_of_a_compiled_job_knows_where_it_compiled(tmp_path):
    """What a warm launch's workers compiled past AOTAutograd's cache on is
    found by the next launch of the same command from the same warm
    interpreter (a GPU's patterns then set up beside its start), not by
    another command's, and a command that compiles no such graph leaves
    another's note alone."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYINIT_WARM_DIR=str(folder), PYINIT_WARM="auto", **TORCHS_AOT_CACHE)  # fmt: skip
    started = subprocess.run([PYINIT, "warm", "start"], env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        found = []
        for name, extra in (("first", ()), ("again", ()), ("one-graph", ("--one-graph",)),
                            ("third", ())):  # fmt: skip
            run_dir = tmp_path / name
            result = subprocess.run([PYINIT, "run", "--nproc-per-node", "2", "--run-dir",
                                     str(run_dir), "--", str(script), *extra], env=env,
                                    capture_output=True, text=True, timeout=600)  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
            assert next(e for e in events(run_dir) if e["event"] == "warm")["used"] is True
            found.append(last_compiled_on(run_dir))
        assert found == [{0: None, 1: None}, {0: "cpu", 1: "cpu"}, {0: None, 1: None},
                         {0: "cpu", 1: "cpu"}]  # fmt: skip
        assert not first_step_summary(tmp_path / "one-graph").get("aot_cache_bypasses")
    finally:
        subprocess.run([PYINIT, "warm", "stop"], env=env, capture_output=True, timeout=60)


NOTES = """
import os
from pyinit.run import compile_notes as notes
lr1 = notes.command_key("script", "train.py", ["--lr", "1"])
assert lr1 == notes.command_key("script", "./train.py", ["--lr", "1"])
assert lr1 != notes.command_key("script", "train.py", ["--lr", "1"], {"CUDA_VISIBLE_DEVICES": "1"})
notes.share()
# The slots follow from the keys, which follow from this test's folder: chosen
# here, not assumed. A command whose local ranks all have slots of their own;
# another whose rank 1 meets neither of its first two, and one whose rank 1
# meets its rank 1.
keys = [notes.command_key("script", "train.py", ["--lr", str(n)]) for n in range(1, 10000)]
slot = lambda k, local_rank=1: notes._slot(k, local_rank)[0]
key = keys[0]
assert len({slot(key, rank) for rank in range(notes.SLOTS)}) == notes.SLOTS
apart = next(k for k in keys if slot(k) not in (slot(key, 0), slot(key)))
clash = next(k for k in keys if k != key and slot(k) == slot(key))
notes.remember_device(key, 0, "cuda:0")
def child(*steps):
    pid = os.fork()
    if pid == 0:
        for step in steps:
            step()
        os._exit(0)
    os.waitpid(pid, 0)
child(notes.note, lambda: notes.remember_device(key, 1, "cuda:1"),
      lambda: notes.remember_device(apart, 1, "cuda:2"))
assert notes.seen() and notes.remembered_device(key, 1) == "cuda:1"
assert notes.remembered_device(apart, 1) == "cuda:2" and notes.remembered_device(key, 0) == "cuda:0"
assert notes.remembered_device(apart, 0) is None
child(lambda: notes.remember_device(clash, 1, None))  # another's forgetting: kept
assert notes.remembered_device(key, 1) == "cuda:1"
child(lambda: notes.remember_device(clash, 1, "cuda:" + "7" * 40))  # the last one takes the slot
assert notes.remembered_device(key, 1) is None
assert notes.remembered_device(clash, 1) == "cuda:" + "7" * 27
child(lambda: notes.remember_device(apart, 1, None))
assert notes.remembered_device(apart, 1) is None and notes.remembered_device(clash, 1)
print("ok")
"""


def test_notes_of_forked_workers_reach_the_process_they_were_forked_from(tmp_path):
    """compile_notes: what a forked child notes, its parent finds, per
    command and local rank; a process that shares no page notes nothing."""
    unshared = ("from pyinit.run import compile_notes as n\nk = n.command_key('script', 'a', [])\n"
                "n.note(); n.remember_device(k, 0, 'cuda:0')\n"
                "assert not n.seen() and n.remembered_device(k, 0) is None")  # fmt: skip
    alone = subprocess.run([sys.executable, "-c", unshared], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    os.mkdir(tmp_path / "job")
    result = subprocess.run([sys.executable, "-c", NOTES], cwd=tmp_path / "job",
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-3000:]


def two_nodes(tmp_path: Path, job: str, caches: list[Path], port: int) -> list[Path]:
    """One run of the compiled script on two nodes (network namespaces), one
    worker each, node i with inductor's cache folder caches[i] and the
    shared --compile-cache folder; the run folders."""
    from conftest import namespaces, node_addresses

    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(node_addresses(2)) + "\n")
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    folders = [tmp_path / f"{job}-node{rank}" for rank in (0, 1)]
    with namespaces(2) as names:
        procs = []
        for rank, ns in enumerate(names):
            command = ["ip", "netns", "exec", ns, "env", f"TORCHINDUCTOR_CACHE_DIR={caches[rank]}",
                       PYINIT, "run", "--hostfile", hostfile, "--nproc-per-node", "1",
                       "--preflight", "off", "--sysfs-root", tmp_path / "sys", "--master-port",
                       str(port), "--monitor-interval", "0", "--compile-cache",
                       tmp_path / "shared", "--run-dir", folders[rank], "--", script]  # fmt: skip
            procs.append(subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        outputs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return folders


def first_step_summary(run_dir: Path) -> dict:
    return next(e for e in events(run_dir)
                if e["event"] == "compile summary" and e["at"] == "first step")  # fmt: skip


@pytest.mark.slow
def test_a_node_joining_later_loads_the_compiled_graphs_instead_of_compiling(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    first = two_nodes(tmp_path, "first", [tmp_path / "node0-cache", tmp_path / "node1-cache"],
                      29641)  # fmt: skip
    saved = [e for e in events(first[0]) if e["event"] == "compile cache"]
    assert [e["saved"] for e in saved] == [True] and (shared / "compile-cache.bin").exists()
    assert not [e for e in events(first[1]) if e["event"] == "compile cache" and "saved" in e]
    # Without the file's graphs (the first run found none), a fresh node compiles.
    assert first_step_summary(first[1])["inductor_cache_misses"] >= 1
    # Node 1 replaced: a machine whose inductor cache folder is empty.
    again = two_nodes(tmp_path, "again", [tmp_path / "node0-cache", tmp_path / "replaced-cache"],
                      29643)  # fmt: skip
    loaded = [e for e in events(again[1]) if e["event"] == "compile cache"]
    assert [e["loaded"] for e in loaded] == [True], loaded
    assert loaded[0]["artifacts"].get("inductor", 0) >= 1, loaded
    summary = first_step_summary(again[1])
    assert summary["graphs"] >= 1  # dynamo still traces the frames
    assert summary["inductor_cache_misses"] == 0 and summary["aot_cache_misses"] == 0, summary
    # AOTAutograd's cache answers too, for DDP's pieces as well
    # (pyinit.run.ddp_pieces), so the joining node traces nothing past dynamo.
    assert summary["inductor_cache_hits"] >= 1 and summary["aot_cache_hits"] == 2, summary
    assert summary["aot_cache_bypasses"] == 0 and summary["aot_trace_s"] == 0, summary


def test_a_compile_cache_others_may_write_is_refused(tmp_path):
    from pyinit.run.compiles import load_portable

    said: list[dict] = []
    path = tmp_path / "compile-cache.bin"
    path.write_bytes(b"not even torch's format")
    path.chmod(0o666)
    load_portable(path, lambda kind, **fields: said.append(fields))
    assert said == [{"path": str(path), "loaded": False, "error": "others may write it"}]
    path.chmod(0o600)
    said.clear()
    load_portable(path, lambda kind, **fields: said.append(fields))
    assert said[0]["loaded"] is False and said[0]["error"]  # torn or foreign: compiled afresh
    said.clear()
    load_portable(tmp_path / "absent.bin", lambda kind, **fields: said.append(fields))
    assert said == []


# The outermost module compiled, or compiled inside DDP; --own-hook: the
# script registers a global module hook of its own.
OUTERMOST = """
import sys
import torch, torch.distributed as dist
from torch._dynamo.utils import counters
dist.init_process_group("gloo")
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
if "--own-hook" in sys.argv:
    torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
model = torch.compile(net)
if "--ddp" in sys.argv:
    model = torch.nn.parallel.DistributedDataParallel(model)
model(torch.randn(4, 8)).sum().backward()
print("graphs", counters["stats"]["unique_graphs"], "breaks", sum(counters["graph_break"].values()))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("wrapped", ["outermost", "in DDP"])
def test_the_first_forward_is_timed_without_a_hook_dynamo_would_trace(tmp_path, wrapped):
    """The first forward's timing leaves nothing in the compiled region:
    one graph, no graph break, and none of torch's warning about global
    hooks, which is still said for a script's own global hook."""
    script = tmp_path / "outermost.py"
    script.write_text(OUTERMOST)
    extra = ["--ddp"] if wrapped == "in DDP" else []
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))

    def run(name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYINIT, "run", "--cold", "--nproc-per-node", "1", "--run-dir",
                               str(tmp_path / name), "--", str(script), *extra, *args], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    result = run("plain")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "graphs 1 breaks 0"
    assert "global hooks" not in result.stderr
    names = [e["name"] for e in events(tmp_path / "plain") if e["event"] == "phase"]
    assert names.count("first forward") == 1 and "compile: dynamo" in names
    own = run("own", "--own-hook")
    assert own.returncode == 0, own.stderr[-3000:]
    assert "when there are global hooks on modules" in own.stderr


# PatternSetup on its own, for the CPU (where pyinit run never starts it, but
# torch sets the patterns up the same way): a compile afterwards finds them.
PATTERNS = """
import os, torch
from pyinit.run.pattern_setup import PatternSetup, setups_done
phases = []
log = lambda name, start, end, **fields: phases.append((name, start <= end, fields))
early = PatternSetup("cpu", log)
early.start()  # inductor not imported yet: the thread would import it beside the script
assert early.thread is None
import torch._inductor.compile_fx
absent = PatternSetup("cuda:99", log)
absent.start()
absent.wait()
assert setups_done() == 0
setup = PatternSetup("cpu", log)
setup.start()
os.waitpid(os.fork() or os._exit(0), 0)  # a fork waits for the thread first
assert not setup.thread.is_alive()
setup.wait()
setup.start()  # waited for: a compile may have begun, so it never starts again
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
torch.compile(net)(torch.randn(4, 8)).sum().backward()
print(phases, setups_done())
"""


def test_the_patterns_set_up_beside_are_the_ones_the_compile_uses(tmp_path):
    script = tmp_path / "patterns.py"
    script.write_text(PATTERNS)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    phases, setups = result.stdout.rsplit(" ", 1)
    # One set-up in all: the thread's, found by the compile.
    assert int(setups) == 1
    [absent, done] = eval(phases)
    assert absent[0] == done[0] == "compile: pattern set-up" and absent[1] and done[1]
    assert absent[2]["device"] == "cuda:99" and "no device cuda:99 here" in absent[2]["error"]
    assert done[2] == {"device": "cpu", "beside": True}


def test_a_ddp_pieces_first_call_is_made_again_from_its_record():
    """pyinit.run.ddp_pieces: the fake outputs a record describes are made
    again exactly (a view's offset, a channels-last stride, an empty and a
    0-d tensor); what a record cannot hold is refused."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from pyinit.run.ddp_pieces import UNRECORDABLE, made_again, readable, record_of

    mode = FakeTensorMode()
    with mode:
        outputs = [torch.empty(4, 6)[1:, 2:],
                   torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
                   torch.empty(0, 5, dtype=torch.bfloat16), torch.tensor(3),
                   torch.empty(3, requires_grad=True)]  # fmt: skip
    record = record_of(outputs)
    assert record[0] == ((3, 4), (6, 1), 8, "float32", "cpu", False)
    assert record[1][1] == (60, 1, 15, 3) and record[4][5] is True
    again = made_again(record, FakeTensorMode())
    assert record_of(again) == record
    assert [o.dtype for o in again] == [o.dtype for o in outputs]
    assert record_of([torch.empty(2)]) == UNRECORDABLE  # a real tensor: not a first call's output
    dynamic = FakeTensorMode(shape_env=ShapeEnv())
    symbolic = dynamic.from_tensor(torch.empty(4, 2), static_shapes=False)
    assert record_of([symbolic]) == UNRECORDABLE
    # What a hit takes from an entry: only a record in this form.
    assert readable(record) and readable(()) and not readable(UNRECORDABLE)
    for other in [((3, 4), (6, 1), 8, "float32", "cpu"),  # another form
                  ((3, 4), (6,), 8, "float32", "cpu", False),
                  ((3, -4), (6, 1), 8, "float32", "cpu", False),
                  ((3, 4), (6, 1), 8, "load", "cpu", False),  # not a dtype
                  ((3, 4), (6, 1), 8, "float32", "cpu", 1)]:  # fmt: skip
        assert not readable((record[1], other)), other
