#!/bin/bash
# The IO acceptance run on a lent GPU machine (no liburing-dev there: the
# headers and liburing.a travel in build/liburing), in one device call:
#   run(command="bash bench/h200x2_io_acceptance.sh", carry=["build/liburing", "build/wheels"])
# (build/wheels: hypothesis and its dependencies, for the tests; pip download them here.)
# Builds pod-init, runs the whole test suite (GPU tests included) and the IO benchmark on the
# machine's own disk (a data file written first), packs results into $OUT/all.tgz.
set -u
OUT=${OUT:-$PWD/acceptance-out}
R=$PWD
mkdir -p "$OUT"
export POD_INIT_LIBURING_ROOT=$R/build/liburing
python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 || {
  tail -50 "$OUT/pip.log"
  exit 1
}
{
  uname -r
  lsblk -o NAME,SIZE,TYPE,MOUNTPOINT,LOG-SEC,ROTA,MODEL
  df -h /var/tmp
  command -v fio && fio --version
  python3 -c "import hypothesis" 2>&1
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
cd /tmp
python3 -m pip install -q --no-index --find-links "$R/build/wheels" hypothesis >>"$OUT/pip.log" 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 300 python3 -m pytest -q --rootdir "$R" "$R/tests" -p no:cacheprovider >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -5 "$OUT/pytest.txt"
DATA=/var/tmp/pyinit-bench.dat
head -c $((4 << 30)) /dev/urandom >"$DATA" && sync
timeout 420 pyinit bench io "$DATA" --runtime "${RUNTIME:-3}" --rounds "${ROUNDS:-3}" \
  --machine "nvidia-h200-x2 (Firecracker VM, virtio disk)" --out "$OUT/io/io_bench.json" 2>&1 | tail -14
rm -f "$DATA"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
