"""Warm starts: preloads before the fork, a warm interpreter per user that
pyinit run hands its agent to, and restarts that fork warm."""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BIN_DIR, ctrl_c_at_a_terminal
from conftest import run_events as events

from pyinit.run.preload import COMPILE_PRELOAD_STEPS
from pyinit.run.warm import scheduling
from pyinit.runlog.steps import RECORD

DETERMINISTIC = Path(__file__).parent / "data" / "deterministic_train.py"
ISA_REPORT = Path(__file__).parent / "data" / "cpu_isa_report.py"
PYINIT = str(BIN_DIR / "pyinit")


def folder_env(folder: Path, **extra: str) -> dict[str, str]:
    # The default (conftest turns it off for every other test's runs).
    return {**os.environ, "PYINIT_WARM_DIR": str(folder), "PYINIT_WARM": "auto", **extra}


def start_warm(env: dict[str, str], *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYINIT, "warm", "start", *options], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def stop_warm(env: dict[str, str]) -> None:
    subprocess.run([PYINIT, "warm", "stop"], env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def warm_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment of runs that find a warm interpreter (started here)."""
    folder = tmp_path_factory.mktemp("warm-shared")
    folder.chmod(0o700)
    env = folder_env(folder)
    started = start_warm(env)
    assert started.returncode == 0, started.stderr
    yield env
    stop_warm(env)


@pytest.fixture
def own_warm(tmp_path) -> Iterator[dict[str, str]]:
    """A warm interpreter of the test's own, which it may kill."""
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder)
    started = start_warm(env)
    assert started.returncode == 0, started.stderr
    yield env
    stop_warm(env)


