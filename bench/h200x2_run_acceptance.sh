#!/bin/bash
# pyinit run on a lent GPU machine, in one device call:
#   run(command="bash bench/h200x2_run_acceptance.sh", kind="nvidia-h200-x2",
#       carry=["build/liburing", "build/wheels"])
# (bench/device_setup.sh says what those carry). Builds pod-init,
# trains examples/train_tiny.py on every GPU with NCCL under pyinit run, times
# pyinit run's start-up with NVML present, runs the run tests; packs $OUT/all.tgz.
set -u
. bench/device_setup.sh
W=/tmp/pyinit-run-acceptance
mkdir -p $W
python3 examples/make_corpus.py --out $W/corpus.jsonl --megabytes 8
pyinit shard $W/corpus.jsonl --out $W/shards --shards 8 --force --quiet
timeout 240 pyinit run --run-dir "$OUT/train" -- examples/train_tiny.py --data $W/shards \
  --steps 300 --width 256 --layers 4 --batch-size 32 --seq-len 256 >"$OUT/train.txt" 2>&1
echo "train status $?"
grep -E "all-reduce|step +300|summary|exited" "$OUT/train.txt"
timeout 120 python3 bench/run_startup.py --runs 5 --out "$OUT/startup" 2>&1 | tail -4
cd /tmp
timeout 200 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider "$R/tests/test_run.py" \
  >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -4 "$OUT/pytest.txt"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
