#!/bin/bash
# The example trained under pyinit run on a lent GPU machine, and its report,
# in one device call:
#   run(command="bash bench/h200_report.sh", carry=["build/liburing", "build/wheels"])
# The run folder (events, step records, monitor samples) comes back as $OUT/run.tgz,
# its report as $OUT/report.html; docs/report-h200.png is a headless-Chromium
# screenshot of that.
set -u
. bench/device_setup.sh
cd /tmp
python3 "$R/examples/make_corpus.py" --out corpus.jsonl --megabytes 8 >/dev/null
pyinit shard corpus.jsonl --out shards --shards 4 --force --quiet
pyinit run --nproc-per-node auto --run-dir run --monitor-interval 1 -- \
  "$R/examples/train_tiny.py" --data shards --steps 6000 --log-every 1000 \
  --checkpoint-every 2000 2>&1 | tail -4
rm -f run/model.safetensors
pyinit report run --price-per-gpu-hour 3.5 --out "$OUT/report.html"
tar czf "$OUT/run.tgz" run
