"""A training loop under NCCL in which rank 1 stops at step 6 of the first
attempt, for `pyinit run --stall-timeout` to catch, naming the rank, with
NCCL's flight recorder dumped into the run folder."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
model = torch.nn.Linear(64, 64).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 100):
    if rank == 1 and step == 6 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(3600)
    model(torch.ones(8, 64, device="cuda")).sum().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    time.sleep(0.05)
