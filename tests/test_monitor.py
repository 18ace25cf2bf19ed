"""pyinit monitor: thresholds and alerts driven by a fake NVML on CPU, webhooks
received by a local HTTP server, the Prometheus endpoint and the textfile
parsed with prometheus-client's parser, and the real block devices."""

from __future__ import annotations

import contextlib
import copy
import http.server
import json
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from netns import free_port
from prometheus_client.parser import text_string_to_metric_families

from pyinit import cli
from pyinit import monitor as monitor_module
from pyinit.monitor import AlertEngine, Metrics, Monitor, Thresholds, redact_url
from pyinit.nvml import FakeNvml

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "tests" / "data" / "h200x2-nvml.json").read_text())


def fake_nvml(utilizations: list[float]) -> FakeNvml:
    spec = copy.deepcopy(RECORDED)
    for gpu in spec["gpus"]:
        uuid = f"GPU-{gpu['bus_id'][-7:-5]}"
        gpu["samples"] = [
            {"utilization_percent": u, "pcie_tx_bytes_per_s": 2e9, "uuid": uuid,
             "nvlink_tx_bytes_total": 10**12 * (i + 1), "nvlink_rx_bytes_total": 5 * 10**11 * i}
            for i, u in enumerate(utilizations)
        ]  # fmt: skip
    spec["xids"] = [[1, 79]]
    return FakeNvml(spec)


def test_alerts_need_the_whole_window_to_fire_and_to_resolve():
    engine = AlertEngine(Thresholds(gpu_util_for_s=60, nvme_read_latency_us=0), "node")
    sample = lambda util: {"gpus": [{"gpu": 0, "pci_bus_id": "0000:00:06.0",  # noqa: E731
                                     "utilization_percent": util}]}  # fmt: skip
    timeline = [(0, 50), (10, 90), (20, 50), (30, 50), (50, 50), (79, 50), (80, 50), (90, 40),
                (100, 85), (120, 20), (130, 85), (189, 85), (190, 85), (200, 85)]  # fmt: skip
    changes = []
    for t, util in timeline:
        changes += [(t, status) for status, _ in engine.update(sample(util), t)]
    # Bad from 20 on: fires at 80; clear from 130 on (the dip at 120 restarts the clock).
    assert changes == [(80, "firing"), (190, "resolved")]


