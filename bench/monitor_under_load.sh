#!/bin/bash
# pyinit monitor sampling every 0.5 s while an all-reduce sweep and then host
# copies run; prints each phase's peak utilization, PCIe and NVLink traffic
# per GPU. OUT: the results folder.
set -euo pipefail
pyinit monitor --interval 0.5 --out "$OUT/monitor.jsonl" --textfile "$OUT/podinit.prom" \
  2>"$OUT/monitor.log" &
monitor=$!
trap 'kill $monitor 2>/dev/null || true' EXIT
sleep 3
echo "allreduce $(date +%s.%N)" >"$OUT/phases.txt"
pyinit bench allreduce --min 64M --max 4G --iterations 40 --out "$OUT/allreduce" >/dev/null 2>&1
echo "h2d $(date +%s.%N)" >>"$OUT/phases.txt"
pyinit bench h2d --size 2G --iterations 40 --out "$OUT/h2d" >/dev/null 2>&1
echo "end $(date +%s.%N)" >>"$OUT/phases.txt"
sleep 3
kill $monitor
wait $monitor || true
python3 - "$OUT" <<'PY'
import json, sys

out = sys.argv[1]
marks = {name: float(t) for name, t in (line.split() for line in open(f"{out}/phases.txt"))}
samples = [json.loads(line) for line in open(f"{out}/monitor.jsonl")]


def phase(t):
    if t < marks["allreduce"]:
        return "idle"
    if t < marks["h2d"]:
        return "allreduce"
    return "h2d" if t < marks["end"] else "after"


def gbs(*values):
    return sum(v or 0 for v in values) / 1e9


for name in ("idle", "allreduce", "h2d", "after"):
    rows = [s for s in samples if phase(s["time"]) == name]
    for g in range(len(rows[0]["gpus"]) if rows else 0):
        gpus = [s["gpus"][g] for s in rows]
        util = max(x["utilization_percent"] for x in gpus)
        pcie = max(gbs(x["pcie_tx_bytes_per_s"], x["pcie_rx_bytes_per_s"]) for x in gpus)
        nvlink = max(gbs(x["nvlink_tx_bytes_per_s"], x["nvlink_rx_bytes_per_s"]) for x in gpus)
        print(f"{name:9} GPU{g}: {len(rows)} samples, max util {util:.0f} %, "
              f"max PCIe {pcie:.1f} GB/s, max NVLink {nvlink:.1f} GB/s")
PY