def run(env: dict[str, str], run_dir: Path, *options: str, script_args: tuple[str, ...] = (),
        script: Path = DETERMINISTIC, stdin: str | None = None
        ) -> subprocess.CompletedProcess:  # fmt: skip
    if script == DETERMINISTIC and "--out" not in script_args:
        script_args = (*script_args, "--out", str(run_dir))  # the run folder exists by then
    return subprocess.run([PYINIT, "run", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                           *options, "--", str(script), *script_args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=240)  # fmt: skip


def warm_event(run_dir: Path) -> dict:
    return next((e for e in events(run_dir) if e["event"] == "warm"), {})


def losses(folder: Path) -> list[str]:
    lines = [(folder / f"losses-rank{rank}.txt").read_text() for rank in (0, 1)]
    assert all(text.count("\n") == 6 for text in lines), lines
    return lines


def test_the_default_preloads_cover_a_first_ddp_step():
    """What a step imports lazily is imported by the preloads: after them,
    a DDP construction, forward, backward and AdamW step import nothing of
    dynamo, inductor, fx or sympy; and the preloads leave it safe to fork."""
    script = """
import sys
from pyinit.run.preload import DEFAULT_PRELOADS, fork_unsafe, import_all
import_all(DEFAULT_PRELOADS)
assert fork_unsafe() == "", fork_unsafe()
before = set(sys.modules)
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 4)).sum().backward()
optimizer.step()
heavy = ("torch._dynamo", "torch._inductor", "torch.fx", "sympy")
print(sorted(m for m in set(sys.modules) - before if m.startswith(heavy)))
dist.destroy_process_group()  # else gloo's threads may abort the interpreter's end
"""
    result = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_the_compile_preloads_cover_a_first_compiled_step(tmp_path):
    """What a compiled step imports is imported by the warm interpreter's
    preloads: after them, a torch.compile'd model in DDP, its first forward
    (dynamo, inductor's C++ backend), backward and AdamW step import no more
    than a few dozen small modules besides the code inductor generates."""
    script = """
import json, sys
from pyinit.run.preload import DEFAULT_PRELOADS, fork_unsafe, import_all, import_compile_set
import_all(DEFAULT_PRELOADS)
import_compile_set()
assert fork_unsafe() == "", fork_unsafe()
before = set(sys.modules)
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
model = torch.nn.parallel.DistributedDataParallel(torch.compile(net))
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 8)).sum().backward()
optimizer.step()
print(json.dumps(sorted(set(sys.modules) - before)))
dist.destroy_process_group()  # else gloo's threads may abort the interpreter's end
"""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    result = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                            timeout=300, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    new = json.loads(result.stdout.splitlines()[-1])
    # The kernels inductor writes and loads, and the attention patterns it
    # loads on first use: the compile's own output, not imports to preload.
    generated = (".kernel", "compile_tasks.", "serialized_patterns")
    rest = [m for m in new if not any(part in m for part in generated)]
    assert len(rest) <= 40, rest
    heavy = ("networkx", "sympy.core", "setuptools", "torch._inductor.scheduler", "triton")
    assert not [m for m in rest if m.startswith(heavy)], rest


def test_a_forked_worker_counts_its_threads_as_a_fresh_interpreter_would():
    """For each environment a worker can be forked into from a parent that
    set no thread count (torchrun's addition, a setting torch does not take,
    MKL's own beside OpenMP's, more threads than cores), the count after
    threads_as_asked is a fresh interpreter's with that environment."""
    cases = [{"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "64"}, {"OMP_NUM_THREADS": "x"},
             {"OMP_NUM_THREADS": "\u0661"}, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "64"},
             {}]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    def fresh(extra: dict[str, str]) -> int:
        result = subprocess.run([sys.executable, "-P", "-c",
                                 "import torch; print(torch.get_num_threads())"],
                                env={**clean, **extra}, capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        return int(result.stdout)

    script = """
import json, sys, torch
from pyinit.run.preload import threads_as_asked
parent = torch.get_num_threads()
counts = []
for environ in json.loads(sys.argv[1]):
    torch.set_num_threads(parent)
    threads_as_asked(environ)
    counts.append(torch.get_num_threads())
print(json.dumps(counts))
"""
    forked = subprocess.run([sys.executable, "-P", "-c", script, json.dumps(cases)], env=clean,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert forked.returncode == 0, forked.stderr[-2000:]
    assert json.loads(forked.stdout) == [fresh(case) for case in cases], cases


def test_warm_cold_and_spawned_runs_give_identical_losses_and_threads(warm_env, tmp_path):
    kinds = {"cold": ("--cold",), "spawn": ("--cold", "--worker-start", "spawn"), "warm": ()}
    for kind, options in kinds.items():
        result = run(warm_env, tmp_path / kind, *options)
        assert result.returncode == 0, result.stderr[-3000:]
    assert losses(tmp_path / "cold") == losses(tmp_path / "spawn") == losses(tmp_path / "warm")
    # Forked workers take torch's thread count from their own environment, as
    # spawned ones do: torchrun's OMP_NUM_THREADS=1 for two ranks on a node.
    threads = {kind: [(tmp_path / kind / f"threads-rank{rank}.txt").read_text()
                      for rank in (0, 1)] for kind in kinds}  # fmt: skip
    assert threads["cold"] == threads["warm"] == threads["spawn"] == ["1\n", "1\n"], threads
    assert warm_event(tmp_path / "warm")["used"] is True
    assert warm_event(tmp_path / "cold") == {}  # --cold does not even look
    # The warm run's agent imported nothing; its workers neither.
    phases = [e for e in events(tmp_path / "warm") if e["event"] == "phase"]
    agent_import = next(e for e in phases if e["name"] == "agent import torch")
    assert agent_import["preloaded"] is True
    assert all(e["torch_loaded"] for e in phases if e["name"] == "worker start")
    assert not [e for e in phases if e["name"] == "import torch"]
    status = subprocess.run([PYINIT, "warm", "status", "--json"], env=warm_env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    answer = json.loads(status.stdout)
    assert answer["launches"] >= 1 and answer["running"] == 0 and answer["rss_bytes"] > 0
    assert answer["preloads"] == ["torch", "torch._dynamo"]


def test_a_run_that_ends_its_own_agent_does_not_say_it_forwarded_a_stop(warm_env, tmp_path):
    """At --join-timeout (and for a node that went away) a run ends its
    agent with a TERM of its own; through a warm interpreter it was said as a
    stop forwarded from outside, after the line that says why."""
    from test_launch_failures import missing_node_args

    result = subprocess.run([PYINIT, "run", "--monitor-interval", "0",
                             *map(str, missing_node_args(tmp_path, 3))], env=warm_env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert warm_event(tmp_path / "run")["used"], result.stderr[-3000:]
    assert "did not join within 3 s (--join-timeout)" in result.stderr
    assert "forwarded" not in result.stderr, result.stderr[-3000:]


def test_words_that_are_not_utf8_reach_the_script_as_python_gives_them(warm_env, tmp_path):
    """An argument or a variable that is not UTF-8 (a file name in another
    encoding) reaches the script's sys.argv and os.environ, cold and warm,
    as ``python SCRIPT`` gives them: the launcher's supervisor took them for
    a bug of its own."""
    script = tmp_path / "words.py"
    script.write_text("import os, sys\n"
                      "print(ascii([os.fsencode(a) for a in sys.argv[1:]]), "
                      "ascii(os.environb[b'NOT_UTF8']))\n")  # fmt: skip
    env = {**warm_env, "NOT_UTF8": "caf\udce9"}
    for kind, options in {"cold": ("--cold",), "warm": ()}.items():
        result = subprocess.run([PYINIT, "run", "--nproc-per-node", "1", "--run-dir",
                                 str(tmp_path / kind), *options, "--", str(script), "\udcff", "b"],
                                env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert result.returncode == 0, (kind, result.stderr[-3000:])
        assert result.stdout.splitlines()[-1] == "[b'\\xff', b'b'] b'caf\\xe9'", kind
    assert warm_event(tmp_path / "warm")["used"] is True


EXIT_WORK = Path(__file__).parent / "data" / "exit_work.py"
AGENT_EXIT = Path(__file__).parent / "data" / "agent_exit"


def test_a_worker_reads_stdin_and_ends_as_python_ends_a_script(warm_env, tmp_path):
    """torchrun's fresh interpreter reads the launch's stdin (breakpoint() in a
    worker), has Python's own signal handlers, is multiprocessing's main
    process with no start method chosen, has the __file__ Python gives it,
    shows ps its script's command line and its agent's, and at its end joins the
    script's threads, then runs its atexit functions, finalizers and
    logging's shutdown, and an uncaught KeyboardInterrupt ends it with its
    traceback and 130; a forked worker does the same, and never the
    functions its agent registered."""
    notes = tmp_path / "agent-exit-notes"
    # The cold agent preloads a module with an atexit function (another sys.path
    # than the warm interpreter's, which would not be used for it).
    path = os.pathsep.join([str(AGENT_EXIT), os.environ.get("PYTHONPATH", "")])
    with_agent_function = {**warm_env, "AGENT_EXIT_NOTES": str(notes), "PYTHONPATH": path}
    kinds = {  # how each ends, and the status pyinit run gives
        "spawn": (("--cold", "--worker-start", "spawn"), "return", 0),
        "cold": (("--cold", "--preload", "agent_exit_function"), "raise", 1),
        "warm": ((), "exit3", 3),
        # torch's worker function took it for its agent's stop: the worker ended as 0
        # with no result, and the run waited for that result for good.
        "interrupted": (("--cold",), "interrupt", 130),
    }  # fmt: skip
    script = Path(os.path.relpath(EXIT_WORK))
    for kind, (options, how, status) in kinds.items():
        folder = tmp_path / kind
        folder.mkdir()
        env = with_agent_function if kind == "cold" else warm_env
        # One rank: torchrun stops the others once one has failed, in their exit too.
        result = run(env, tmp_path / f"run-{kind}", *options, "--nproc-per-node", "1",
                     script=script, script_args=(str(folder), how),
                     stdin=f"a line for the {kind} worker\n")  # fmt: skip
        assert result.returncode == status, (kind, result.stderr[-3000:])
        noted = (folder / "ended-0").read_text().splitlines()
        pid, read, signals, processes, file, shown, *ended = noted
        assert read == f"read: a line for the {kind} worker", kind
        # Not torchrun's agent's handlers, which raise its exception with a traceback.
        assert signals == (
            "SIGHUP=SIG_DFL SIGQUIT=SIG_DFL SIGTERM=SIG_DFL "
            "SIGINT=default_int_handler SIGPIPE=SIG_IGN"
        ), (kind, signals)
        assert processes == "MainProcess None spawn", (kind, processes)
        # Named as Python names a script given by a relative path, whatever its cwd later.
        assert file == f"file {os.path.join(os.getcwd(), script)}", (kind, file)
        # ps shows `python SCRIPT ARGS` and the agent a cold launch starts, never
        # the warm interpreter or the wrapper; a long line is cut where the one it
        # inherited ended, and the warm interpreter's is the shortest.
        worker, agent, original = (ast.literal_eval(w)
                                   for w in shown.removeprefix("shown ").split("\t"))  # fmt: skip
        # What torchrun runs for it; a script may exec it to restart itself.
        assert original == ["-u", str(script), str(folder), how], (kind, original)
        started = f"{script}\0{folder}\0{how}".encode()
        assert started.startswith(b"\0".join(worker[1:])), (kind, worker)
        assert worker[1] == str(script).encode(), (kind, worker)
        assert agent[1:4] == [b"-P", b"-m", b"pyinit.run.agent"], (kind, agent)
        if how in ("raise", "interrupt"):  # its traceback starts in the script, as Python's does
            at = result.stderr.index("Traceback (most recent call last):")
            first = result.stderr[at:].splitlines()[1]
            assert first.startswith(f'  File "{os.path.join(os.getcwd(), script)}"'), first
        assert ended == ["thread", "atexit"], (kind, ended)
        log = (folder / "log-0").read_text()
        assert log == "buffered until logging shuts down\n", kind
        assert not list(folder.glob("left-*")), kind
        if kind == "cold":  # the agent ran its own function; the worker did not
            noted = notes.read_text().split()
            assert noted and pid.removeprefix("pid ") not in noted, (noted, pid)
    assert warm_event(tmp_path / "run-warm")["used"] is True


# Rank 1 ends the process itself, as scripts do where a library's teardown can
# hang; rank 0 returns after it.
ENDS_BY_OS_EXIT = """
import os, sys, time
os.write(1, f"rank {os.environ['RANK']} done\\n".encode())  # one write: the ranks share stdout
if os.environ["RANK"] == "1":
    os._exit(0)
time.sleep(0.5)
"""


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_a_rank_that_ends_by_os_exit_0_has_succeeded(warm_env, tmp_path, kind):
    """A forked worker that exits 0 without returning hands torch's agent no
    return value, and the agent waited for it for good; under torchrun that
    process is simply a success."""
    script = tmp_path / "ends_by_os_exit.py"
    script.write_text(ENDS_BY_OS_EXIT)
    result = run(warm_env, tmp_path / "run", *(("--cold",) if kind == "cold" else ()),
                 script=script)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(result.stdout.splitlines()) == ["rank 0 done", "rank 1 done"]
    assert warm_event(tmp_path / "run").get("used", False) is (kind == "warm")


# A helper process forked the old way, which ends by sys.exit; then the
# script's own end, a Ctrl-C it does not catch.
FORKS_A_HELPER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    print("helper", flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("helper ended", os.waitstatus_to_exitcode(status), flush=True)
time.sleep(1.5)  # the agent's monitor looks every 0.1 s
raise KeyboardInterrupt
"""


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_a_child_the_script_forks_ends_as_a_child_of_python(warm_env, tmp_path, kind):
    """The script's own child reached the wrapper's end of the script: it
    recorded its status as the rank's and sent torch's agent the rank's
    result, so the agent took the rank for finished and set the group's
    "finished" event while the worker still ran; the worker's uncaught
    Ctrl-C then passed for the agent's stop, quietly."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS_A_HELPER)
    run_dir = tmp_path / "run"
    result = run(warm_env, run_dir, *(("--cold",) if kind == "cold" else ()),
                 "--nproc-per-node", "1", script=script)  # fmt: skip
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["helper", "helper ended 0"]
    assert "Traceback (most recent call last):" in result.stderr, result.stderr[-3000:]
    assert warm_event(run_dir).get("used", False) is (kind == "warm")


# A record through torch's own handlers, as dynamo logs a recompile limit.
LOGS_THROUGH_TORCH = """
import logging, os
import torch
logging.getLogger("torch._dynamo").warning("rank %s logged through torch", os.environ["RANK"])
"""


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_torch_s_log_records_reach_the_terminal(warm_env, tmp_path, kind):
    """torch's handlers were made in the agent, whose stderr is its log: a
    forked worker's dynamo warnings, DDP's and TORCH_LOGS went to the agent's
    log instead of the terminal, where a fresh interpreter writes them."""
    script = tmp_path / "logs.py"
    script.write_text(LOGS_THROUGH_TORCH)
    run_dir = tmp_path / "run"
    result = run(warm_env, run_dir, *(("--cold",) if kind == "cold" else ()), script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} logged through torch" in result.stderr, result.stderr[-3000:]
    assert "logged through torch" not in (run_dir / "agent.log").read_text()
    assert warm_event(run_dir).get("used", False) is (kind == "warm")


# What a script draws from the generators it did not seed.
DRAWS = """
import os
import numpy, torch
drawn = (torch.initial_seed(), torch.randint(1 << 62, ()).item(), numpy.random.randint(1 << 62))
os.write(1, (" ".join(map(str, drawn)) + "\\n").encode())  # one write: the ranks share stdout
"""


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_each_rank_and_launch_draws_its_own_random_numbers(warm_env, tmp_path, kind):
    """A fresh interpreter seeds torch's default generator and numpy's from
    the system's entropy. Forked workers started from their agent's state:
    every rank of a node drew the same numbers, and every launch from a warm
    interpreter the same as the launch before (same initial weights, dropout
    masks and shuffles)."""
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    options = ("--cold",) if kind == "cold" else ()
    drawn = []
    for launch in range(2):
        result = run(warm_env, tmp_path / f"run-{launch}", *options, script=script)
        assert result.returncode == 0, result.stderr[-3000:]
        drawn += [line.split() for line in result.stdout.splitlines()]
        assert warm_event(tmp_path / f"run-{launch}").get("used", False) is (kind == "warm")
    assert len(drawn) == 4
    for column in range(3):  # the seed, torch's draw, numpy's draw
        assert len({words[column] for words in drawn}) == 4, drawn


# A daemon's habit: every descriptor it did not open is closed, then files of
# its own take the freed numbers (those of the run's logs and of the pipe a
# forked worker hands its result back on), and it trains.
CLOSES_INHERITED = """
import os, sys
import torch, torch.distributed as dist
os.closerange(3, 1 << 16)
rank = os.environ["RANK"]
mine = [open(f"{sys.argv[1]}/mine-{rank}-{i}.txt", "w") for i in range(40)]
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
for i, f in enumerate(mine):
    f.write(f"{rank} {i}\\n")
    f.close()
dist.barrier()  # no rank leaves while the other still connects
dist.destroy_process_group()
"""


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_a_script_that_closes_what_it_inherited_runs_as_under_torchrun(warm_env, tmp_path, kind):
    """Under a forked worker the script's own files took the numbers of the
    run's logs, which then wrote records into them, and of torch's return
    pipe, whose write failed the rank (exit 1). Now the run succeeds, each of
    the script's files holds only its own line, and the logs go on."""
    script = tmp_path / "closes_inherited.py"
    script.write_text(CLOSES_INHERITED)
    out = tmp_path / "files"
    out.mkdir()
    run_dir = tmp_path / "run"
    result = run(warm_env, run_dir, *(("--cold",) if kind == "cold" else ()), script=script,
                 script_args=(str(out),))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stop" not in result.stderr, result.stderr[-3000:]
    for rank in (0, 1):
        for i in range(40):
            assert (out / f"mine-{rank}-{i}.txt").read_text() == f"{rank} {i}\n"
        assert (run_dir / "steps" / f"rank-{rank}.bin").stat().st_size == 3 * RECORD.size
    first_steps = [e["rank"] for e in events(run_dir)
                   if e["event"] == "phase" and e["name"] == "first step"]  # fmt: skip
    assert sorted(first_steps) == [0, 1]
    assert warm_event(run_dir).get("used", False) is (kind == "warm")


SAVE_ON_CTRL_C = Path(__file__).parent / "data" / "save_on_ctrl_c.py"


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_ctrl_c_at_a_terminal_lets_every_rank_finish_its_handler(warm_env, tmp_path, kind):
    """A terminal's Ctrl-C reaches each rank once, forwarded by torchrun's
    agent as under torchrun: a script that catches KeyboardInterrupt to save
    its state finishes saving, and the run ends (130) without torchrun's
    TERM or KILL. It reached the ranks twice (from the terminal, then from
    the agent), and the agent twice (from the terminal, then from pod-init),
    which then sent TERM."""
    options = ("--cold",) if kind == "cold" else ()
    run_dir = tmp_path / "run"
    ran = ctrl_c_at_a_terminal([PYINIT, "run", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                                *options, "--", str(SAVE_ON_CTRL_C)], "ready", times=2,
                               **warm_env)  # fmt: skip
    # The two ranks write to one terminal at once: their lines may interleave.
    assert ran.output.count("saved") == 2 and ran.status == 130, ran.output[-3000:]
    log = (run_dir / "agent.log").read_text()
    closing = [line for line in log.splitlines() if "Closing process" in line]
    assert closing and all(line.endswith("via signal SIGINT") for line in closing), closing
    assert "forcefully exiting" not in log  # torchrun's KILL after its 30 s grace
    assert (warm_event(run_dir).get("used") is True) == (kind == "warm")


def test_the_first_step_is_split_into_its_parts(warm_env, tmp_path):
    result = run(warm_env, tmp_path, "--cold")
    assert result.returncode == 0, result.stderr[-3000:]
    phases = [e for e in events(tmp_path) if e["event"] == "phase" and "rank" in e]
    for rank in (0, 1):
        mine = {e["name"]: e for e in phases if e["rank"] == rank}
        order = ["process group", "script setup", "first forward", "first backward",
                 "first optimizer step"]  # fmt: skip
        for earlier, later in itertools.pairwise(order):
            assert mine[earlier]["end"] <= mine[later]["start"] + 1e-6, (earlier, later)
        assert mine["first step"]["start"] == mine["first forward"]["start"]
        assert mine["first step"]["end"] >= mine["first optimizer step"]["end"]
    timeline = subprocess.run([PYINIT, "timeline", str(tmp_path)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    assert "first backward" in timeline.stdout and "not in the log" not in timeline.stdout


def test_a_changed_preloaded_module_starts_cold_and_says_why(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    heavy = modules / "heavymod.py"
    heavy.write_text("VALUE = 1\n")
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder, PYTHONPATH=str(modules))
    started = start_warm(env, "--preload", "heavymod")
    assert started.returncode == 0, started.stderr
    try:
        first = run(env, tmp_path / "first", "--preload", "heavymod")
        assert first.returncode == 0, first.stderr[-3000:]
        assert warm_event(tmp_path / "first")["used"] is True
        heavy.write_text("VALUE = 2  # changed\n")
        second = run(env, tmp_path / "second", "--preload", "heavymod")
        assert second.returncode == 0, second.stderr[-3000:]
        said = [line for line in second.stderr.splitlines() if "starting cold" in line]
        assert said == [f"pyinit run: starting cold: {heavy} changed since the warm interpreter "
                        "imported it"]  # fmt: skip
        assert warm_event(tmp_path / "second")["used"] is False
        # Another environment torch reads as it loads: cold too, naming the variable.
        third = run(dict(env, TORCHINDUCTOR_MAX_AUTOTUNE="1"), tmp_path / "third")
        assert "starting cold: TORCHINDUCTOR_MAX_AUTOTUNE differs" in third.stderr
    finally:
        stop_warm(env)


@pytest.mark.root
def test_another_user_is_refused_before_anything_is_read():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    # Outside pytest's own 0700 folders, so that the other user can reach it.
    folder = Path(tempfile.mkdtemp(prefix="pyinit-warm-", dir="/tmp"))
    own_warm = folder_env(folder)
    try:
        started = start_warm(own_warm)
        assert started.returncode == 0, started.stderr
        refused_before_reading(folder, own_warm)
    finally:
        stop_warm(own_warm)
        shutil.rmtree(folder, ignore_errors=True)


def refused_before_reading(folder: Path, own_warm: dict[str, str]) -> None:
    # As if someone had opened the folder up: the uid check is what still refuses.
    folder.chmod(0o711)
    (folder / "warm.sock").chmod(0o666)
    client = (
        "import json, socket, struct\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({str(folder / 'warm.sock')!r})\n"
        "data = json.dumps({'op': 'launch', 'args': [], 'env': {}}).encode()\n"
        "try:\n"
        "    s.sendall(struct.pack('<I', len(data)) + data)\n"
        "except BrokenPipeError:\n"
        "    pass  # refused and closed before the request went: the answer waits all the same\n"
        "head = s.recv(4); (n,) = struct.unpack('<I', head); body = b''\n"
        "while len(body) < n: body += s.recv(n - len(body))\n"
        "print(json.loads(body))\n"
    )
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "/usr/bin/python3", "-c", client], capture_output=True, text=True,
                            timeout=60, cwd="/")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "'ok': False" in result.stdout and "refused" in result.stdout
    assert "refused a connection from uid 65534" in (folder / "warm.log").read_text()
    folder.chmod(0o700)  # the owner's client refuses a folder others may enter
    status = subprocess.run([PYINIT, "warm", "status", "--json"], env=own_warm,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert json.loads(status.stdout)["launches"] == 0


def test_a_folder_others_may_enter_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    env = folder_env(folder)
    started = start_warm(env)
    assert started.returncode == 1
    assert started.stderr == (f"pyinit: {folder}: the warm interpreter's folder is refused: "
                              "mode 0755 lets others in (0700 wanted)\n")  # fmt: skip
    result = run(env, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"pyinit run: starting cold: {folder}: the warm interpreter's folder is refused"
            in result.stderr)  # fmt: skip


FOREVER = """import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
open(os.path.join(sys.argv[1], f"worker-{dist.get_rank()}.pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def start_forever(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    command = [PYINIT, "run", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), "--",
               str(script), str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    files = [tmp_path / f"worker-{rank}.pid" for rank in (0, 1)]
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    agent = warm_event(tmp_path / "run")["agent_pid"]
    return proc, [agent, *(int(f.read_text()) for f in files)]


def gone(pids: list[int], within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_a_warm_launched_run_ends_it_as_a_cold_one(warm_env, tmp_path, sig, status):
    proc, pids = start_forever(warm_env, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-3000:]
    assert gone(pids)
    assert err.rstrip().splitlines()[-1].startswith(f"pyinit run: exited with status {status}")
    assert "Traceback" not in err


# A stand-in for a warm interpreter still importing: it listens, then works
# (spins) or is stuck (sleeps) for a while, then answers one request.
IMPORTING_PEER = """
import json, socket, struct, sys, time
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(1)
print("listening", flush=True)
if sys.argv[2] == "stuck":
    time.sleep(float(sys.argv[3]))
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    pass
conn, _ = listener.accept()
def send(message):
    body = json.dumps(message).encode()
    conn.sendall(struct.pack("<I", len(body)) + body)
send({"serving": True})
(length,) = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))
send({"ok": True, "op": json.loads(conn.recv(length, socket.MSG_WAITALL))["op"]})
"""


@pytest.mark.parametrize("state", ["working", "stuck"])
def test_a_request_waits_for_a_warm_interpreter_as_long_as_it_works(tmp_path, monkeypatch,
                                                                      state):  # fmt: skip
    """One still importing is waited for past the stall allowance while it
    uses CPU; one that uses none is given up on after it, by pid."""
    from pyinit.run.warm import client

    monkeypatch.setattr(client, "STALL_S", 1.5)
    path = str(tmp_path / "warm.sock")
    with subprocess.Popen([sys.executable, "-c", IMPORTING_PEER, path, state, "4"],
                          stdout=subprocess.PIPE, text=True) as peer:  # fmt: skip
        assert peer.stdout.readline() == "listening\n"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            began = time.monotonic()
            if state == "working":
                assert client.exchange(sock, {"op": "status"}) == {"ok": True, "op": "status"}
                assert time.monotonic() - began > 3
            else:
                with pytest.raises(TimeoutError) as stalled:
                    client.exchange(sock, {"op": "status"})
                assert stalled.value.strerror == f"pid {peer.pid} did not answer and used no " \
                    "CPU for 1.5 s"  # fmt: skip
                assert time.monotonic() - began < 4
        peer.kill()


GATED_PRELOAD = """
import os, time
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.05)
"""


def test_ctrl_c_while_the_warm_interpreter_imports_ends_the_run_at_once(tmp_path):
    """A run handed to a warm interpreter still importing waits for it,
    and Ctrl-C ends that wait at once: one line, the shell's status, its
    pipes closed, and no agent started when the imports end (TERM and HUP
    take the same path)."""
    sig, status = signal.SIGINT, 130
    (tmp_path / "gated_preload.py").write_text(GATED_PRELOAD)
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    gate = tmp_path / "gate"
    env = folder_env(folder, PYTHONPATH=str(tmp_path), GATE=str(gate))
    started = start_warm(env, "--no-wait", "--preload", "gated_preload")
    assert started.returncode == 0, started.stderr
    try:
        script = tmp_path / "mark.py"
        script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
        proc = subprocess.Popen([PYINIT, "run", "--nproc-per-node", "1", "--run-dir",
                                 str(tmp_path / "run"), "--", str(script)], env=env,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while not spawned(tmp_path / "run"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # in the wait
        began = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - began < 5
        assert proc.returncode == status, err[-3000:]
        name = signal.Signals(sig).name
        assert f"pyinit run: {name} while the warm interpreter imported: nothing was started" \
            in err.splitlines(), err[-3000:]  # fmt: skip
        assert "Traceback" not in err
        gate.touch()  # the imports end: the connection left behind is found closed
        answer = warm_status(env)
        assert (answer["launches"], answer["running"]) == (0, 0), answer
        assert not (tmp_path / "ran").exists()
    finally:
        gate.touch()
        stop_warm(env)


def spawned(run_dir: Path) -> bool:
    """Whether the run has logged its spawn (a line being written is skipped)."""
    with contextlib.suppress(FileNotFoundError):
        for line in (run_dir / "events.jsonl").read_text().splitlines(keepends=True):
            if line.endswith("\n") and json.loads(line)["event"] == "spawn":
                return True
    return False


def test_kill_9_of_a_warm_launched_run_leaves_nothing(warm_env, tmp_path):
    proc, pids = start_forever(warm_env, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert gone(pids)


def test_kill_9_of_the_warm_interpreter_ends_the_run_in_one_line(own_warm, tmp_path):
    proc, pids = start_forever(own_warm, tmp_path)
    warm_pid = warm_event(tmp_path / "run")["pid"]
    os.kill(warm_pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert gone(pids)
    lines = err.rstrip().splitlines()
    assert lines[-2:] == [
        f"pyinit run: the warm interpreter (pid {warm_pid}) ended during the run",
        f"pyinit run: exited with status 1; torchrun's own log: {tmp_path / 'run' / 'agent.log'}",
    ], err[-3000:]


def test_a_restarted_group_forks_warm_and_shows_its_phases(warm_env, tmp_path):
    result = run(warm_env, tmp_path, "--cold", "--max-restarts", "1",
                 script_args=("--kill-at", "3"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    phases = [e for e in events(tmp_path) if e["event"] == "phase" and e.get("attempt") == 1]
    names = {e["name"] for e in phases}
    assert {"restart detect", "restart stop", "restart rendezvous", "restart start workers",
            "worker start", "process group", "first step"} <= names  # fmt: skip
    assert "import torch" not in names
    assert all(e["torch_loaded"] for e in phases if e["name"] == "worker start")
    timeline = subprocess.run([PYINIT, "timeline", str(tmp_path)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    line = next(x for x in timeline.stdout.splitlines() if x.startswith("restart 1:"))
    assert "first step again" in line and "no import of torch" in line
    report = subprocess.run([PYINIT, "report", str(tmp_path), "--out", str(tmp_path / "r.html")],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert f"node 0 {line}" in report.stdout
    assert "Restarts, step by step" in (tmp_path / "r.html").read_text()


def warm_status(env: dict[str, str]) -> dict | None:
    status = subprocess.run([PYINIT, "warm", "status", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    return json.loads(status.stdout) if status.returncode == 0 else None


def warm_pid(env: dict[str, str]) -> int | None:
    status = warm_status(env)
    return status["pid"] if status else None


def test_the_first_launch_leaves_a_warm_interpreter_and_says_so_once(tmp_path):
    """Unasked, the first run starts a warm interpreter, is itself handed to
    it, and says so the first time only; it is not the run's child (the run
    ends its children), and pyinit warm stop ends it."""
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder)
    try:
        first = run(env, tmp_path / "first")
        assert first.returncode == 0, first.stderr[-3000:]
        assert first.stderr.count("a warm interpreter stays on this node") == 1, first.stderr
        assert "PYINIT_WARM=off" in first.stderr
        assert warm_event(tmp_path / "first")["used"] is True
        assert [e["asked"] for e in events(tmp_path / "first") if e["event"] == "warm_started"] == [
            False]  # fmt: skip
        pid = warm_pid(env)
        assert pid is not None
        second = run(env, tmp_path / "second")
        assert second.returncode == 0, second.stderr[-3000:]
        assert "warm interpreter" not in second.stderr
        assert warm_event(tmp_path / "second")["used"] is True
        assert not [e for e in events(tmp_path / "second") if e["event"] == "warm_started"]
        assert warm_pid(env) == pid
        assert losses(tmp_path / "first") == losses(tmp_path / "second")
        # Eager launches alone: the compile set waits for a worker's first compile.
        status = warm_status(env)
        assert status["compile_preloads_pending"] == len(COMPILE_PRELOAD_STEPS), status
        assert status["compile_preloads_wait_for_a_compile"] is True
        compiles = run(env, tmp_path / "compiles", script_args=("--compile-once",))
        assert compiles.returncode == 0, compiles.stderr[-3000:]
        assert warm_event(tmp_path / "compiles")["used"] is True
        assert losses(tmp_path / "compiles") == losses(tmp_path / "first")
        # Then it imports the compile set, step by step, every step found.
        assert warm_status(env)["compile_preloads_wait_for_a_compile"] is False
        deadline = time.monotonic() + 240
        while warm_status(env)["compile_preloads_pending"] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert warm_status(env)["compile_preloads_pending"] == 0
        # Then the CPU's vector-ISA probe, in a child of its own: a worker forked
        # after it finds the probe's answers, the same as a probe of its own.
        while warm_status(env)["cpu_probe_running"] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not warm_status(env)["cpu_probe_running"]
        assert "left to the scripts that compile" not in (folder / "warm.log").read_text()
        third = run(env, tmp_path / "third", script=ISA_REPORT, script_args=(str(tmp_path),))
        assert third.returncode == 0, third.stderr[-3000:]
        assert warm_event(tmp_path / "third")["used"] is True
        fresh = subprocess.run([sys.executable, str(ISA_REPORT), str(tmp_path / "fresh")],
                               capture_output=True, text=True, timeout=240)  # fmt: skip
        assert fresh.returncode == 0, fresh.stderr
        found = json.loads((tmp_path / "isa-rank0.json").read_text())
        probed = json.loads((tmp_path / "fresh" / "isa-rank0.json").read_text())
        assert not probed["known_at_start"]
        assert found["isas"] == probed["isas"]
        assert found["known_at_start"] is build_compiles_for_cpu()
    finally:
        stop_warm(env)
    assert warm_pid(env) is None
    deadline = time.monotonic() + 30
    while warm_processes(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not warm_processes(folder), "the warm interpreter or its CPU probe still runs"


def test_a_launch_while_the_compile_set_imports_does_not_wait_for_it(tmp_path):
    """The warm interpreter a run left imports the compile set beside its
    loop once a launch has compiled: a launch that comes while a step is
    under way (jinja2, the second, held here until the test lets it go, or
    for 300 s: longer than a run may take here, however loaded the machine;
    the first, networkx, a compile imports itself) is handed to the keeper
    forked before the step began, and runs to its end meanwhile."""
    fakes = tmp_path / "fakes"
    (fakes / "jinja2").mkdir(parents=True)
    began, release = tmp_path / "import-began", tmp_path / "release"
    (fakes / "jinja2" / "__init__.py").write_text(
        f"import os, time\nopen({str(began)!r}, 'w').close()\ndeadline = time.monotonic() + 300\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )  # fmt: skip
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder, PYTHONPATH=str(fakes))
    try:
        first = run(env, tmp_path / "first", script_args=("--compile-once",))
        assert first.returncode == 0, first.stderr[-3000:]
        deadline = time.monotonic() + 120
        while not began.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert began.exists(), (folder / "warm.log").read_text()
        second = run(env, tmp_path / "second")
        assert second.returncode == 0, second.stderr[-3000:]
        assert warm_event(tmp_path / "second")["used"] is True
        assert not release.exists()
        # Still under way: no step of the compile set after the first taken in.
        status = warm_status(env)
        assert COMPILE_PRELOAD_STEPS[1] == "jinja2"
        assert status["compile_preloads_pending"] == len(COMPILE_PRELOAD_STEPS) - 1
        # Its thread blocks what the loop waits for: a signal to the process reaches the loop.
        blocked = {int(task.name): int(next(line.split()[1] for line in
                                            (task / "status").read_text().splitlines()
                                            if line.startswith("SigBlk:")), 16)
                   for task in Path(f"/proc/{status['pid']}/task").iterdir()}  # fmt: skip
        waited = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGCHLD - 1))
        assert not blocked.pop(status["pid"]) & waited
        assert blocked and all(mask & waited == waited for mask in blocked.values()), blocked
        assert losses(tmp_path / "first") == losses(tmp_path / "second")
    finally:
        release.touch()
        stop_warm(env)


def warm_processes(folder: Path) -> list[int]:
    """The warm interpreter's processes for `folder` (forked children included)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                proc.name.isdigit()
                and b"pyinit.run.warm.server" in (proc / "cmdline").read_bytes()
                and f"PYINIT_WARM_DIR={folder}".encode() in (proc / "environ").read_bytes()
            ):
                found.append(int(proc.name))
    return found


def build_compiles_for_cpu() -> bool:
    import torch

    return not (torch.version.cuda or getattr(torch.version, "hip", None))


def test_recorded_probe_verdicts_decide_the_isas_and_nothing_is_built():
    """prime_cpu_isa answers every check from the verdicts it is given
    (here: every check of a real probe, refused) and builds or loads nothing."""
    probe = ("import json\nfrom pyinit.run import preload\n"
             "print(json.dumps(preload.probe_cpu_isa()))\n")  # fmt: skip
    probed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=240)  # fmt: skip
    assert probed.returncode == 0, probed.stderr[-3000:]
    verdicts = json.loads(probed.stdout)
    if not verdicts:
        pytest.skip("this CPU has no vector ISA that inductor probes")
    prime = (
        "import json, sys\n"
        "from torch._inductor import cpu_vec_isa\n"
        "from pyinit.run import preload\n"
        "def refused(*args):\n"
        "    raise AssertionError('a check was built and loaded')\n"
        "cpu_vec_isa.VecISA.check_build = refused\n"
        "preload.prime_cpu_isa(dict.fromkeys(json.load(sys.stdin), False))\n"
        "print(json.dumps([str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]))\n"
    )
    primed = subprocess.run([sys.executable, "-c", prime], input=probed.stdout,
                            capture_output=True, text=True, timeout=240)  # fmt: skip
    assert primed.returncode == 0, primed.stderr[-3000:]
    assert json.loads(primed.stdout) == []


def test_one_started_for_a_launch_at_once_leaves_the_compile_set_for_later(tmp_path, warm_env):
    """`pyinit warm start` waits for the compile set too; with --no-wait (as
    PID 1 starts one, its command right behind) a launch waits only for what
    every step imports, and the compile set comes between launches."""
    assert warm_status(warm_env)["compile_preloads_pending"] == 0
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder)
    try:
        started = start_warm(env, "--no-wait")
        assert started.returncode == 0, started.stderr
        # Answered once torch and dynamo are in, before the first deferred step.
        assert warm_status(env)["compile_preloads_pending"] == len(COMPILE_PRELOAD_STEPS)
    finally:
        stop_warm(env)


@pytest.mark.parametrize("setting", [{"PYINIT_WARM": "off"}, {"SLURM_JOB_ID": "4242"}])
def test_no_warm_interpreter_is_left_where_it_would_be_wrong(tmp_path, setting):
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder, **setting)
    try:
        result = run(env, tmp_path / "run")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "warm interpreter" not in result.stderr
        assert warm_pid(env) is None
    finally:
        stop_warm(env)


