#!/bin/bash
# pyinit check on the lent 2xH200 beside nvidia-smi -q (interleaved wall times), and a
# stall under NCCL (rank 1 asleep) to see the flight recorder's dump land in the run
# folder, in one device call:
#   run(command="bash bench/h200x2_check.sh", kind="nvidia-h200-x2",
#       carry=["build/liburing", "build/wheels"])
set -u
. bench/device_setup.sh
python3 - "$OUT/check_time.json" <<'PY'
import json, statistics, subprocess, sys, time
times = {"pyinit check": [], "nvidia-smi -q": []}
commands = {"pyinit check": ["pyinit", "check", "--expect-gpus", "2"], "nvidia-smi -q": ["nvidia-smi", "-q"]}
for i in range(10):
    for name in (list(commands) if i % 2 == 0 else list(commands)[::-1]):
        began = time.perf_counter()
        done = subprocess.run(commands[name], capture_output=True, text=True)
        times[name].append(time.perf_counter() - began)
        if i == 0 and name == "pyinit check":
            print(done.stdout.strip(), "exit", done.returncode)
for name, values in times.items():
    print(f"{name:16} median {statistics.median(values) * 1e3:7.1f} ms  (min {min(values) * 1e3:.1f})")
json.dump(times, open(sys.argv[1], "w"), indent=1)
PY
cat >/tmp/nccl_stall.py <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
w = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(w.parameters(), lr=0.01)
for step in range(1, 100):
    if rank == 1 and step == 6 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(3600)
    w(torch.ones(8, 64, device="cuda")).sum().backward()
    for p in w.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad(); torch.cuda.synchronize(); time.sleep(0.05)
PY
timeout 120 pyinit run --stall-timeout 8 --run-dir "$OUT/stall" -- /tmp/nccl_stall.py 2>&1 | grep "pyinit run"
echo "stall status ${PIPESTATUS[0]}"
ls -la "$OUT/stall/flight-recorder" "$OUT"/stall/stall-1
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
