#!/bin/bash
# The NCCL acceptance run on a lent GPU machine, in one call of the device tool:
#   run(command="bash bench/h200x2_nccl_acceptance.sh", kind="nvidia-h200-x2")
# Builds and installs pod-init there, records NVML, writes both tools' NCCL
# files, runs the test suite (the GPU tests included) and the all-reduce
# comparison, and packs everything into $OUT/all.tgz (the tool returns few files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/acceptance-out}
R=$PWD
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 || {
  tail -50 "$OUT/pip.log"
  exit 1
}
cd /tmp
pyinit nvml --record >"$OUT/nvml-recording.json"
pyinit nvml >"$OUT/pyinit-nvml.txt"
pyinit topo --no-bar0 >"$OUT/pyinit-topo.txt" 2>&1
pyinit nccl --out "$OUT/pyinit-nccl" >"$OUT/pyinit-nccl.txt" 2>&1
pod-init nccl --out "$OUT/pod-init-nccl" >"$OUT/pod-init-nccl.txt" 2>&1
cat "$OUT/pyinit-nccl.txt"
timeout 300 python3 -m pytest -q --rootdir "$R" "$R/tests" -p no:cacheprovider >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -5 "$OUT/pytest.txt"
cd "$R"
timeout 400 python3 bench/nccl_config_compare.py --out-dir "$OUT/bench" --rounds "${ROUNDS:-3}" \
  --machine "nvidia-h200-x2 (2x H200 SXM, Firecracker VM)" 2>&1 | tail -12
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
