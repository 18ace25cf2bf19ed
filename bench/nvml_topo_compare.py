"""Compares pod-init's GPU pair levels with NVML's common-ancestor levels on a
live machine, and records both beside `nvidia-smi topo -m`.

Run on a machine with the NVIDIA driver and nvidia-ml-py:
    python bench/nvml_topo_compare.py [--pod-init PATH] [--out DIR]
Exit status 1 when a pair disagrees.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from pyinit.jsonfile import write_json

REPO = Path(__file__).resolve().parent.parent
# nvmlGpuTopologyLevel_t; pod-init's levels use the same numbers.
NVML_LEVELS = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def nvml_bdf(bus_id: bytes | str) -> str:
    """NVML's "00000000:00:06.0" -> sysfs's "0000:00:06.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, rest = text.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pod-init", default=shutil.which("pod-init") or "pod-init")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="folder for nvml_topo_compare.json",
    )
    args = parser.parse_args(argv)
    try:
        import pynvml
    except ImportError:
        print("nvml_topo_compare: nvidia-ml-py is not installed", file=sys.stderr)
        return 2

    proc = subprocess.run([args.pod_init, "topo", "--json"], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        print(f"nvml_topo_compare: pod-init failed: {proc.stderr}", file=sys.stderr)
        return 2
    topo = json.loads(proc.stdout)
    matrix = topo["matrix"]
    ours = {bdf: matrix["rows"][i] for i, bdf in enumerate(matrix["devices"])}
    index = {bdf: i for i, bdf in enumerate(matrix["devices"])}

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        bdfs = [nvml_bdf(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        pairs = []
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                nvml = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                mine = ours[bdfs[i]][index[bdfs[j]]] if bdfs[i] in ours else "missing"
                pairs.append(
                    {
                        "gpu_a": bdfs[i],
                        "gpu_b": bdfs[j],
                        "nvml_value": int(nvml),
                        "nvml": NVML_LEVELS.get(int(nvml), str(nvml)),
                        "pod_init": mine,
                        "agree": NVML_LEVELS.get(int(nvml)) == mine,
                    }
                )
    finally:
        pynvml.nvmlShutdown()

    smi = shutil.which("nvidia-smi")
    smi_text = (
        subprocess.run([smi, "topo", "-m"], capture_output=True, text=True).stdout
        if smi
        else "(nvidia-smi not installed)"
    )

    print(f"{'GPU A':14} {'GPU B':14} {'NVML':>10} {'pod-init':>9}  agree")
    for p in pairs:
        print(
            f"{p['gpu_a']:14} {p['gpu_b']:14} {p['nvml']:>6} ({p['nvml_value']}) "
            f"{p['pod_init']:>9}  {'yes' if p['agree'] else 'NO'}"
        )
    print("\nnvidia-smi topo -m:\n" + smi_text)
    result = {
        "benchmark": "nvml_topo_compare",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "pairs": pairs,
        "nvidia_smi_topo_m": smi_text,
        "pod_init_findings": topo["findings"],
    }
    path = write_json(args.out / "nvml_topo_compare.json", result, indent=2)
    print(f"saved {path}")
    return 0 if all(p["agree"] for p in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
