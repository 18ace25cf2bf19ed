#!/bin/bash
# The data path on a lent GPU machine, in one device call:
#   run(command="bash bench/h200x2_data_acceptance.sh",
#       carry=["build/liburing", "build/wheels"])
# Builds pod-init, runs the data tests (the pinned-memory one needs CUDA) and
# `pyinit bench data` on the machine's disk; results packed into $OUT/all.tgz.
set -u
. bench/device_setup.sh  # build/liburing and build/wheels: see there
cd /tmp
timeout 180 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider \
  "$R/tests/test_data.py" "$R/tests/test_sharder.py" "$R/tests/test_io.py" >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -5 "$OUT/pytest.txt"
timeout 300 pyinit bench data --gib "${GIB:-4G}" --rounds 3 --out "$OUT/data" 2>&1 | tail -12
rm -rf /var/tmp/pyinit-bench-data
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
