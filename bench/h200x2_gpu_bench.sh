#!/bin/bash
# The GPU benchmarks on a lent machine, in one device call:
#   run(command="bash bench/h200x2_gpu_bench.sh", kind="nvidia-h200-x2",
#       carry=["build/liburing", "build/wheels"])
# All-reduce sweep 8 B to 8 GiB (nccl-tests' columns, busbw plot), the p2p
# matrix and host copies at 1 GiB, and their tests; packs $OUT/all.tgz.
set -u
. bench/device_setup.sh
cd /tmp
timeout 240 pyinit bench allreduce --max 8G --factor 2 --machine "nvidia-h200-x2" \
  --out "$OUT/allreduce" 2>"$OUT/allreduce.log" | tee "$OUT/allreduce.txt" | tail -12
echo "allreduce status ${PIPESTATUS[0]}"
timeout 120 pyinit bench p2p --size 1G --out "$OUT/p2p" 2>&1 | tee "$OUT/p2p.txt"
timeout 120 pyinit bench h2d --size 1G --out "$OUT/h2d" 2>&1 | tee "$OUT/h2d.txt"
nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1
timeout 200 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider "$R/tests/test_gpu_bench.py" \
  >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -3 "$OUT/pytest.txt"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