def test_keep_warm_says_so_every_time_and_pyinit_warm_is_checked(tmp_path):
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder, SLURM_JOB_ID="4242")  # asked: left even in a SLURM job
    try:
        first = run(env, tmp_path / "first", "--keep-warm")
        assert first.returncode == 0, first.stderr[-3000:]
        assert "a warm interpreter is starting for this launch and the next" in first.stderr
        assert warm_event(tmp_path / "first")["used"] is True
        assert warm_pid(env) is not None
    finally:
        stop_warm(env)
    wrong = run(folder_env(folder, PYINIT_WARM="sometimes"), tmp_path / "bad")
    assert (wrong.returncode, wrong.stderr) == (
        2, "pyinit: PYINIT_WARM='sometimes': expected auto or off\n")  # fmt: skip
    wrong = run(folder_env(folder, PYINIT_DDP_AOT_CACHE="no"), tmp_path / "bad")
    assert (wrong.returncode, wrong.stderr) == (
        2, "pyinit: PYINIT_DDP_AOT_CACHE='no': expected on or off\n")  # fmt: skip
    both = run(folder_env(folder, PYINIT_WARM="off"), tmp_path / "both", "--keep-warm")
    assert (both.returncode, both.stderr) == (
        2, "pyinit: --keep-warm and PYINIT_WARM=off: give one\n")  # fmt: skip


