"""NVML through the native core (pyinit.nvml.DriverNvml), against a stand-in
libnvidia-ml.so.1 that answers from a recording of a real node with nvml.h's
types (tests/standin/nvml_replay.c): the view, the health, the monitor's
counters and Xids come through as FakeNvml gives them from the same
recording, a GPU that stops answering is named in one line, and `pyinit
check` loads the library by the driver's own name."""

from __future__ import annotations

import gc
import json
import os
import subprocess
from pathlib import Path

import pytest

from pyinit.monitor import GpuStats
from pyinit.nvml import HEALTH_KEYS, DriverNvml, FakeNvml, NvmlUnavailable, read_nvml

ROOT = Path(__file__).resolve().parent.parent
RECORDING = json.loads((ROOT / "tests" / "data" / "h200x2-nvml.json").read_text())
# GPU 0 as an H200 reports itself; GPU 1 a part without ECC or row remapping.
HEALTH = [{"ecc_enabled": True, "ecc_uncorrected_volatile": 3, "remapped_uncorrectable": 2,
           "remap_pending": True, "remap_failed": False},
          dict.fromkeys(HEALTH_KEYS)]  # fmt: skip


def replay_lines(spec: dict, extra: list[str] = ()) -> str:
    """The stand-in's lines for a `pyinit nvml --record` recording."""
    lines = [f"driver {spec['driver']}"]
    for index, gpu in enumerate(spec["gpus"]):
        numbers = [*gpu["sm"], gpu["memory_total"], gpu["bar1_total"], *gpu["pcie"]]
        lines.append(f"gpu {gpu['bus_id']} {' '.join(map(str, numbers))} {gpu['name']}")
        lines += [f"link {index} {link} {remote} {'-' if kind is None else kind}"
                  for link, remote, kind in gpu["nvlinks"]]  # fmt: skip
        health = gpu.get("health", {})
        if health.get("ecc_enabled") is not None:
            values = [int(health[key]) for key in HEALTH_KEYS]  # the stand-in's order
            lines.append(f"health {index} {' '.join(map(str, values))}")
    for pair, statuses in spec["p2p"].items():
        lines.append(f"p2p {pair.replace(',', ' ')} {' '.join(map(str, statuses))}")
    for pair, level in spec["ancestors"].items():
        lines.append(f"ancestor {pair.replace(',', ' ')} {level}")
    return "\n".join([*lines, *extra]) + "\n"


@pytest.fixture
def replay(tmp_path, monkeypatch):
    """Writes the stand-in's answers and points it at them."""

    def write(spec: dict, extra: list[str] = ()) -> None:
        path = tmp_path / "replay.txt"
        path.write_text(replay_lines(spec, extra))
        monkeypatch.setenv("NVML_REPLAY_FILE", str(path))

    return write


def recording_with_health() -> dict:
    spec = json.loads(json.dumps(RECORDING))
    for gpu, health in zip(spec["gpus"], HEALTH, strict=True):
        gpu["health"] = health
    return spec


def test_the_driver_s_answers_are_the_recorded_node_s(nvml_stand_in, replay):
    spec = recording_with_health()
    replay(spec)
    assert FakeNvml.record(DriverNvml(str(nvml_stand_in))) == spec
    view = read_nvml(DriverNvml(str(nvml_stand_in)))
    assert view == read_nvml(FakeNvml(spec))
    assert [len(g.nvlinks) for g in view.gpus] == [18, 18]
    assert view.gpus[0].bdf == "0000:00:06.0" and view.gpus[0].sm == 90
    assert view.pairs[0].p2p["pci"] == "NS" and view.pairs[0].common_ancestor == "PHB"


def test_the_monitor_reads_counters_and_each_xid_once(nvml_stand_in, replay):
    replay(RECORDING, ["counters 0 GPU-0abc 87 1073741824 2048 4096 61 100 300", "xid 1 79",
                       "xid 0 48"])  # fmt: skip
    stats = GpuStats(DriverNvml(str(nvml_stand_in)))
    assert stats.unavailable is None
    first, second = stats.read(), stats.read()
    assert first[0]["uuid"] == "GPU-0abc" and first[0]["pci_bus_id"] == "0000:00:06.0"
    assert first[0]["utilization_percent"] == 87.0 and first[0]["temperature_celsius"] == 61.0
    assert first[0]["memory_used_bytes"] == 1 << 30
    assert (first[0]["pcie_tx_bytes_per_s"], first[0]["pcie_rx_bytes_per_s"]) == (2 << 20, 4 << 20)
    assert second[0]["nvlink_tx_bytes_per_s"] == 0.0  # the same total twice: nothing sent since
    assert first[1]["nvlink_tx_bytes_per_s"] is None  # GPU 1 has no NVLink counter recorded
    assert [g["xid"] for g in first] == [[48], [79]] and [g["xid"] for g in second] == [[], []]


