#!/bin/bash
# The data path on a lent GPU machine, in one device call:
#   run(command="bash bench/h200x2_data_acceptance.sh",
#       carry=["build/liburing", "build/wheels"])
# build/liburing: liburing's headers and liburing.a (no liburing-dev there); build/wheels:
# Python 3.12 wheels of cython (the build), hypothesis and tokenizers (the tests), from
#   pip download --python-version 3.12 --only-binary=:all: \
#     --platform manylinux2014_x86_64 cython hypothesis tokenizers -d build/wheels
# Builds pod-init, runs the data tests (the pinned-memory one needs CUDA) and
# `pyinit bench data` on the machine's disk; results packed into $OUT/all.tgz.
set -u
OUT=${OUT:-$PWD/acceptance-out}
R=$PWD
mkdir -p "$OUT"
export POD_INIT_LIBURING_ROOT=$R/build/liburing
python3 -m pip install -q --no-index --find-links "$R/build/wheels" cython hypothesis \
  tokenizers >"$OUT/pip.log" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/pip.log" 2>&1 || {
  tail -50 "$OUT/pip.log"
  exit 1
}
cd /tmp
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 180 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider \
  "$R/tests/test_data.py" "$R/tests/test_sharder.py" "$R/tests/test_io.py" >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -5 "$OUT/pytest.txt"
timeout 300 pyinit bench data --gib "${GIB:-4G}" --rounds 3 --out "$OUT/data" 2>&1 | tail -12
rm -rf /var/tmp/pyinit-bench-data
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