def test_bad_preloads_and_warm_commands(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "boom.py").write_text("raise RuntimeError('no GPU driver here')\n")
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    env = folder_env(folder, PYTHONPATH=str(modules))
    missing = run(env, tmp_path / "a", "--preload", "nosuchmodule")
    assert (missing.returncode, missing.stderr) == (
        2, "pyinit: --preload nosuchmodule: no module named 'nosuchmodule'\n")  # fmt: skip
    assert not (tmp_path / "a").exists()  # refused before anything started
    spawned = run(env, tmp_path / "b", "--preload", "json", "--worker-start", "spawn")
    assert spawned.returncode == 2 and "--preload" in spawned.stderr
    raising = run(env, tmp_path / "c", "--cold", "--preload", "boom")
    assert raising.returncode == 1
    assert ("pyinit run: torchrun's agent failed: --preload boom: RuntimeError: no GPU driver "
            "here") in raising.stderr  # fmt: skip
    assert "Traceback" not in raising.stderr
    start_missing = start_warm(env, "--preload", "nosuchmodule")
    assert start_missing.returncode == 2
    start_raising = start_warm(env, "--preload", "boom")
    assert (start_raising.returncode, start_raising.stderr) == (
        1, "pyinit warm: --preload boom: RuntimeError: no GPU driver here\n")  # fmt: skip
    stopped = subprocess.run([PYINIT, "warm", "stop"], env=env, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert (stopped.returncode, stopped.stdout) == (0, "pyinit warm: none running\n")
    status = subprocess.run([PYINIT, "warm", "status"], env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert (status.returncode, status.stderr) == (1, "pyinit warm: none running\n")


def test_malformed_requests_are_refused_and_the_warm_interpreter_serves_on(warm_env):
    """A client of the same user may send anything: each is one refusal or
    one log line, and the next run is still served."""
    from pyinit.run.warm import protocol

    path = str(Path(warm_env["PYINIT_WARM_DIR"]) / "warm.sock")
    packets = [b"\x05\x00\x00\x00{{{{{", b"\x00\x00\x00\x40", b"\x02\x00\x00\x00[]"]
    for message in ({"op": "launch"}, {"op": "launch", "args": [1], "env": {}}, {"op": "?"}):
        data = json.dumps(message).encode()
        packets.append(len(data).to_bytes(4, "little") + data)
    answers = []
    for packet in packets:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            greeted(sock)
            sock.sendall(packet)
            answers.append(protocol.receive(sock)[0])
    assert answers[:3] == [None, None, None]  # unreadable: closed after a log line
    assert [a["ok"] for a in answers[3:]] == [False, False, False]
    assert "malformed launch" in answers[3]["reason"]
    status = subprocess.run([PYINIT, "warm", "status", "--json"], env=warm_env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and json.loads(status.stdout)["running"] == 0


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "little") + body


def greeted(sock: socket.socket) -> None:
    """The warm interpreter's first message read: it reads this connection."""
    from pyinit.run.warm import protocol

    assert protocol.receive(sock)[0] == protocol.GREETING


def ask(path: str, packet: bytes, fds: list[int] = ()) -> dict | None:
    """One packet to the warm interpreter once it greets; its answer (None: it closed)."""
    from pyinit.run.warm import protocol

    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(path)
        greeted(sock)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            socket.send_fds(sock, [packet], list(fds)) if fds else sock.sendall(packet)
            sock.shutdown(socket.SHUT_WR)
        try:
            return protocol.receive(sock)[0]
        except (ConnectionResetError, ValueError):
            return None


def launch_template(env: dict[str, str]) -> dict:
    """A launch as pyinit run sends it, for this test process's interpreter;
    its agent would only print torchrun's usage (an option torchrun lacks)."""
    here = (
        "import json, os; from pyinit.run.warm import protocol; print(json.dumps("
        "protocol.interpreter_here(protocol.agent_sys_path())))"
    )
    interpreter = subprocess.run([sys.executable, "-P", "-c", here], env=env, capture_output=True,
                                 text=True, check=True, timeout=60).stdout  # fmt: skip
    return {"op": "launch", "args": ["--no-such-torchrun-option"], "env": dict(env), "cwd": "/",
            "preloads": [], "interpreter": json.loads(interpreter), "store_env": "X"}  # fmt: skip


ORDINARY = {"nice": 0, "policy": os.SCHED_OTHER, "rt_priority": 0, "io_priority": 0,
            "oom_score_adj": 0}  # fmt: skip


@pytest.mark.parametrize(
    "interpreter",
    [None, [], {"python": "x"}, {"python": "x", "version": "3", "sys_path": "/usr/lib"},
     {"python": "x", "version": 3, "sys_path": []}, {"python": "x", "version": "3",
                                                     "sys_path": [None]}],
)  # fmt: skip
def test_a_launch_s_interpreter_of_the_wrong_shape_is_refused(own_warm, interpreter):
    """What a launch says of its interpreter is the one part of who it is
    that the warm interpreter takes from the request: any other shape is
    refused before anything is read or set, and it serves on."""
    path = str(Path(own_warm["PYINIT_WARM_DIR"]) / "warm.sock")
    launch = launch_template(own_warm)
    launch["interpreter"] = interpreter
    with open(os.devnull, "rb") as null:
        answer = ask(path, frame(json.dumps(launch).encode()), [null.fileno()] * 3)
    assert answer == {"ok": False, "reason": "a malformed launch: interpreter must hold python, "
                      "version and sys_path"}  # fmt: skip
    assert serves(own_warm)["launches"] == 0


CLAIMS = """
import json, os, resource, sys
from pyinit.run.warm import protocol

# What a hostile client of this user's could claim: the warm interpreter's own
# identity (no sandbox), no umask, limits as high as it has, every CPU, nice 0.
server = int(os.environ["WARM_PID"])
claim = protocol.Identity.of(server, protocol.interpreter_here(protocol.agent_sys_path()),
                             os.environ)
sent = protocol.send

def claiming(sock, message, fds=()):
    if message.get("op") == "launch":
        message = {**message, "identity": claim.to_dict(), "umask": 0, "affinity": [0, 1],
                   "limits": {"RLIMIT_NOFILE": [4096, 1 << 20]},
                   "scheduling": {"nice": 0, "policy": 0, "rt_priority": 0, "io_priority": 0,
                                  "oom_score_adj": 0}}
    return sent(sock, message, fds)

protocol.send = claiming
from pyinit.cli import run_cli
sys.argv = ["pyinit", "run", "--nproc-per-node", "1", "--run-dir", os.environ["RUN_DIR"], "--",
            os.environ["SCRIPT"]]
run_cli()
"""
SANDBOXED = """
import os, resource
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(status["NoNewPrivs"].strip(), status["Umask"].strip(),
      resource.getrlimit(resource.RLIMIT_NOFILE)[1], os.getpriority(os.PRIO_PROCESS, 0),
      sorted(os.sched_getaffinity(0)))
"""


def test_a_caller_is_what_the_kernel_says_not_what_it_claims(own_warm, tmp_path):
    """A client of this user's that claims the warm interpreter's identity
    has its script run as itself: from under no_new_privs it starts cold
    (a warm fork would have run it outside), and with a lower hard limit,
    a higher nice value, a umask and fewer CPUs it is served warm with
    them, as a cold agent would inherit them."""
    claims, script = tmp_path / "claims.py", tmp_path / "sandboxed.py"
    claims.write_text(CLAIMS)
    script.write_text(SANDBOXED)
    env = {**own_warm, "WARM_PID": str(serves(own_warm)["pid"]), "SCRIPT": str(script)}
    umask = os.umask(0)
    os.umask(umask)
    nice, cpus = os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))
    as_here = f"1 {umask:04o} {resource.getrlimit(resource.RLIMIT_NOFILE)[1]} {nice} {cpus}"
    narrowed = ["prlimit", "--nofile=512:512", "taskset", "-c", str(cpus[-1]), "nice", "-n", "5",
                "sh", "-c", 'umask 027 && exec "$0" "$@"']  # fmt: skip
    for sandbox, used, seen in (
        (["setpriv", "--no-new-privs"], False, as_here),
        (narrowed, True, f"0 0027 512 {min(nice + 5, 19)} [{cpus[-1]}]"),
    ):
        run_dir = tmp_path / f"run-{used}"
        result = subprocess.run([*sandbox, sys.executable, str(claims)],
                                env={**env, "RUN_DIR": str(run_dir)}, cwd=tmp_path,
                                capture_output=True, text=True, timeout=240)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.splitlines() == [seen]
        assert warm_event(run_dir).get("used") is used
        if not used:
            assert ("starting cold: another set of capabilities, no_new_privs or seccomp here "
                    "than the warm interpreter's") in result.stderr  # fmt: skip
    assert serves(own_warm)["launches"] == 1


