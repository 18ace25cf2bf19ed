#!/bin/bash
# The NCCL tuner on a lent GPU machine, in one device call:
#   run(command="bash bench/h200_tuner_check.sh", carry=["build/liburing", "build/wheels"])
# With two or more GPUs: pyinit nccl --tune (twice: measured, then cached) and
# pyinit bench allreduce/reducescatter/allgather --tuning, NCCL's default and
# the table in turns. With one GPU (all a 1-GPU machine can show): the GPU
# tests (NCCL loads the plugin, takes a table of its version, refuses a stale
# one; pyinit run uses the cached table), the measuring ranks and the
# bench's --tuning path run end to end, their numbers meaningless (NCCL
# copies instead of communicating with one rank).
set -u
. bench/device_setup.sh
cd /tmp  # the installed package, not the checkout's sources
nvidia-smi -L > "$OUT/gpus.txt"
GPUS=$(wc -l < "$OUT/gpus.txt")
python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import torch, torch.distributed as dist
from pyinit.nccl.tuning import installed_nccl_version
print("torch", torch.__version__, "nccl (torch)", torch.cuda.nccl.version(),
      "nccl (package)", installed_nccl_version())
o = dist.ProcessGroupNCCL.Options()
print("NCCLConfig fields:", [a for a in dir(o.config) if not a.startswith("_")])
PY
timeout 240 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider -rs "$R/tests/test_nccl_gpu.py" \
  > "$OUT/pytest-nccl-gpu.txt" 2>&1
if [ "$GPUS" -ge 2 ]; then
  /usr/bin/time -f "%e s" pyinit nccl --tune --cache tune-cache --out tuned \
    > "$OUT/tune.txt" 2> "$OUT/tune.err"
  /usr/bin/time -f "%e s" pyinit nccl --tune --cache tune-cache --out tuned \
    > "$OUT/tune-cached.txt" 2> "$OUT/tune-cached.err"
  cp tuned/nccl-tuning.json tuned/nccl-tuning.png tuned/nccl.env "$OUT/" 2>/dev/null
  for c in allreduce reducescatter allgather; do
    pyinit bench "$c" --tuning tuned/nccl-tuning.json -b 8 -e 8G -f 2 --rounds 5 \
      --out "$OUT/bench-$c" > "$OUT/bench-$c.txt" 2>&1
  done
else
  NCCL_TUNER_PLUGIN=$(python3 -c "from pyinit.nccl.tuning import plugin_path; print(plugin_path())") \
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m pyinit.nccl.measure --collectives allreduce,reducescatter,allgather \
    --max-bytes 256M --budget 30 --out "$OUT/measure-1gpu.json" > "$OUT/measure-1gpu.log" 2>&1
  echo "measure rc=$?" >> "$OUT/measure-1gpu.log"
  python3 - <<'PY'
import json, os
from pyinit.nccl.tuning import Timings, NodeKind, choose
raw = json.load(open(os.environ["OUT"] + "/measure-1gpu.json"))
key = NodeKind("1 GPU smoke", 1, "-", (), "-", raw["nccl_version"])
tuning = choose(Timings.from_dict(raw["timings"]), key)
tuning.rules = [{"collective": "allreduce", "min_bytes": 0, "max_bytes": 1 << 40,
                 "algorithm": "ring", "protocol": "simple", "channels": 2}]
open("smoke-table.json", "w").write(tuning.to_json())
print(tuning.to_text())
PY
  pyinit bench allreduce --tuning smoke-table.json -b 1M -e 64M -f 4 --rounds 3 \
    --out "$OUT/bench-smoke" > "$OUT/bench-smoke.txt" 2>&1
  echo "bench rc=$?" >> "$OUT/bench-smoke.txt"
fi
tail -3 "$OUT/pytest-nccl-gpu.txt"