RECEIVED: list[tuple[dict, dict]] = []  # (payload, headers) of every webhook call


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        RECEIVED.append((json.loads(body), dict(self.headers)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_fires_once_and_resolves_without_leaking_the_token(tmp_path, monkeypatch, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    RECEIVED.clear()
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps({"gpu_util_for_s": 0.25, "nvme_read_latency_us": 0}))
    url = f"http://127.0.0.1:{server.server_port}/hook?token=SECRET1"
    monkeypatch.setattr(cli, "nvml_backend", fake_nvml([50] * 8 + [85] * 8))
    status = cli.main([
        "monitor", "--interval", "0.1", "--count", "16", "--thresholds", str(thresholds),
        "--webhook", url, "--webhook-header", "Authorization: Bearer SECRET2",
        "--out", str(tmp_path / "m.jsonl"),
    ])  # fmt: skip
    server.shutdown()
    server.server_close()
    assert status == 0
    err = capsys.readouterr().err
    assert "SECRET" not in err and "token=REDACTED" in err
    band = [(p, h) for p, h in RECEIVED
            if p["alerts"][0]["labels"]["alertname"] == "GpuUtilizationOutsideBand"]  # fmt: skip
    statuses = [(p["status"], p["alerts"][0]["labels"]["gpu"]) for p, _ in band]
    assert sorted(statuses) == [("firing", "0"), ("firing", "1"), ("resolved", "0"),
                                ("resolved", "1")]  # fmt: skip
    # Xid 79 on GPU 1 needs more than a job restart: it fires at once and stays.
    xids = [p for p, _ in RECEIVED if p["alerts"][0]["labels"]["alertname"] == "GpuXidNeedsAction"]
    assert [(p["status"], p["alerts"][0]["labels"]["gpu"], p["alerts"][0]["labels"]["xid"],
             p["alerts"][0]["labels"]["action"]) for p in xids] == [
        ("firing", "1", "79", "reboot_node")
    ]  # fmt: skip
    assert "fallen off the bus" in xids[0]["alerts"][0]["annotations"]["summary"]
    payload, headers = band[0]
    alert = payload["alerts"][0]
    assert alert["labels"]["alertname"] == "GpuUtilizationOutsideBand"
    bus_ids = {"0": "0000:00:06.0", "1": "0000:00:07.0"}
    assert alert["labels"]["pci_bus_id"] == bus_ids[alert["labels"]["gpu"]]
    assert payload["version"] == "4" and headers["Authorization"] == "Bearer SECRET2"
    samples = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(samples) == 16 and samples[0]["gpus"][1]["xid"] == [79]
    # NVLink rates come from the counters' deltas: none for the first sample.
    assert samples[0]["gpus"][0]["nvlink_tx_bytes_per_s"] is None
    tx, rx = (
        samples[5]["gpus"][0]["nvlink_tx_bytes_per_s"],
        samples[5]["gpus"][0]["nvlink_rx_bytes_per_s"],
    )
    assert tx == pytest.approx(2 * rx) and tx > 10**12  # 1 TB per ~0.1 s interval
    assert redact_url("https://user:pw@h.example:8443/a?token=x&k=y") == (
        "https://h.example:8443/a?token=REDACTED&k=REDACTED"
    )


def test_prometheus_endpoint_and_textfile_parse(tmp_path):
    monitor = Monitor(fake_nvml([42]), thresholds=Thresholds())
    metrics = Metrics()
    metrics.update(monitor.sample(), [])
    with pytest.raises(ValueError, match="expected \\[HOST:\\]PORT"):
        metrics.serve("localhost:http")
    server = metrics.serve(str(free_port()))  # a bare port: loopback only
    assert server.server_address[0] == "127.0.0.1"
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    utilization = families["podinit_gpu_utilization_ratio"].samples
    assert {s.labels["pci_bus_id"] for s in utilization} == {"0000:00:06.0", "0000:00:07.0"}
    assert all(s.value == pytest.approx(0.42) and s.labels["UUID"].startswith("GPU-")
               and s.labels["gpu"] in ("0", "1") for s in utilization)  # fmt: skip
    assert "podinit_gpu_pcie_tx_bytes_per_second" in families
    metrics.write_textfile(str(tmp_path / "podinit.prom"))
    parsed = {
        f.name for f in text_string_to_metric_families((tmp_path / "podinit.prom").read_text())
    }
    assert "podinit_gpu_utilization_ratio" in parsed and "podinit_gpu_xid" in parsed


def test_the_metrics_port_takes_resets_and_idle_scrapers_quietly(monkeypatch, capfd):
    """A port scan's resets were a traceback each on the monitor's stderr,
    and a connection that never finished its request kept a thread for
    good."""
    monkeypatch.setattr(monitor_module, "SCRAPE_DEADLINE_S", 0.5)
    metrics = Metrics()
    metrics.update(Monitor(fake_nvml([42]), thresholds=Thresholds()).sample(), [])
    server = metrics.serve(str(free_port()))
    address = server.server_address[:2]
    try:
        for _ in range(10):
            conn = socket.create_connection(address)
            conn.sendall(b"GET /metr")
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset mid-request
        with socket.create_connection(address, timeout=30) as idle:
            idle.sendall(b"GET /metrics HTTP/1.1\r\n")  # and nothing more
            assert idle.recv(1) == b""  # dropped once idle, not held
        page = urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=30)
        assert page.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capfd.readouterr().err


def test_the_metrics_port_cuts_slow_scrapers_and_serves_a_few_at_once(monkeypatch):
    """A connection that sent its request a byte at a time (each within the
    idle limit) held a thread for as long as it kept going, and each new one
    took another thread."""
    monkeypatch.setattr(monitor_module, "SCRAPE_DEADLINE_S", 5.0)
    monkeypatch.setattr(monitor_module, "MAX_SCRAPERS", 4)
    metrics = Metrics()
    metrics.update(Monitor(fake_nvml([42]), thresholds=Thresholds()).sample(), [])
    server = metrics.serve(str(free_port()))
    address = server.server_address[:2]
    slow = [socket.create_connection(address, timeout=30) for _ in range(4)]
    stop = threading.Event()

    def drip() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(0.2):
                for conn in slow:
                    conn.sendall(b"G")

    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    try:
        time.sleep(0.5)  # every slot is held
        with socket.create_connection(address, timeout=30) as more:
            assert more.recv(1) == b""  # a fifth: closed unanswered
        began = time.monotonic()
        for conn in slow:
            assert conn.recv(1) == b""  # cut at the deadline
        assert time.monotonic() - began < 20
        stop.set()
        dripping.join()
        page = urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=30)
        assert page.status == 200  # the slots are free again
    finally:
        stop.set()
        for conn in slow:
            conn.close()
        server.shutdown()
        server.server_close()