def test_what_a_fork_without_privileges_cannot_take_on_is_named(monkeypatch):
    """Nicer, to the batch or idle policy, likelier for the OOM killer: any
    process may; the opposite needs a capability, and without it the launch
    starts cold, saying why."""
    monkeypatch.setattr(scheduling, "_capable", lambda bit: False)
    warm = {**ORDINARY, "nice": 5, "oom_score_adj": 100}
    for allowed in ({"nice": 10}, {"policy": os.SCHED_IDLE}, {"policy": os.SCHED_BATCH},
                    {"io_priority": 3 << 13}, {"io_priority": 2 << 13 | 7},
                    {"oom_score_adj": 500}, {}):  # fmt: skip
        assert scheduling.refusal({**warm, **allowed}, warm) == "", allowed
    refused = {
        "the warm interpreter runs at nice 5, this launch at 0": {"nice": 0},
        "this launch has another scheduling policy than the warm interpreter": {
            "policy": os.SCHED_FIFO, "rt_priority": 10},
        "the warm interpreter's OOM score adjustment is 100, this launch's -500": {
            "oom_score_adj": -500},
        "this launch has a real-time IO priority the warm interpreter has not": {
            "io_priority": 1 << 13 | 4},
    }  # fmt: skip
    for reason, launch in refused.items():
        assert scheduling.refusal({**warm, **launch}, warm) == reason
    idle = {**warm, "policy": os.SCHED_IDLE}
    assert scheduling.refusal(warm, idle) != ""  # back from idle needs the capability
    monkeypatch.setattr(scheduling, "_capable", lambda bit: True)
    assert scheduling.refusal({**warm, "nice": -5, "oom_score_adj": -500}, warm) == ""


