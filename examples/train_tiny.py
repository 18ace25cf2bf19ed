"""A small transformer language model trained with DDP on token shards read
through TokenShardDataset: NCCL with a GPU for each of the node's ranks,
else gloo on the CPU. Run it under
`pyinit run` (or torchrun):

    pyinit run --nproc-per-node 2 -- examples/train_tiny.py --data build/shards --steps 200

Rank 0 logs loss and tokens/s, checks one all-reduce at the start, and ends
with a summary (also written to $PYINIT_RUN_DIR/summary.json when set).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pyinit.worker
from pyinit import checkpoint
from pyinit.data import TokenShardDataset


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq_len, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)  # fmt: skip
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.position[:n]
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a folder of shards from pyinit shard")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--evict-page-cache", action="store_true",
                        help="evict the shards from the page cache first, so batches are read "
                        "from the disk (not pyinit run's --cold, which starts its agent "
                        "afresh)")  # fmt: skip
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                        help="rank 0 saves the model every N steps (to $PYINIT_RUN_DIR, else "
                        "the working folder), through pyinit.checkpoint")  # fmt: skip
    parser.add_argument("--slow-data", type=float, default=0.0, metavar="S",
                        help="wait S seconds for every batch, as a slow disk or network "
                        "filesystem would make it (pyinit report shows it)")  # fmt: skip
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (inside DDP, as torchtitan compiles its "
                        "blocks before wrapping them)")  # fmt: skip
    args = parser.parse_args()

    # A GPU for each of this node's ranks, or the CPU for all of them (one
    # backend for the whole group: a rank without a GPU cannot join NCCL's).
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpus = torch.cuda.device_count()
    cuda = gpus >= local_ranks
    if 0 < gpus < local_ranks and os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"{local_ranks} ranks on this node and {gpus} GPU(s): training on the CPU",
              file=sys.stderr, flush=True)  # fmt: skip
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    check = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(check)
    expected = world * (world + 1) / 2
    if rank == 0:
        print(f"all-reduce: sum {check.item():.0f} over {world} ranks, expected {expected:.0f}",
              flush=True)  # fmt: skip
    if check.item() != expected:
        raise SystemExit(f"all-reduce gave {check.item()}, expected {expected}")

    torch.manual_seed(0)
    data = TokenShardDataset(args.data, args.seq_len, batch_size=args.batch_size, seed=0,
                             drop_last=True)  # fmt: skip
    if args.evict_page_cache and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        for path in data.paths:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    dist.barrier()
    vocab = data.headers[0].vocab_size
    core = TinyLM(vocab, args.seq_len, args.width, args.layers, heads=4).to(device)
    model = DistributedDataParallel(torch.compile(core) if args.compile else core,
                                    device_ids=[device.index] if cuda else None)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    )

    def epochs() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from data.loader()

    batches = epochs()
    losses: list[float] = []
    step, start, tokens = 0, time.perf_counter(), 0
    while step < args.steps:
        # Under pyinit run, the time in here is the step's data wait (the
        # loader marks its own; a script's own data path would mark it so).
        with pyinit.worker.phase("data"):
            time.sleep(args.slow_data)
            x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        losses.append(reduced.item() / world)
        tokens += x.numel() * world
        step += 1
        if rank == 0 and (step % args.log_every == 0 or step == 1):
            rate = tokens / (time.perf_counter() - start)
            print(f"step {step:5d}  loss {losses[-1]:.3f}  {rate:,.0f} tokens/s", flush=True)
        if rank == 0 and args.checkpoint_every and step % args.checkpoint_every == 0:
            folder = os.environ.get("PYINIT_RUN_DIR", ".")
            checkpoint.save(core.state_dict(), Path(folder, "model.safetensors"))
    batches.close()  # the reader's stream closes, and its counts reach the reader
    seconds = time.perf_counter() - start
    stats = data.reader_stats()
    window = max(1, len(losses) // 10)
    summary = {
        "steps": step,
        "ranks": world,
        "tokens_per_s": tokens / seconds,
        # Means over a tenth of the run at each end (at least one step): the two
        # windows never overlap, so a short run's numbers are not one number twice.
        "first_tenth_mean_loss": sum(losses[:window]) / window,
        "last_tenth_mean_loss": sum(losses[-window:]) / window,
        # From a read's submission to when the stream saw it done, so the time the
        # caller spent on earlier rows counts too: not the device's latency. Rows
        # served from the page cache make no read: nothing to report then.
        "reader_read_to_seen_us": {k: stats["io_latency_us"][k] for k in ("p50", "p99")}
        if stats.get("ios")
        else None,
        "reader_rows_from_page_cache": stats.get("page_cache_reads"),
        "reader_ios": stats.get("ios"),
    }
    if rank == 0:
        print("summary: " + json.dumps(summary), flush=True)
        run_dir = os.environ.get("PYINIT_RUN_DIR")
        if run_dir:
            Path(run_dir, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    # The DDP model goes before its process group: torch's teardown of a reducer
    # whose gloo group is gone can deadlock, holding the GIL, as main() returns.
    del model, optimizer, schedule
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
