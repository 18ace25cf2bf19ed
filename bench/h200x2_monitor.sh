#!/bin/bash
# The monitor on a lent GPU machine while the GPU benchmarks run, in one call:
#   run(command="bash bench/h200x2_monitor.sh", kind="nvidia-h200-x2",
#       carry=["build/liburing", "build/wheels"])
# Samples every 0.5 s into monitor.jsonl during an all-reduce sweep and the host
# copies, then the monitor tests; packs $OUT/all.tgz.
set -u
. bench/device_setup.sh
cd /tmp
pyinit monitor --interval 0.5 --out "$OUT/monitor.jsonl" --textfile "$OUT/podinit.prom" \
  2>"$OUT/monitor.log" &
monitor=$!
sleep 3
echo "allreduce start $(date +%s.%N)" >"$OUT/phases.txt"
pyinit bench allreduce --min 64M --max 4G --iterations 40 --out "$OUT/allreduce" >/dev/null 2>&1
echo "h2d start $(date +%s.%N)" >>"$OUT/phases.txt"
pyinit bench h2d --size 2G --iterations 40 --out "$OUT/h2d" >/dev/null 2>&1
echo "end $(date +%s.%N)" >>"$OUT/phases.txt"
sleep 3
kill $monitor
wait $monitor
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
phases = [line.split() for line in open(f"{out}/phases.txt")]
marks = {p[0]: float(p[-1]) for p in phases}
samples = [json.loads(l) for l in open(f"{out}/monitor.jsonl")]
def phase(t):
    if t < marks["allreduce"]: return "idle"
    if t < marks["h2d"]: return "allreduce"
    return "h2d" if t < marks["end"] else "after"
for name in ("idle", "allreduce", "h2d", "after"):
    rows = [s for s in samples if phase(s["time"]) == name]
    for g in range(len(rows[0]["gpus"]) if rows else 0):
        util = max(s["gpus"][g]["utilization_percent"] for s in rows)
        pcie = max((s["gpus"][g]["pcie_tx_bytes_per_s"] + s["gpus"][g]["pcie_rx_bytes_per_s"]) / 1e9 for s in rows)
        nvlink = max(((s["gpus"][g]["nvlink_tx_bytes_per_s"] or 0) + (s["gpus"][g]["nvlink_rx_bytes_per_s"] or 0)) / 1e9 for s in rows)
        print(f"{name:9} GPU{g}: {len(rows)} samples, max util {util:.0f} %, max PCIe {pcie:.1f} GB/s, "
              f"max NVLink {nvlink:.1f} GB/s")
PY
timeout 120 python3 -m pytest -q --rootdir "$R" -p no:cacheprovider "$R/tests/test_monitor.py" \
  >"$OUT/pytest.txt" 2>&1
echo "pytest status $?"
tail -3 "$OUT/pytest.txt"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz" &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +
