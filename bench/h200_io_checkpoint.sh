#!/bin/bash
# The reader's plain API, streams and checkpoint writes on a lent GPU machine's
# own disk, beside fio built there from source, in one device call:
#   run(command="bash bench/h200_io_checkpoint.sh",
#       carry=["build/liburing", "build/wheels", "build/fio"])
# build/fio: fio's source (git -C <fio checkout> archive HEAD | tar -x -C build/fio);
# build/wheels also holds safetensors (pip download ... safetensors).
# Benchmarks first (they matter most), then CUDA tensors through a checkpoint, then the
# IO tests. Results under $OUT/io, $OUT/checkpoint, $OUT/pytest.txt.
set -u
. bench/device_setup.sh
python3 -m pip install -q --no-index --find-links "$R/build/wheels" safetensors >>"$OUT/pip.log" 2>&1
(cd "$R/build/fio" && ./configure >"$OUT/fio-build.log" 2>&1 && make -j"$(nproc)" >>"$OUT/fio-build.log" 2>&1) ||
  tail -20 "$OUT/fio-build.log"
export PATH=$R/build/fio:$PATH
{
  uname -r
  lsblk -o NAME,SIZE,TYPE,MOUNTPOINT,LOG-SEC,ROTA,MODEL
  cat /sys/kernel/mm/transparent_hugepage/enabled
  fio --version
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
cd /tmp
MACHINE="lent H200 machine, $(nvidia-smi -L | wc -l) GPU (Firecracker VM, virtio disk)"
DATA=/var/tmp/pyinit-bench.dat
head -c $((4 << 30)) /dev/urandom >"$DATA" && sync
timeout 240 pyinit bench io "$DATA" --runtime 3 --rounds 3 --machine "$MACHINE" \
  --out "$OUT/io/io_bench.json" 2>&1 | tail -17
rm -f "$DATA"
timeout 150 pyinit bench checkpoint --size 2G --rounds 3 --machine "$MACHINE" \
  --out "$OUT/checkpoint/checkpoint.json" 2>&1 | tail -7
python3 - <<'PY'
import torch
from pyinit import checkpoint
last = f"cuda:{torch.cuda.device_count() - 1}"
state = {"w": torch.randn(1024, 1024, device="cuda:0"), "b": torch.ones(7, device=last)}
path = "/var/tmp/pyinit-cuda.safetensors"
expected = {name: tensor.clone() for name, tensor in state.items()}
pending = checkpoint.save(state, path, background=True)
state["w"].add_(1)  # after the snapshot: not in the file
crc = pending.wait()
back = checkpoint.load(path, device="cuda:0")
ok = all(torch.equal(back[name].cpu(), expected[name].cpu()) for name in expected)
print(f"CUDA tensors through a background checkpoint: crc {crc:08x}, equal {ok}")
PY
rm -f /var/tmp/pyinit-cuda.safetensors
timeout 150 python3 -m pytest -q --rootdir "$R" "$R/tests/test_io.py" "$R/tests/test_checkpoint.py" \
  -p no:cacheprovider >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -4 "$OUT/pytest.txt"
