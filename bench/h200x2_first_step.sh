#!/bin/bash
# Launch to the first training step on the lent 2xH200 (pyinit run forking its
# workers, pyinit run spawning them, plain torchrun: interleaved), the timeline
# of one pyinit run, and pyinit bench's collectives beside nccl-tests' binaries
# with the same flags, in one device call:
#   run(command="bash bench/h200x2_first_step.sh", kind="nvidia-h200-x2",
#       carry=["build/liburing", "build/wheels", "build/nccl-tests"])
# build/nccl-tests: nccl-tests' source (git archive of NVIDIA/nccl-tests), built
# here against the NCCL that torch carries. Packs $OUT/all.tgz.
set -u
NCCL_PKG=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
mkdir -p /tmp/nccl/lib && ln -sfn "$NCCL_PKG/include" /tmp/nccl/include &&
  ln -sf "$NCCL_PKG"/lib/libnccl.so.2 /tmp/nccl/lib/libnccl.so
CUDA_DIR=$(dirname "$(dirname "$(command -v nvcc)")")
(make -C build/nccl-tests -j 12 MPI=0 CUDA_HOME="$CUDA_DIR" NCCL_HOME=/tmp/nccl \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >/tmp/nccl-tests-build.log 2>&1
  echo "nccl-tests build status $?") &
. bench/device_setup.sh
wait
cp /tmp/nccl-tests-build.log "$OUT/"
export LD_LIBRARY_PATH="$NCCL_PKG/lib:${LD_LIBRARY_PATH:-}"
W=/tmp/first-step
mkdir -p $W
python3 examples/make_corpus.py --out $W/corpus.jsonl --megabytes 8 >/dev/null
pyinit shard $W/corpus.jsonl --out $W/shards --shards 8 --force --quiet
timeout 300 python3 bench/first_step.py --data $W/shards --rounds 3 --steps 20 \
  --machine nvidia-h200-x2 --out "$OUT/first_step" 2>"$OUT/first_step.log"
echo "first_step status $?"
timeout 120 pyinit run --run-dir "$OUT/run" -- examples/train_tiny.py --data $W/shards \
  --steps 20 >"$OUT/run.txt" 2>&1
echo "run status $?"
pyinit timeline "$OUT/run" --json "$OUT/run/timeline.json" --png "$OUT/run/timeline.png"
timeout 240 python3 bench/nccl_tests_compare.py --nccl-tests build/nccl-tests/build \
  --rounds 1 --out "$OUT/nccl" -- -b 8 -e 1G -f 8 2>"$OUT/nccl_compare.log"
echo "nccl_tests_compare status $?"
tail -3 "$OUT/nccl_compare.log"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