def test_once_json_without_nvml_reports_block_devices(pyinit_bin, tmp_path):
    result = subprocess.run([pyinit_bin, "monitor", "--once", "--json"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    sample = json.loads(result.stdout)
    devices = {b["device"] for b in sample["block"]}
    assert devices and devices <= {p.name for p in Path("/sys/block").iterdir()}
    if sample["gpus"] == []:
        assert sample["gpu_unavailable"] and "block devices only" in result.stderr
    bad = tmp_path / "t.json"
    bad.write_text('{"gpu_util_lo": 70}')
    refused = subprocess.run([pyinit_bin, "monitor", "--once", "--thresholds", bad],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and f"{bad}: unknown threshold 'gpu_util_lo'" in refused.stderr
    command = [pyinit_bin, "monitor", "--once", "--webhook", "http://127.0.0.1:9/",
               "--webhook-header", "Bearer SECRET3"]  # fmt: skip
    bare = subprocess.run(command, capture_output=True, text=True)
    assert bare.returncode == 2 and "expected 'NAME: VALUE'" in bare.stderr
    assert "SECRET3" not in bare.stderr


def test_plain_monitor_prints_a_live_table(monkeypatch, capsys):
    monkeypatch.setattr(cli, "nvml_backend", fake_nvml([10, 50, 90, 95]))
    monkeypatch.setattr("pyinit.monitor.LiveTable.HEADER_EVERY", 4)
    assert cli.main(["monitor", "--interval", "0.1", "--count", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    gpu_lines = [line for line in out if "  gpu " in line]
    assert len(gpu_lines) == 6  # two GPUs, three samples
    assert [line.split()[3] for line in gpu_lines[-2:]] == ["90", "90"]  # util% column
    assert out[0].startswith("# time") and sum(line.startswith("# time") for line in out) >= 2
    # --once without --json: one human snapshot, no JSON.
    monkeypatch.setattr(cli, "nvml_backend", fake_nvml([42]))
    assert cli.main(["monitor", "--once"]) == 0
    snapshot = capsys.readouterr().out
    assert "# time" in snapshot and "{" not in snapshot


def test_a_receiver_that_never_answers_delays_no_sample(tmp_path, monkeypatch, capsys):
    """The alerts were posted from the sampling loop, 10 s of timeout each:
    a hung Alertmanager stretched 16 samples 0.1 s apart over a minute."""
    silent = socket.create_server(("127.0.0.1", 0))  # never accepts, never answers
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps({"gpu_util_for_s": 0.25, "nvme_read_latency_us": 0}))
    monkeypatch.setattr(cli, "nvml_backend", fake_nvml([50] * 8 + [85] * 8))
    monkeypatch.setattr(monitor_module, "WEBHOOK_DRAIN_S", 1.0)
    began = time.monotonic()
    status = cli.main(["monitor", "--interval", "0.1", "--count", "16", "--thresholds",
                       str(thresholds), "--webhook", f"http://127.0.0.1:{silent.getsockname()[1]}/",
                       "--out", str(tmp_path / "m.jsonl")])  # fmt: skip
    took = time.monotonic() - began
    silent.close()  # the post still waiting fails now, and its thread says so and ends
    for thread in threading.enumerate():
        if thread.name == "pyinit-webhook":
            thread.join(30)
    assert status == 0
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    times = [json.loads(line)["boottime"] for line in lines]
    assert len(times) == 16 and times[-1] - times[0] < 9.0  # 1.5 s unloaded; one timeout is 10
    assert took < 20.0
    assert "failed" in capsys.readouterr().err


def test_credentials_in_a_webhook_url_go_as_basic_auth_and_are_never_logged():
    import base64
    import io

    from pyinit.monitor import Webhook

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    RECEIVED.clear()
    log = io.StringIO()
    url = f"http://alert%40ops:s3cr%3At@127.0.0.1:{server.server_address[1]}/hook"
    payload = {"status": "firing", "alerts": [{"labels": {"alertname": "Test"}}]}
    webhook = Webhook(url, {}, log)
    webhook.send(payload)
    webhook.close()
    server.shutdown()
    server.server_close()
    [(_body, headers)] = RECEIVED
    expected = base64.b64encode(b"alert@ops:s3cr:t").decode()
    assert headers["Authorization"] == f"Basic {expected}"
    assert "sent to http://127.0.0.1:" in log.getvalue()
    assert "s3cr" not in log.getvalue() and "alert@ops" not in log.getvalue()


def test_alertmanager_times_are_wall_clock():
    import time

    from pyinit.monitor import alertmanager_payload

    engine = AlertEngine(Thresholds(gpu_util_for_s=0, nvme_read_latency_us=0), "node")
    sample = {"gpus": [{"gpu": 0, "pci_bus_id": "0000:00:06.0", "utilization_percent": 10}]}
    [(status, alert)] = engine.update(sample, 5.0)  # a monotonic clock reading, as in main()
    entry = alertmanager_payload(status, alert, "node", time.time())["alerts"][0]
    assert entry["startsAt"][:4] == time.strftime("%Y", time.gmtime())  # not 1970


def test_a_line_the_disk_takes_only_part_of_is_cut_off_again(tmp_path, monkeypatch):
    import errno
    import os

    from pyinit import monitor

    path = tmp_path / "samples.jsonl"
    lines = monitor.JsonLines(str(path))
    lines.append('{"sample": 1}')
    write = os.write
    # A full disk in the middle of the line: write(2) takes what fits and says so.
    monkeypatch.setattr(monitor.os, "write", lambda fd, data: write(fd, data[:5]))
    with pytest.raises(OSError) as failed:
        lines.append('{"sample": 2}')
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path)
    monkeypatch.setattr(monitor.os, "write", write)
    lines.append('{"sample": 3}')
    lines.close()
    assert path.read_text() == '{"sample": 1}\n{"sample": 3}\n'


@pytest.mark.root
def test_a_full_disk_under_out_is_said_once_and_the_monitor_goes_on(tmp_path, pyinit_bin):
    import time

    from conftest import fill, loop_filesystem

    with loop_filesystem(tmp_path, 16) as mount:
        fill(mount)
        out = mount / "samples.jsonl"
        proc = subprocess.Popen([pyinit_bin, "monitor", "--interval", "0.1", "--count", "100",
                                 "--out", out], stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        said = proc.stderr.readline()
        while "samples are not written there" not in said and time.monotonic() < deadline:
            said = proc.stderr.readline()
        assert said == (f"pyinit monitor: {out}: No space left on device; samples are not "
                        "written there until it takes them again\n")  # fmt: skip
        (mount / "filler").unlink()  # room again: the monitor writes there again, and says so
        rest = proc.communicate(timeout=60)[1]
        assert proc.returncode == 0, rest
        again = re.fullmatch(rf"pyinit monitor: {out}: written again \((\d+) samples? w[a-z]+ "
                             r"not\)\n", rest)  # fmt: skip
        assert again, rest
        samples = [json.loads(line) for line in out.read_text().splitlines()]
        lost = int(again.group(1))
        assert len(samples) + lost == 100 and samples
