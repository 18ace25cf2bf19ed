"""Asks the driver's NVML every question pyinit asks, once through pyinit's
own path (pyinit.nvml.DriverNvml, the native core) and once through
nvidia-ml-py, and lists every answer that differs.

Run on a machine with the NVIDIA driver and nvidia-ml-py (which pyinit no
longer needs; install it beside for this comparison):
    python bench/nvml_driver_compare.py [--out DIR]
Exit status 1 when an answer differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pyinit.jsonfile import write_json
from pyinit.nvml import DriverNvml, NvmlUnavailable

# nvml.h's values for the queries below.
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper
ENABLED, UNCORRECTED, VOLATILE, GPU_SENSOR = 1, 1, 0, 0
NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def reference(n: Any, gpu: int, count: int) -> dict[str, Any]:
    """nvidia-ml-py's answers for GPU `gpu`, in DriverNvml's shapes."""
    h = n.nvmlDeviceGetHandleByIndex(gpu)
    links = []
    for link in range(MAX_NVLINKS):
        try:
            if n.nvmlDeviceGetNvLinkState(h, link) != ENABLED:
                continue
            remote = text(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
        except n.NVMLError:
            continue
        try:
            kind: int | None = int(n.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
        except n.NVMLError:
            kind = None
        links.append((link, remote, kind))
    _, remapped, pending, failed = n.nvmlDeviceGetRemappedRows(h)
    fields = n.nvmlDeviceGetFieldValues(
        h, [(f, link) for f in (NVLINK_TX, NVLINK_RX) for link in range(MAX_NVLINKS)]
    )
    tx = [int(v.value.ullVal) for v in fields[:MAX_NVLINKS] if v.nvmlReturn == 0]
    pcie = (
        n.nvmlDeviceGetCurrPcieLinkGeneration(h),
        n.nvmlDeviceGetMaxPcieLinkGeneration(h),
        n.nvmlDeviceGetCurrPcieLinkWidth(h),
        n.nvmlDeviceGetMaxPcieLinkWidth(h),
    )
    health = {
        "ecc_enabled": bool(n.nvmlDeviceGetEccMode(h)[0]),
        "ecc_uncorrected_volatile": n.nvmlDeviceGetTotalEccErrors(h, UNCORRECTED, VOLATILE),
        "remapped_uncorrectable": remapped,
        "remap_pending": bool(pending),
        "remap_failed": bool(failed),
    }
    peers = {o: n.nvmlDeviceGetHandleByIndex(o) for o in range(count) if o != gpu}
    return {
        "bus_id": text(n.nvmlDeviceGetPciInfo(h).busId),
        "name": text(n.nvmlDeviceGetName(h)),
        "cuda_capability": tuple(n.nvmlDeviceGetCudaComputeCapability(h)),
        "memory_total": n.nvmlDeviceGetMemoryInfo(h).total,
        "bar1_total": n.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total,
        "pcie_link": pcie,
        "nvlinks": links,
        "health": health,
        "uuid": text(n.nvmlDeviceGetUUID(h)),
        "nvlink_tx_counted": 1024 * sum(tx) if tx else None,
        "temperature_celsius": float(n.nvmlDeviceGetTemperature(h, GPU_SENSOR)),
        "p2p": {
            o: [int(n.nvmlDeviceGetP2PStatus(h, p, c)) for c in range(5)] for o, p in peers.items()
        },
        "ancestor": {o: int(n.nvmlDeviceGetTopologyCommonAncestor(h, p)) for o, p in peers.items()},
    }


def ours(d: DriverNvml, gpu: int, count: int) -> dict[str, Any]:
    counters = d.counters(gpu)
    others = [o for o in range(count) if o != gpu]
    return {
        "bus_id": d.bus_id(gpu), "name": d.name(gpu), "cuda_capability": d.cuda_capability(gpu),
        "memory_total": d.memory_total(gpu), "bar1_total": d.bar1_total(gpu),
        "pcie_link": d.pcie_link(gpu), "nvlinks": d.nvlinks(gpu), "health": d.health(gpu),
        "uuid": counters["uuid"], "nvlink_tx_counted": counters["nvlink_tx_bytes_total"],
        "temperature_celsius": counters["temperature_celsius"],
        "p2p": {o: [d.p2p_status(gpu, o, c) for c in range(5)] for o in others},
        "ancestor": {o: d.common_ancestor(gpu, o) for o in others},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help="folder for nvml_driver_compare.json")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import pynvml
    except ImportError:
        print("nvml_driver_compare: nvidia-ml-py is not installed", file=sys.stderr)
        return 2
    driver = DriverNvml()
    try:
        driver.open()
    except NvmlUnavailable as e:
        print(f"nvml_driver_compare: {e}", file=sys.stderr)
        return 1
    pynvml.nvmlInit()
    version = driver.driver_version()
    try:
        count = driver.device_count()
        differences = []
        if text(pynvml.nvmlSystemGetDriverVersion()) != version:
            differences.append(("driver", version, text(pynvml.nvmlSystemGetDriverVersion())))
        if pynvml.nvmlDeviceGetCount() != count:
            differences.append(("count", count, pynvml.nvmlDeviceGetCount()))
        answers = []
        for gpu in range(count):
            mine, theirs = ours(driver, gpu, count), reference(pynvml, gpu, count)
            # A temperature read a moment apart may move by a degree or two.
            if abs(mine["temperature_celsius"] - theirs["temperature_celsius"]) <= 2:
                theirs["temperature_celsius"] = mine["temperature_celsius"]
            differences += [(f"GPU {gpu} {key}", mine[key], theirs[key])
                            for key in mine if mine[key] != theirs[key]]  # fmt: skip
            answers.append({key: repr(value) for key, value in mine.items()})
    finally:
        pynvml.nvmlShutdown()
        driver.close()
    print(f"{count} GPU(s), driver {version}")
    for what, mine, theirs in differences:
        print(f"DIFFERS {what}: pyinit {mine!r}, nvidia-ml-py {theirs!r}")
    print(f"{len(differences)} answer(s) differ")
    write_json(
        args.out / "nvml_driver_compare.json",
        {"answers": answers, "differences": [list(map(repr, d)) for d in differences]},
    )
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
