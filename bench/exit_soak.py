"""Scripts that end as users' scripts end, run many times under every launcher,
to show that none of them hangs or aborts at exit because of the launcher:

- ``ddp``: two gloo ranks train a small DDP model on token shards read through
  TokenShardDataset, rank 0 saving a checkpoint, and call
  ``destroy_process_group()`` while the DDP model is still alive, then return
  from ``main()`` (the case that once hung rank 0 under pyinit run);
- ``dcp``: two gloo ranks ``dcp.save`` 512 MiB each through
  ``DirectStorageWriter`` and exit without ``destroy_process_group()`` (the
  case that once aborted with "terminate called without an active exception").

Each runs --runs times under ``pyinit run`` forked (--cold), handed to a warm
interpreter, spawned, and under plain ``torchrun --standalone``, interleaved.
A run that has not ended within --timeout seconds is a hang: its processes'
native and Python stacks (py-spy, when installed) go to DIR/hang-N.txt before
they are KILLed. A run that ends by SIGABRT, or says "terminate called", is an
abort.

    python bench/exit_soak.py [--runs 50] [--cases ddp,dcp] [--launchers ...] [--out DIR]

Prints a table, writes DIR/exit_soak.json; exits 1 when any run hung or
aborted. Run it beside a CPU-bound load (both cores busy) to see what a
loaded machine does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pyinit.jsonfile import write_json

ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = ("fork", "warm", "spawn", "torchrun")

DDP = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from pyinit import checkpoint
from pyinit.data import TokenShardDataset

def main():
    dist.init_process_group("gloo")
    data = TokenShardDataset(sys.argv[1], 64, batch_size=8, seed=0, drop_last=True)
    vocab = data.headers[0].vocab_size
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = DistributedDataParallel(nn.Sequential(nn.Embedding(vocab, 64),
                                                  nn.TransformerEncoder(layer, 2),
                                                  nn.Linear(64, vocab)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(data.loader())
    for step in range(20):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0 and step % 10 == 9:
            checkpoint.save(model.module.state_dict(), os.path.join(sys.argv[2], "m.safetensors"))
    dist.destroy_process_group()  # the DDP model is still alive: freed as main() returns

main()
"""

DCP = """
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from pyinit.checkpoint import DirectStorageWriter
dist.init_process_group("gloo")
state = {"w": torch.full((128, 1 << 20), float(dist.get_rank()))}  # 512 MiB a rank
dcp.save(state, storage_writer=DirectStorageWriter(os.path.join(sys.argv[2], "ckpt")))
print(f"rank {dist.get_rank()}: saved", flush=True)
"""  # no destroy_process_group: the interpreter's exit ends it


def command(launcher: str, script: Path, args: list[str], run_dir: Path) -> list[str]:
    pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"
    if launcher == "torchrun":
        # --log-dir as pyinit run passes it: torchrun's default is a new /tmp folder each time
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "2", "--log-dir", str(run_dir / "torchrun"), str(script), *args]  # fmt: skip
    options = {"fork": ["--cold"], "warm": [], "spawn": ["--cold", "--worker-start", "spawn"]}
    return [pyinit, "run", "--nproc-per-node", "2", "--monitor-interval", "0", "--run-dir",
            str(run_dir), *options[launcher], "--", str(script), *args]  # fmt: skip