def test_a_gpu_that_stops_answering_is_named_and_the_rest_still_read(nvml_stand_in, replay):
    replay(RECORDING, ["lost 1"])
    with pytest.raises(NvmlUnavailable, match=r"^GPU 1: nvmlDeviceGetPciInfo_v3: GPU is lost$"):
        read_nvml(DriverNvml(str(nvml_stand_in)))
    samples = GpuStats(DriverNvml(str(nvml_stand_in))).read()
    assert samples[1] == {"gpu": 1, "error": "GPU 1: nvmlDeviceGetUUID: GPU is lost", "xid": []}
    assert samples[0]["pci_bus_id"] == "0000:00:06.0"


def test_a_name_without_its_nul_is_read_to_the_buffer_s_end(nvml_stand_in, replay):
    replay(RECORDING, ["unterminated 1"])
    backend = DriverNvml(str(nvml_stand_in))
    backend.open()
    assert backend.name(0) == "NVIDIA H200" and backend.name(1) == "X" * 96


def test_the_library_stays_loaded_once_nvml_is_shut_down(nvml_stand_in, replay):
    """The driver's threads that nvmlInit starts may outlive nvmlShutdown:
    their code is never unloaded under them."""
    replay(RECORDING)
    backend = DriverNvml(str(nvml_stand_in))
    backend.open()
    backend.close()
    del backend
    gc.collect()
    assert str(nvml_stand_in) in Path("/proc/self/maps").read_text()


def test_the_stand_in_never_answers_for_the_driver_s_library(nvml_stand_in, replay):
    replay(RECORDING)
    DriverNvml(str(nvml_stand_in)).open()  # loaded into this process for good
    driver = DriverNvml()
    try:
        driver.open()
    except NvmlUnavailable as e:  # no driver here
        assert "cannot load NVML: libnvidia-ml.so.1: " in str(e)
    else:
        assert not driver.counters(0)["uuid"].startswith("GPU-replay-")


def test_a_library_that_is_not_nvml_or_no_library_says_so(nvml_stand_in, tmp_path, monkeypatch):
    monkeypatch.delenv("NVML_REPLAY_FILE", raising=False)
    not_loaded = r"^NVML did not initialise: nvmlInit: Driver Not Loaded$"
    with pytest.raises(NvmlUnavailable, match=not_loaded):
        DriverNvml(str(nvml_stand_in)).open()
    with pytest.raises(NvmlUnavailable, match=r"cannot load NVML: .*nothing\.so: cannot open"):
        DriverNvml(str(tmp_path / "nothing.so")).open()
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/libc.so.6",
                            "/lib/aarch64-linux-gnu/libc.so.6") if os.path.exists(p))  # fmt: skip
    with pytest.raises(NvmlUnavailable, match="is not NVML: it lacks nvmlInit_v2"):
        DriverNvml(libc).open()


def test_check_loads_the_driver_s_library_by_its_name(pyinit_bin, h200x2_tree, nvml_stand_in,
                                                      replay):  # fmt: skip
    """The loader finds the stand-in as it finds the driver's NVML, early,
    in the check's own thread; a lost GPU is a warning naming it."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_stand_in.parent / "driver")}
    command = [pyinit_bin, "check", "--sysfs-root", h200x2_tree, "--expect-gpus", "2", "--kmsg",
               os.devnull, "--json"]  # fmt: skip
    replay(recording_with_health())
    env["NVML_REPLAY_FILE"] = os.environ["NVML_REPLAY_FILE"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    # GPU 0's uncorrected ECC errors and its remap waiting for a reset, as NVML told them.
    nvml = {(p["state"], p["code"], p["device"]) for p in json.loads(done.stdout)["problems"]
            if p["probe"] == "nvml"}  # fmt: skip
    assert nvml == {("CRITICAL", "ECC_UNCORRECTED", "0000:00:06.0"),
                    ("WARNING", "ROW_REMAP_PENDING", "0000:00:06.0")}, done.stdout  # fmt: skip
    assert done.returncode == 2
    replay(RECORDING, ["lost 0"])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    nvml = [p for p in json.loads(done.stdout)["problems"] if p["probe"] == "nvml"]
    assert [(p["state"], p["code"]) for p in nvml] == [("WARNING", "NVML_UNAVAILABLE")], done.stdout
    assert nvml[0]["message"] == "GPU 0: nvmlDeviceGetPciInfo_v3: GPU is lost"
    assert done.stderr == ""


def test_a_run_s_preflight_reads_the_driver_s_nvml_by_its_name(
    pyinit_bin, h200x2_tree, nvml_stand_in, replay, tmp_path
):
    """`pyinit run` starts NVML early, as the check does, and its preflight
    reads the driver's library: GPU 0's uncorrected ECC errors keep a strict
    run from starting, with the finding named and nothing of the script run."""
    script = tmp_path / "ran.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    replay(recording_with_health())
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_stand_in.parent / "driver"),
           "NVML_REPLAY_FILE": os.environ["NVML_REPLAY_FILE"]}  # fmt: skip
    done = subprocess.run([pyinit_bin, "run", "--sysfs-root", h200x2_tree, "--expect-gpus", "2",
                           "--preflight", "strict", "--rescan", "--nproc-per-node", "1",
                           "--run-dir", str(tmp_path / "run"), "--", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "ECC_UNCORRECTED" in done.stderr and "0000:00:06.0" in done.stderr, done.stderr
    assert "not starting (--preflight strict)" in done.stderr
    assert not (tmp_path / "ran").exists()
