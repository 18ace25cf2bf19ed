#!/bin/bash
# Installs pod-init from this checkout into the current Python, for the
# suites (python3 bench/run.py SUITE), on a GPU node as on any other:
#   bash bench/setup.sh
# A node without network or without liburing-dev takes, from the environment:
#   WHEELS=DIR        wheels to install from, offline (pip download them elsewhere:
#                     scikit-build-core pybind11 cython safetensors tokenizers
#                     prometheus-client hypothesis pytest)
#   POD_INIT_LIBURING_ROOT=DIR   liburing's include/ and lib/liburing.a
#   FIO_SRC=DIR       fio's source, built here when fio is not installed
#   NCCL_TESTS_SRC=DIR  nccl-tests' source, built against the NCCL torch
#                     carries; then NCCL_TESTS=DIR/build for the gpu2 suite
set -euo pipefail
cd "$(dirname "$0")/.."
log=/var/tmp/pod-init-bench-setup.log
: >"$log"
pip=(python3 -m pip install -q)
if [ -n "${WHEELS:-}" ]; then
  pip+=(--no-index --find-links "$WHEELS")
fi
"${pip[@]}" scikit-build-core pybind11 cython safetensors prometheus-client hypothesis pytest \
  >>"$log" 2>&1
"${pip[@]}" --no-build-isolation --no-deps . >>"$log" 2>&1 || {
  tail -30 "$log"
  exit 1
}
if [ -n "${FIO_SRC:-}" ] && ! command -v fio >/dev/null; then
  (cd "$FIO_SRC" && ./configure && make -j"$(nproc)") >>"$log" 2>&1
  echo "fio: $FIO_SRC/fio (put $FIO_SRC on PATH)"
fi
if [ -n "${NCCL_TESTS_SRC:-}" ]; then
  nccl=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
  home=/var/tmp/pod-init-nccl-home
  mkdir -p "$home/lib" && ln -sfn "$nccl/include" "$home/include" &&
    ln -sf "$nccl/lib/libnccl.so.2" "$home/lib/libnccl.so"
  cuda=$(dirname "$(dirname "$(command -v nvcc)")")
  # NVCC_GENCODE (e.g. -gencode=arch=compute_90,code=sm_90) builds for one GPU alone, faster.
  make -C "$NCCL_TESTS_SRC" -j"$(nproc)" MPI=0 CUDA_HOME="$cuda" NCCL_HOME="$home" \
    ${NVCC_GENCODE:+NVCC_GENCODE="$NVCC_GENCODE"} >>"$log" 2>&1
  echo "nccl-tests: NCCL_TESTS=$NCCL_TESTS_SRC/build LD_LIBRARY_PATH=$nccl/lib"
fi
echo "pod-init installed: $(command -v pyinit)"
