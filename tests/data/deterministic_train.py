"""A deterministic two-rank DDP run on CPU (gloo) for the warm-start tests:
the same seed, data and order every time, each step's loss printed exactly
(float.hex) to OUT/losses-rankN.txt, and the intra-op thread count the
rank started with to OUT/threads-rankN.txt. With --kill-at N, rank 1 of the
first attempt KILLs itself after step N (the restart tests); later attempts
run to the end. With --compile-once, it first compiles a small function
(dynamo alone, no code generated): a launch that compiles, same losses."""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--kill-at", type=int, default=0)
parser.add_argument("--out", default=".", help="a folder for each rank's losses-rankN.txt")
parser.add_argument("--compile-once", action="store_true")
args = parser.parse_args()
if args.compile_once:
    assert torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(2)).tolist() == [3, 3]
threads_at_start = torch.get_num_threads()
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(1 + rank)
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.path.join(args.out, f"threads-rank{rank}.txt"), "w") as threads:
    print(threads_at_start, file=threads)
out = open(os.path.join(args.out, f"losses-rank{rank}.txt"), "w")  # noqa: SIM115
for step in range(1, args.steps + 1):
    x = torch.randn(8, 16, generator=data)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item().hex()}", file=out, flush=True)
    if args.kill_at and step == args.kill_at and rank == 1 and attempt == 0:
        os.kill(os.getpid(), signal.SIGKILL)
# The model (its DDP reducer) goes before its process group: torch's teardown
# of a reducer whose gloo group is gone can deadlock holding the GIL.
del model, optimizer
dist.destroy_process_group()
