# Sourced by the bench/h200x2_*_acceptance.sh scripts: sets OUT and R, and
# builds and installs pod-init on a lent GPU machine, which has no liburing-dev
# and no network. The device call carries build/liburing (liburing's headers
# and liburing.a, from Debian's liburing-dev) and build/wheels: Python 3.12
# wheels of the build's requirements and the tests' and benchmarks', from
#   pip download --python-version 3.12 --only-binary=:all: \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     scikit-build-core pybind11 cython hypothesis safetensors tokenizers \
#     prometheus-client -d build/wheels
OUT=${OUT:-$PWD/acceptance-out}
R=$PWD
mkdir -p "$OUT"
export POD_INIT_LIBURING_ROOT=$R/build/liburing
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --find-links "$R/build/wheels" scikit-build-core pybind11 \
  cython hypothesis safetensors tokenizers prometheus-client >"$OUT/pip.log" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/pip.log" 2>&1 || {
  tail -50 "$OUT/pip.log"
  exit 1
}