SCHEDULED = """
import os
from pyinit import _native
scheduled = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0),
             _native.io_priority() >> 13, open("/proc/self/oom_score_adj").read().strip())
os.write(1, (" ".join(map(str, scheduled)) + "\\n").encode())  # one write: the ranks share stdout
"""


def test_a_warm_launch_is_scheduled_as_the_shell_asked(warm_env, tmp_path):
    """`nice`, `chrt --idle`, `ionice` and `choom` before `pyinit run` reach its workers
    forked warm, as they reach a cold agent's: the fork took the warm
    interpreter's."""
    script = tmp_path / "scheduled.py"
    script.write_text(SCHEDULED)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        ["chrt", "--idle", "0", "choom", "-n", "300", "--", "nice", "-n", "7", "ionice", "-c",
         "3", PYINIT, "run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--",
         str(script)],
        env=warm_env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [f"7 {os.SCHED_IDLE} 3 300"] * 2
    assert warm_event(run_dir).get("used") is True


READ_ONCE = """
import time
import torch.distributed as dist
print(time.tzname[0], time.strftime("%z", time.localtime(0)), dist.get_debug_level().name)
"""


def test_a_warm_launch_reads_what_was_read_once_again(warm_env, tmp_path):
    """The C library reads TZ once, and torch.distributed reads
    TORCH_DISTRIBUTED_DEBUG as it loads: a warm launch's workers kept the
    warm interpreter's local time (UTC where it had no TZ) and c10d's debug
    level (OFF), where a cold launch's follow the shell. A POSIX TZ needs no
    zone files."""
    script = tmp_path / "read_once.py"
    script.write_text(READ_ONCE)
    run_dir = tmp_path / "run"
    env = {**warm_env, "TZ": "PIT-3", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    result = subprocess.run([PYINIT, "run", "--nproc-per-node", "1", "--run-dir", str(run_dir),
                             "--", str(script)], env=env, capture_output=True, text=True,
                            timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["PIT +0300 DETAIL"]
    assert warm_event(run_dir).get("used") is True


# In a mount namespace of its own, /proc read-only as some containers mount
# it: a warm interpreter, one launch, the interpreter stopped.
UNDER_READ_ONLY_PROC = """
mount -o remount,bind,ro /proc
"$PYINIT" warm start >/dev/null
"$PYINIT" run --nproc-per-node 1 --run-dir "$RUN_DIR" -- "$SCRIPT"
status=$?
"$PYINIT" warm stop >/dev/null
exit $status
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_a_warm_launch_is_served_where_proc_is_read_only(tmp_path):
    """The fork that serves a launch wrote the launch's OOM score even where
    it was the warm interpreter's own: under a read-only /proc the launch
    failed with a traceback. Only what differs is set now."""
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    script = tmp_path / "scheduled.py"
    script.write_text(SCHEDULED)
    run_dir = tmp_path / "run"
    env = folder_env(folder, PYINIT=PYINIT, RUN_DIR=str(run_dir), SCRIPT=str(script))
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             UNDER_READ_ONLY_PROC], env=env, capture_output=True, text=True,
                            timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    mine = scheduling.of(0)  # what the launch inherits from this test
    inherited = [mine["nice"], mine["policy"], mine["io_priority"] >> 13, mine["oom_score_adj"]]
    assert result.stdout.splitlines()[0] == " ".join(map(str, inherited))
    assert "Traceback" not in result.stderr
    assert warm_event(run_dir).get("used") is True


def serves(env: dict[str, str]) -> dict:
    status = subprocess.run([PYINIT, "warm", "status", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def test_deep_json_is_refused_and_it_serves_on(own_warm):
    """Nesting that exhausts json's recursion refuses that request."""
    path = str(Path(own_warm["PYINIT_WARM_DIR"]) / "warm.sock")
    assert ask(path, frame(b"[" * 200_000)) is None
    assert ask(path, frame(b'{"a":' * 100_000)) is None
    log = (Path(own_warm["PYINIT_WARM_DIR"]) / "warm.log").read_text()
    assert log.count("a request that could not be read: malformed JSON: nested too deeply") == 2
    assert serves(own_warm)["launches"] == 0


def test_silent_peers_hold_up_nobody(own_warm):
    """More peers that connect and say nothing than the listen backlog: a
    status request is answered while they are all still connected (each
    has REQUEST_DEADLINE_S to say its request, and is then dropped)."""
    path = str(Path(own_warm["PYINIT_WARM_DIR"]) / "warm.sock")
    silent = []
    try:
        for _ in range(80):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            silent.append(sock)
        serves(own_warm)
        for sock in silent:  # not dropped yet: the answer did not wait for their deadlines
            greeted(sock)
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in silent:
            sock.close()


def mutations(template: dict, seed: int) -> Iterator[tuple[bytes, bool]]:
    """Hostile frames: random bytes, lying lengths, deep or odd JSON, and the
    launch template with a field of its identity, preloads or shape changed
    (always to something the warm interpreter must refuse). Each with whether
    to send the standard streams' descriptors along."""
    import random

    rng = random.Random(seed)
    atoms = [None, True, 0, -1, 2**70, 1.5, float("inf"), "", "x" * 300, "\udcff", [], {}]

    def any_value(depth: int = 0) -> object:
        roll = rng.random()
        if depth > 4 or roll < 0.5:
            return rng.choice(atoms)
        if roll < 0.75:
            return [any_value(depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(["op", "env", "args", "x", ""]): any_value(depth + 1)
                for _ in range(rng.randrange(4))}  # fmt: skip

    while True:
        kind = rng.randrange(8)
        if kind == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(64))), False
        elif kind == 1:
            body = json.dumps(template).encode()
            length = rng.randrange(2**32).to_bytes(4, "little")
            yield length + body[: rng.randrange(len(body))], True
        elif kind == 2:
            depth = rng.randrange(1, 300_000)
            yield frame(rng.choice([b"[", b'{"a":', b'{"op":[']) * depth), False
        elif kind == 3:
            text = json.dumps(any_value(), default=str).encode(errors="surrogateescape")
            yield frame(text), rng.random() < 0.5
        else:
            launch = json.loads(json.dumps(template))
            section = rng.choice(["interpreter", "interpreter", "preloads", "op", "cwd", "env"])
            if section == "interpreter" and rng.random() < 0.5:
                field = rng.choice(sorted(launch["interpreter"]))
                launch["interpreter"][field] = any_value()
                launch["interpreter"]["extra" + str(rng.randrange(9))] = any_value()
            elif section == "preloads":
                launch["preloads"] = [rng.choice(["", "no.such.module", "x" * 500])]
            else:
                launch[section] = any_value()
            if rng.random() < 0.2:
                del launch[rng.choice(sorted(launch))]
            if isinstance(launch.get("interpreter"), dict) and not launch.get("preloads"):
                # Were the rest acceptable: refused anyway, as another interpreter's.
                launch["interpreter"]["version"] = "0.0"
            yield frame(json.dumps(launch, default=str).encode(errors="surrogateescape")), True


@pytest.mark.slow
def test_the_warm_interpreter_survives_ten_thousand_hostile_frames(own_warm, tmp_path):
    path = str(Path(own_warm["PYINIT_WARM_DIR"]) / "warm.sock")
    template = launch_template(own_warm)
    served_before = serves(own_warm)
    with open(os.devnull, "rb") as null:
        fds = [null.fileno()] * 3
        for packet, with_fds in itertools.islice(mutations(template, seed=37), 10_000):
            answer = ask(path, packet, fds if with_fds else [])
            assert answer is None or answer.get("ok") is False, (packet[:200], answer)
    after = serves(own_warm)
    assert after["pid"] == served_before["pid"] and after["launches"] == 0
    result = run(own_warm, tmp_path)  # a real launch is still served, warm
    assert result.returncode == 0, result.stderr[-3000:]
    assert warm_event(tmp_path)["used"] is True


IMPOSTOR = """
import json, os, socket, sys
from pyinit.run.warm import protocol

# Binds the user's warm socket first, greets every peer and writes down what
# each sent: a launch would bring the run's environment and its terminal.
folder = sys.argv[1]
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.path.join(folder, protocol.SOCKET_NAME))
listener.listen()
print("listening", flush=True)
heard = []
while True:
    conn, _ = listener.accept()
    try:
        protocol.send(conn, protocol.GREETING)
        message, fds = protocol.receive(conn, 8)
    except OSError:
        message, fds = None, []
    heard.append({"op": (message or {}).get("op"), "fds": len(fds)})
    with open(os.path.join(folder, "heard.tmp"), "w") as out:
        json.dump(heard, out)
    os.replace(os.path.join(folder, "heard.tmp"), os.path.join(folder, "heard"))
    if message and message.get("op") == "status":
        protocol.send(conn, {"ok": True, "pid": os.getpid(), "preloads": ["torch"],
                             "launches": 0, "running": 0})
    conn.close()
"""


def test_a_listener_that_is_not_who_the_caller_is_is_sent_nothing(tmp_path):
    """A process of this user's in a sandbox (here under no_new_privs) that
    binds the warm socket first is sent no launch: pyinit run asks the
    kernel who listens, starts cold and says why; the impostor never sees
    the run's environment or descriptors."""
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    impostor = tmp_path / "impostor.py"
    impostor.write_text(IMPOSTOR)
    script = tmp_path / "ok.py"
    script.write_text("print('the script ran')\n")
    listening = subprocess.Popen(["setpriv", "--no-new-privs", sys.executable, str(impostor),
                                  str(folder)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert listening.stdout.readline() == "listening\n"
        result = subprocess.run([PYINIT, "run", "--nproc-per-node", "1", "--run-dir",
                                 str(tmp_path / "run"), "--", str(script)],
                                env=folder_env(folder), capture_output=True, text=True,
                                timeout=240)  # fmt: skip
    finally:
        listening.kill()
        listening.communicate()
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "the script ran\n"
    assert ("pyinit run: starting cold: another set of capabilities, no_new_privs or seccomp "
            "here than the warm interpreter's\n") in result.stderr  # fmt: skip
    heard = json.loads((folder / "heard").read_text()) if (folder / "heard").exists() else []
    assert heard and all(h == {"op": None, "fds": 0} for h in heard), heard


def test_an_unusable_socket_folder_says_so_and_the_script_runs_cold(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('the script ran')\n")
    deep = tmp_path / ("d" * 120)  # warm.sock under it is longer than AF_UNIX allows
    deep.mkdir(mode=0o700)
    for folder, said in ((str(deep), "warm.sock: connect: AF_UNIX path too long"),
                         ("relative/folder", "PYINIT_WARM_DIR='relative/folder' is not an "
                          "absolute path")):  # fmt: skip
        env = folder_env(Path(folder))
        result = subprocess.run([PYINIT, "run", "--run-dir", str(tmp_path / "run"), "--",
                                 str(script)], env=env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=240)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "the script ran" in result.stdout
        assert "pyinit run: starting cold: " in result.stderr and result.stderr.count(said) == 1
        status = subprocess.run([PYINIT, "warm", "status"], env=env, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert status.returncode == (1 if folder == str(deep) else 2)
        assert status.stderr.count("\n") == 1 and said in status.stderr
        assert "Traceback" not in result.stderr + status.stderr


def test_a_run_from_a_removed_working_folder_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    line = f"cd {gone} && rmdir {gone} && exec {PYINIT} run -- x.py"
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PWD=str(gone)))  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (f"pyinit: {gone}: the working folder was removed after this shell "
                             "entered it: cd to a folder that exists\n")  # fmt: skip


def test_a_venv_s_python_and_python3_are_one_interpreter(tmp_path):
    """A warm interpreter started as .../bin/python3 serves a launch from
    .../bin/python of the same environment: one binary, one sys.path."""
    from pyinit.run.warm.protocol import Identity

    here = Path(sys.executable)
    other = here.with_name("python3" if here.name != "python3" else "python")
    if not other.exists() or os.path.realpath(other) != os.path.realpath(here):
        pytest.skip(f"{other} is not this interpreter's other name")
    code = ("import json, sys; from pyinit.run.warm.protocol import Identity; "
            "print(json.dumps(Identity.here({}, sys.path[1:]).to_dict()))")  # fmt: skip

    def identity(python: Path) -> dict:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                              cwd=tmp_path)  # fmt: skip
        return json.loads(done.stdout)

    ours = Identity(**identity(here))
    assert ours.difference(Identity(**identity(other)), {}, frozenset()) == ""


def test_environment_reads_are_recorded_as_names_whatever_the_key_s_type():
    from pyinit.run.warm import protocol

    with protocol.recording_environ_reads() as seen:
        os.get_exec_path()  # asks os.environ for b"PATH", as every subprocess start does
        os.environ.get("PYINIT_NO_SUCH_NAME")
        os.environb.get(b"PYINIT_NO_SUCH_BYTES")
    assert {"PATH", "PYINIT_NO_SUCH_NAME", "PYINIT_NO_SUCH_BYTES"} <= seen
    assert all(isinstance(name, str) for name in seen)


@pytest.mark.parametrize("build", ["cpu", "cuda"])
def test_the_compile_caches_before_a_fork_probe_the_cpu_only_for_a_cpu_torch(monkeypatch, build):
    """torch_key always; the CPU's vector-ISA probe (fresh interpreters that
    import torch) only for a torch whose compiled steps run on the CPU."""
    import torch
    from torch._inductor import codecache, cpu_vec_isa

    from pyinit.run.preload import compute_compile_caches

    called: list[str] = []
    monkeypatch.setattr(codecache, "torch_key", lambda: called.append("torch_key"))
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: called.append("probe"))
    monkeypatch.setattr(torch.version, "cuda", None if build == "cpu" else "13.0")
    compute_compile_caches()
    assert called == (["torch_key", "probe"] if build == "cpu" else ["torch_key"])
    called.clear()
    compute_compile_caches(probe_cpu=False)
    assert called == ["torch_key"]