def stacks(session: int) -> str:
    """Every process of the run's session: its command line and, with py-spy,
    its native and Python stacks."""
    said = []
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.getsid(int(proc.name)) != session:
                continue
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        said.append(f"== pid {proc.name}: {line[:300]}")
        if spy:
            dump = subprocess.run([spy, "dump", "--native", "--pid", proc.name],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            said.append(dump.stdout + dump.stderr)
    return "\n".join(said)


def one(launcher: str, script: Path, args: list[str], work: Path, env: dict[str, str],
        timeout: float, out: Path, number: int) -> str:  # fmt: skip
    """'ok', 'hang', 'abort' or 'failed N'."""
    run_dir = work / f"run-{number}"
    shutil.rmtree(run_dir, ignore_errors=True)
    with subprocess.Popen(command(launcher, script, args, run_dir), env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True) as proc:  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            (out / f"hang-{number}.txt").write_text(stacks(proc.pid))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return "hang"
    if proc.returncode == -signal.SIGABRT or "terminate called" in output:
        (out / f"abort-{number}.txt").write_text(output[-20000:])
        return "abort"
    if proc.returncode != 0:
        (out / f"failed-{number}.txt").write_text(output[-20000:])
        return f"failed {proc.returncode}"
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="per case and launcher")
    parser.add_argument("--cases", default="ddp,dcp")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a hang")
    parser.add_argument("--out", type=Path, default=Path("build/exit_soak"))
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    launchers = [name for name in args.launchers.split(",") if name]
    unknown = sorted({*cases} - {"ddp", "dcp"}) + sorted({*launchers} - {*LAUNCHERS})
    if unknown or args.runs < 1:
        print(f"exit_soak.py: unknown {', '.join(unknown)}" if unknown else
              "exit_soak.py: --runs must be 1 or more", file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exit-soak-", dir="/var/tmp") as scratch:
        work = Path(scratch)
        (work / "ddp.py").write_text(DDP)
        (work / "dcp.py").write_text(DCP)
        warm_dir = work / "warm"
        warm_dir.mkdir(mode=0o700)
        env = dict(os.environ, PYINIT_WARM_DIR=str(warm_dir), NCCL_NVLS_ENABLE="0",
                   TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")  # fmt: skip
        env.pop("PYINIT_RUN_DIR", None)
        pyinit = shutil.which("pyinit", path=str(Path(sys.executable).parent)) or "pyinit"
        if "ddp" in cases:
            corpus = work / "corpus.jsonl"
            subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "examples" / "make_corpus.py"),
                    "--out",
                    str(corpus),
                    "--megabytes",
                    "1",
                ],
                check=True,
                capture_output=True,
            )
            subprocess.run([pyinit, "shard", str(corpus), "--out", str(work / "shards"),
                            "--shards", "2", "--quiet"], check=True)  # fmt: skip
        if "warm" in launchers:
            subprocess.run([pyinit, "warm", "start"], env=env, check=True, capture_output=True)
        outcomes: dict[str, dict[str, list[str]]] = {c: {name: [] for name in launchers}
                                                     for c in cases}  # fmt: skip
        number = 0
        try:
            for _ in range(args.runs):
                for case in cases:
                    for launcher in launchers:  # interleaved: the machine's load is shared
                        number += 1
                        result = one(launcher, work / f"{case}.py",
                                     [str(work / "shards"), str(work)], work, env, args.timeout,
                                     args.out, number)  # fmt: skip
                        outcomes[case][launcher].append(result)
                        if result != "ok":
                            print(f"run {number} ({case}, {launcher}): {result}", flush=True)
        finally:
            if "warm" in launchers:
                subprocess.run([pyinit, "warm", "stop"], env=env, capture_output=True)
    rows = []
    print(f"{'case':6} {'launcher':9} {'runs':>5} {'ok':>5} {'hangs':>6} {'aborts':>7} "
          f"{'other':>6}")  # fmt: skip
    for case, by_launcher in outcomes.items():
        for launcher, results in by_launcher.items():
            row = {"case": case, "launcher": launcher, "runs": len(results),
                   "ok": results.count("ok"), "hangs": results.count("hang"),
                   "aborts": results.count("abort"),
                   "other": [r for r in results if r.startswith("failed")]}  # fmt: skip
            rows.append(row)
            print(f"{case:6} {launcher:9} {row['runs']:5} {row['ok']:5} {row['hangs']:6} "
                  f"{row['aborts']:7} {len(row['other']):6}")  # fmt: skip
    write_json(args.out / "exit_soak.json", {"runs": args.runs, "rows": rows})
    print(f"results: {args.out / 'exit_soak.json'}")
    return 1 if any(r["hangs"] or r["aborts"] or r["other"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
