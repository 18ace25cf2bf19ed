"""The golden-metrics monitor: GPU utilization, PCIe bandwidth and NVMe read
latency sampled during training, with thresholds that alert.

    pyinit monitor --interval 5 --prometheus 127.0.0.1:9400 --webhook URL
    pyinit monitor --once --json

Each sample: per GPU (NVML) utilization, memory used, PCIe and NVLink TX/RX
bytes/s, temperature and new XID events; per block device read IOPS and mean read
latency from /sys/block/*/stat deltas. Alerts fire when a condition has held
for its whole window (a single sample never alerts) and resolve when it has
been clear as long. Outputs: JSON Lines, a Prometheus endpoint, a
node_exporter textfile, Alertmanager-style webhooks.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import math
import os
import queue
import re
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from pyinit.errors import InputError
from pyinit.health.xid import ACTIONS, CATALOG, classify
from pyinit.jsonfile import load_json, read_input_text
from pyinit.say import say

SECTOR_BYTES = 512


@dataclass
class Thresholds:
    """Field practice: a training GPU should sit between 75 and 95 % busy;
    NVMe reads above 100 µs mean the data path queues. 0 turns a check off."""

    gpu_util_low: float = 75.0
    gpu_util_high: float = 95.0
    gpu_util_for_s: float = 60.0
    pcie_floor_gbs: float = 0.0  # TX + RX per GPU while it is busy (> 5 %)
    pcie_for_s: float = 60.0
    nvme_read_latency_us: float = 100.0
    nvme_for_s: float = 30.0

    @classmethod
    def from_file(cls, path: str) -> Thresholds:
        # OSError naming the file when it cannot be read; bytes that are not UTF-8 are
        # kept as escapes so the parser, not the codec, says what is wrong, naming the file.
        text = read_input_text(path)
        values = load_json(text, path)
        known = {f.name for f in fields(cls)}
        if not isinstance(values, dict):
            raise InputError(f"{path}: expected a JSON object of thresholds")
        for key, value in values.items():
            if key not in known:
                raise InputError(
                    f"{path}: unknown threshold {key!r} (known: {', '.join(sorted(known))})"
                )
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):  # fmt: skip
                raise InputError(f"{path}: {key} must be a finite number >= 0, not {value!r}")
        return cls(**{k: float(v) for k, v in values.items()})


class BlockStats:
    """Read IOPS and mean read latency per block device from successive
    /sys/block/*/stat readings (fields: reads, merged, sectors, ms reading)."""

    def __init__(self, sys_block: str = "/sys/block"):
        self._root = Path(sys_block)
        self._last: dict[str, tuple[float, int, int, int]] = {}

    def read(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for stat in sorted(self._root.glob("*/stat")):
            name = stat.parent.name
            if name.startswith(("loop", "ram", "zram")):
                continue
            try:
                values = [int(v) for v in stat.read_text().split()]
            except (OSError, ValueError):
                continue
            if len(values) < 4:  # not the kernel's layout (a stray file): no reads to count
                continue
            reads, sectors, ms = values[0], values[2], values[3]
            last = self._last.get(name)
            self._last[name] = (now, reads, sectors, ms)
            if last is None:
                continue
            seconds = now - last[0]
            done = reads - last[1]
            per_second = 1 / seconds if seconds > 0 else 0.0
            out.append({
                "device": name,
                "read_iops": done * per_second,
                "read_bytes_per_s": (sectors - last[2]) * SECTOR_BYTES * per_second,
                "read_latency_us": (ms - last[3]) * 1e3 / done if done > 0 else None,
            })  # fmt: skip
        return out


class GpuStats:
    """NVML's per-GPU counters, through the NvmlBackend interface (the real
    driver or a FakeNvml replay)."""

    def __init__(self, backend: Any = None):
        from pyinit.nvml import DriverNvml, NvmlUnavailable

        self.unavailable: str | None = None
        self._backend = backend if backend is not None else DriverNvml()
        self._nvlink_last: dict[int, tuple[float, int | None, int | None]] = {}
        try:
            self._backend.open()
            self._handles = [self._backend.handle(i) for i in range(self._backend.device_count())]
            self._backend.watch_xid(self._handles)
        except NvmlUnavailable as e:
            self.unavailable = str(e)
            self._handles = []

    def read(self) -> list[dict[str, Any]]:
        from pyinit.nvml import NvmlUnavailable, normalize_bus_id

        out = []
        xids = self._backend.xid_events() if self._handles else []
        now = time.monotonic()
        for index, handle in enumerate(self._handles):
            try:
                counters = self._backend.counters(handle)
                bdf = normalize_bus_id(self._backend.bus_id(handle))
            except NvmlUnavailable as e:  # a GPU that stopped answering: keep sampling the rest
                out.append({"gpu": index, "error": str(e), "xid": []})
                continue
            tx, rx = counters.pop("nvlink_tx_bytes_total"), counters.pop("nvlink_rx_bytes_total")
            last = self._nvlink_last.get(index)
            self._nvlink_last[index] = (now, tx, rx)
            for key, total, before in (
                ("nvlink_tx_bytes_per_s", tx, 1),
                ("nvlink_rx_bytes_per_s", rx, 2),
            ):
                ok = (
                    last is not None
                    and total is not None
                    and last[before] is not None
                    and now > last[0]
                )
                counters[key] = (total - last[before]) / (now - last[0]) if ok else None
            out.append({"gpu": index, "pci_bus_id": bdf, **counters,
                        "xid": [x for i, x in xids if i == index]})  # fmt: skip
        return out


@dataclass
class Alert:
    name: str
    labels: dict[str, str]
    summary: str
    since: float | None = None  # when the state began to differ from `firing`
    firing: bool = False
    started: float = 0.0  # time.monotonic(), for the windows
    started_wall: float = 0.0  # time.time() at the same moment, for Alertmanager's startsAt


class AlertEngine:
    """Each condition must hold for its window to fire and be clear as long
    to resolve: hysteresis by time, so one odd sample neither fires nor
    resolves. `update` returns the transitions (at most one per alert)."""

    def __init__(self, thresholds: Thresholds, instance: str):
        self.thresholds = thresholds
        self.instance = instance
        self._alerts: dict[tuple[str, str], Alert] = {}
        # (GPU labels, xid) of every Xid whose action is more than restarting the
        # application: such a GPU needs an operator, so the alert stays on.
        self._xids_needing_action: dict[tuple[str, int], dict[str, str]] = {}

    def _conditions(
        self, sample: dict[str, Any]
    ) -> list[tuple[str, dict[str, str], bool, float, str]]:
        t = self.thresholds
        found = []
        for gpu in sample.get("gpus", []):
            if "error" in gpu:
                continue
            labels = {
                "gpu": str(gpu["gpu"]),
                "UUID": gpu.get("uuid", ""),
                "pci_bus_id": gpu["pci_bus_id"],
            }
            for xid in gpu.get("xid", []):
                if classify(xid) != "restart_app":
                    self._xids_needing_action[(labels["pci_bus_id"], xid)] = labels
            util = gpu["utilization_percent"]
            if t.gpu_util_low or t.gpu_util_high:
                outside = util < t.gpu_util_low or util > t.gpu_util_high
                found.append(("GpuUtilizationOutsideBand", labels, outside, t.gpu_util_for_s,
                              f"GPU {gpu['gpu']} at {util:.0f} %, outside {t.gpu_util_low:.0f}-"
                              f"{t.gpu_util_high:.0f} %"))  # fmt: skip
            if t.pcie_floor_gbs:
                gbs = (gpu["pcie_tx_bytes_per_s"] + gpu["pcie_rx_bytes_per_s"]) / 1e9
                low = util > 5 and gbs < t.pcie_floor_gbs
                found.append(("GpuPcieBandwidthLow", labels, low, t.pcie_for_s,
                              f"GPU {gpu['gpu']} PCIe {gbs:.2f} GB/s below {t.pcie_floor_gbs} "
                              "while busy"))  # fmt: skip
        for (_, xid), labels in sorted(self._xids_needing_action.items()):
            action = classify(xid)
            meaning = CATALOG.get(xid, ("unknown Xid",))[0]
            found.append(("GpuXidNeedsAction", {**labels, "xid": str(xid), "action": action},
                          True, 0.0, f"GPU {labels['gpu']} Xid {xid} ({meaning}): "
                          f"{ACTIONS[action]}"))  # fmt: skip
        for block in sample.get("block", []):
            latency = block["read_latency_us"]
            if t.nvme_read_latency_us and latency is not None:
                found.append(("BlockReadLatencyHigh", {"device": block["device"]},
                              latency > t.nvme_read_latency_us, t.nvme_for_s,
                              f"{block['device']} reads take {latency:.0f} µs, above "
                              f"{t.nvme_read_latency_us:.0f}"))  # fmt: skip
        return found

    def firing(self) -> list[Alert]:
        return [alert for alert in self._alerts.values() if alert.firing]

    def update(self, sample: dict[str, Any], now: float) -> list[tuple[str, Alert]]:
        changes = []
        for name, labels, bad, window, summary in self._conditions(sample):
            key = (name, json.dumps(labels, sort_keys=True))
            alert = self._alerts.setdefault(key, Alert(name, labels, summary))
            if bad != alert.firing:
                if alert.since is None:
                    alert.since = now
                if now - alert.since >= window:
                    alert.firing = bad
                    alert.since = None
                    if bad:
                        alert.started = now
                        alert.started_wall = time.time()
                        alert.summary = summary
                    changes.append(("firing" if bad else "resolved", alert))
            else:
                alert.since = None
        return changes


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def alertmanager_payload(status: str, alert: Alert, instance: str, now: float) -> dict[str, Any]:
    """One alert in the JSON Alertmanager sends to its webhook receivers."""
    labels = {"alertname": alert.name, "instance": instance, "severity": "warning", **alert.labels}
    entry = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": alert.summary},
        "startsAt": _iso(alert.started_wall),
        "endsAt": _iso(now) if status == "resolved" else "0001-01-01T00:00:00Z",
    }
    return {"version": "4", "status": status, "receiver": "pod-init", "groupLabels": {},
            "commonLabels": labels, "commonAnnotations": entry["annotations"],
            "externalURL": "", "alerts": [entry]}  # fmt: skip


def redact_url(url: str) -> str:
    """The URL without credentials: no user:password, every query value hidden."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    query = "&".join(f"{k}=REDACTED" for k, _ in urllib.parse.parse_qsl(parts.query))
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, query, ""))


# Alerts queued for a receiver that is slow or down; past this they are dropped.
WEBHOOK_BACKLOG = 256
# How long the monitor's end waits for the alerts still queued.
WEBHOOK_DRAIN_S = 10.0


class Webhook:
    """Alertmanager-style POSTs from a thread of their own: a receiver that
    hangs or answers a byte at a time delays its alerts, never the samples."""

    def __init__(self, url: str, headers: dict[str, str], log: IO[str]):
        # user:password@ in the URL: sent as basic auth (urllib would try to resolve
        # "user:password@host" as a host name), and never shown in a log line.
        parts = urllib.parse.urlsplit(url)
        self.headers = dict(headers)
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers.setdefault("Authorization", f"Basic {token}")
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = host + (f":{parts.port}" if parts.port else "")
            url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        self.url = url
        self.log = log
        self._queued: queue.Queue[dict[str, Any] | None] = queue.Queue(WEBHOOK_BACKLOG)
        self._sender = threading.Thread(target=self._send_queued, name="pyinit-webhook",
                                        daemon=True)  # fmt: skip
        self._sender.start()

    def send(self, payload: dict[str, Any]) -> None:
        """Queues the alert for the sender thread."""
        try:
            self._queued.put_nowait(payload)
        except queue.Full:
            self.log.write(f"pyinit monitor: webhook {redact_url(self.url)} is {WEBHOOK_BACKLOG} "
                           "alerts behind; this one is dropped\n")  # fmt: skip

    def close(self) -> None:
        """Waits up to WEBHOOK_DRAIN_S for the queued alerts to go out."""
        deadline = time.monotonic() + WEBHOOK_DRAIN_S
        with contextlib.suppress(queue.Full):
            self._queued.put(None, timeout=WEBHOOK_DRAIN_S)
        self._sender.join(max(0.0, deadline - time.monotonic()))

    def _send_queued(self) -> None:
        while (payload := self._queued.get()) is not None:
            self._post(payload)

    def _post(self, payload: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.url, data=json.dumps(payload).encode(), method="POST",
            headers={"Content-Type": "application/json", **self.headers},
        )  # fmt: skip
        where = redact_url(self.url)
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass  # the status is the answer; a body is not waited for
            name = payload["alerts"][0]["labels"]["alertname"]
            self.log.write(f"pyinit monitor: alert {payload['status']} {name} sent to {where}\n")
        except OSError as e:
            reason = getattr(e, "reason", None) or getattr(e, "code", None) or e.__class__.__name__
            self.log.write(f"pyinit monitor: webhook {where} failed: {reason}\n")


GPU_METRICS = (
    ("utilization_percent", "podinit_gpu_utilization_ratio", "GPU busy share, last period", 0.01),
    ("memory_used_bytes", "podinit_gpu_memory_used_bytes", "GPU memory in use", 1),
    ("pcie_tx_bytes_per_s", "podinit_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", 1),
    ("pcie_rx_bytes_per_s", "podinit_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", 1),
    ("temperature_celsius", "podinit_gpu_temperature_celsius", "GPU temperature", 1),
    ("nvlink_tx_bytes_per_s", "podinit_gpu_nvlink_tx_bytes_per_second", "NVLink data sent", 1),
    ("nvlink_rx_bytes_per_s", "podinit_gpu_nvlink_rx_bytes_per_second", "NVLink data received", 1),
)  # fmt: skip
BLOCK_METRICS = (
    ("read_iops", "podinit_block_read_iops", "completed reads per second", 1),
    ("read_bytes_per_s", "podinit_block_read_bytes_per_second", "bytes read per second", 1),
    ("read_latency_us", "podinit_block_read_latency_seconds", "mean time per completed read", 1e-6),
)  # fmt: skip


class Metrics:
    """The samples as Prometheus gauges, labelled as dcgm-exporter labels GPUs."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        gpu_labels = ("gpu", "UUID", "pci_bus_id", "Hostname")
        self._gpu = {key: Gauge(name, text, gpu_labels, registry=self.registry)
                     for key, name, text, _ in GPU_METRICS}  # fmt: skip
        self._block = {key: Gauge(name, text, ("device", "Hostname"), registry=self.registry)
                       for key, name, text, _ in BLOCK_METRICS}  # fmt: skip
        # Exported as podinit_gpu_xid_total; `action` is the Xid catalog's (pyinit.xid).
        self._xid = Counter("podinit_gpu_xid", "XID events seen", (*gpu_labels, "xid", "action"),
                            registry=self.registry)  # fmt: skip
        self._firing = Gauge("podinit_alert_firing", "1 while the alert fires",
                             ("alertname", "labels"), registry=self.registry)  # fmt: skip
        self._host = os.uname().nodename
        self._lock = threading.Lock()

    def update(self, sample: dict[str, Any], firing: list[Alert]) -> None:
        with self._lock:
            for gpu in sample.get("gpus", []):
                if "error" in gpu:
                    continue
                labels = (str(gpu["gpu"]), gpu.get("uuid", ""), gpu["pci_bus_id"], self._host)
                for key, _, _, scale in GPU_METRICS:
                    if gpu.get(key) is not None:
                        self._gpu[key].labels(*labels).set(gpu[key] * scale)
                for xid in gpu.get("xid", []):
                    self._xid.labels(*labels, str(xid), classify(xid)).inc()
            for block in sample.get("block", []):
                for key, _, _, scale in BLOCK_METRICS:
                    if block.get(key) is not None:
                        self._block[key].labels(block["device"], self._host).set(block[key] * scale)
            self._firing.clear()
            for alert in firing:
                self._firing.labels(alert.name, json.dumps(alert.labels, sort_keys=True)).set(1)

    def write_textfile(self, path: str) -> None:
        from prometheus_client import write_to_textfile

        with self._lock:
            write_to_textfile(path, self.registry)  # a temporary file, then a rename

    def serve(self, address: str) -> Any:
        from prometheus_client import start_http_server

        # A bare port listens on loopback only: metrics leave the node when asked to.
        host, _, port = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"  # [::]:9400 is IPv6
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"--prometheus {address!r}: expected [HOST:]PORT")
        try:
            server, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        except OSError as e:
            reason = e.strerror or str(e)
            raise InputError(f"--prometheus {address!r}: cannot listen there: {reason}") from None
        _scrapers_as_strangers(server)
        return server


# A scraper's whole exchange, request and page, at most (Prometheus' own
# scrape_timeout is 10 s by default); past it the connection is cut.
SCRAPE_DEADLINE_S = 10.0
MAX_SCRAPERS = 16  # connections served at once; more are closed unanswered


def _scrapers_as_strangers(server: Any) -> None:
    """The metrics port answers anyone on the network it listens on: a
    connection reset mid-request (a port scan, a scraper that gives up) was
    a traceback on stderr each, and one that never finishes its request, or
    sends it a byte at a time, held a thread for good (one each, as many as
    came). Connection errors are dropped quietly, a connection is cut at
    SCRAPE_DEADLINE_S, and at most MAX_SCRAPERS are served at once; any other
    error is still shown."""
    shown = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            shown(request, client_address)

    slots = threading.BoundedSemaphore(MAX_SCRAPERS)
    start_serving, serve = server.process_request, server.process_request_thread

    def process_request(request: Any, client_address: Any) -> None:
        if not slots.acquire(blocking=False):
            server.shutdown_request(request)
            return
        try:
            start_serving(request, client_address)
        except BaseException:
            slots.release()
            raise

    def process_request_thread(request: Any, client_address: Any) -> None:
        cut = threading.Timer(SCRAPE_DEADLINE_S, _cut_off, (request,))
        cut.daemon = True
        cut.start()
        try:
            serve(request, client_address)
        finally:
            cut.cancel()
            slots.release()

    server.handle_error = handle_error
    server.process_request = process_request
    server.process_request_thread = process_request_thread


def _cut_off(conn: Any) -> None:
    """A scraper's connection ended past its deadline: its thread's blocked
    read returns at once."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class Monitor:
    def __init__(self, nvml_backend: Any = None, sys_block: str = "/sys/block",
                 thresholds: Thresholds | None = None):  # fmt: skip
        self.gpus = GpuStats(nvml_backend)
        self.block = BlockStats(sys_block)
        self.block.read()  # the first reading only sets the baseline for the deltas
        self.alerts = AlertEngine(thresholds or Thresholds(), os.uname().nodename)

    def sample(self) -> dict[str, Any]:
        # boottime: the clock of the run's events and steps, for pyinit report.
        return {"time": time.time(), "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
                "gpus": self.gpus.read(), "block": self.block.read(),
                "gpu_unavailable": self.gpus.unavailable}  # fmt: skip


class JsonLines:
    """--out: one sample a line, appended whole or not at all. A line that
    the disk takes only part of (it filled up) is cut off again, so that a
    reader of the file never meets half a line."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def append(self, line: str) -> None:
        data = (line + "\n").encode()
        size = os.fstat(self.fd).st_size
        try:
            if os.write(self.fd, data) != len(data):  # the rest would fail: no room
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, size)
            raise OSError(e.errno, e.strerror, self.path) from e

    def close(self) -> None:
        os.close(self.fd)


class Outputs:
    """The files the monitor writes each sample to (--out, --textfile). One
    that fails (a full disk) is said once, and the monitor goes on sampling,
    alerting and serving: those matter most when a disk fills. Said again
    once the file takes samples again. With --once, the one sample not
    written is the command's failure."""

    def __init__(self, once: bool):
        self.once = once
        self.lost: dict[str, int] = {}  # failing file: samples not written there

    def write(self, path: str, write: Callable[..., None], *args: Any) -> None:
        try:
            write(*args)
        except OSError as e:
            if self.once:
                raise OSError(e.errno, e.strerror, path) from e
            if path not in self.lost:
                say(f"pyinit monitor: {path}: {e.strerror or e}; samples are not written "
                    "there until it takes them again")  # fmt: skip
                self.lost[path] = 0
            self.lost[path] += 1
            return
        lost = self.lost.pop(path, 0)
        if lost:
            say(f"pyinit monitor: {path}: written again ({lost} sample"
                f"{'s were' if lost > 1 else ' was'} not)")  # fmt: skip


class LiveTable:
    """What plain `pyinit monitor` prints, in the manner of `nvidia-smi dmon`:
    a line per GPU and per block device each sample, a header every
    HEADER_EVERY lines; figures in GB/s, GiB, µs."""

    HEADER_EVERY = 20
    HEADER = (
        "# time     device      util%  mem GiB  pcie tx/rx GB/s  nvlink tx/rx GB/s  temp C\n"
        "#          device       reads/s    MB/s  read lat us\n"
    )

    def __init__(self, out: IO[str]):
        self._out = out
        self._lines = 0

    def write(self, sample: dict[str, Any]) -> None:
        clock = time.strftime("%H:%M:%S", time.localtime(sample["time"]))
        lines = []
        for gpu in sample.get("gpus", []):
            if "error" in gpu:
                lines.append(f"{clock}  gpu {gpu['gpu']:<6} {gpu['error']}")
                continue
            gb = {key: (gpu.get(key) or 0) / 1e9 for key in (
                "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")}  # fmt: skip
            lines.append(
                f"{clock}  gpu {gpu['gpu']:<6} {gpu.get('utilization_percent') or 0:6.0f}"
                f" {(gpu.get('memory_used_bytes') or 0) / 2**30:8.1f}"
                f" {gb['pcie_tx_bytes_per_s']:8.2f}/{gb['pcie_rx_bytes_per_s']:<7.2f}"
                f" {gb['nvlink_tx_bytes_per_s']:9.2f}/{gb['nvlink_rx_bytes_per_s']:<8.2f}"
                f" {gpu.get('temperature_celsius') or 0:6.0f}"
            )
        for block in sample.get("block", []):
            latency = block["read_latency_us"]
            shown = "-" if latency is None else f"{latency:.0f}"
            lines.append(
                f"{clock}  {block['device']:<10} {block['read_iops']:9.0f}"
                f" {block['read_bytes_per_s'] / 1e6:7.1f}  {shown:>11}"
            )
        for alert in sample.get("alerts_firing", []):
            lines.append(f"{clock}  ALERT {alert['alertname']} {alert.get('gpu', '')}".rstrip())
        for line in lines:
            if self._lines % self.HEADER_EVERY == 0:
                self._out.write(self.HEADER)
            self._out.write(line + "\n")
            self._lines += 1
        self._out.flush()


def _headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, colon, text = value.partition(":")
        if not colon or not name.strip():
            # Not echoed: a header without its name is most likely a bare secret.
            raise InputError("--webhook-header: expected 'NAME: VALUE' (the value is not shown)")
        headers[name.strip()] = text.strip()
    return headers


def watch(args: Any, nvml_backend: Any = None, out: IO[str] | None = None) -> int:
    """`pyinit monitor`'s loop: sample, alert and export until --once, --count or an interrupt."""
    out = out or sys.stdout  # looked up now, so a replaced stdout (a test's) is used
    thresholds = Thresholds.from_file(args.thresholds) if args.thresholds else Thresholds()
    headers = _headers(args.webhook_header or [])
    if args.webhook and (
        not re.match(r"https?://", args.webhook) or not urllib.parse.urlsplit(args.webhook).hostname
    ):
        raise InputError(f"--webhook {redact_url(args.webhook)}: expected an http(s) URL")
    monitor = Monitor(nvml_backend, args.sys_block, thresholds)
    if monitor.gpus.unavailable:
        say(f"pyinit monitor: GPU metrics unavailable ({monitor.gpus.unavailable}); "
            "block devices only")  # fmt: skip
    metrics = Metrics() if (args.prometheus or args.textfile) else None
    server = metrics.serve(args.prometheus) if metrics and args.prometheus else None
    webhook = Webhook(args.webhook, headers, sys.stderr) if args.webhook else None
    lines = JsonLines(args.out) if args.out else None
    outputs = Outputs(args.once)
    # With no machine output asked for, a person is watching: the live table.
    exporting = args.json or args.out or args.prometheus or args.textfile or args.webhook
    table = LiveTable(out) if not exporting else None
    taken = 0
    try:
        time.sleep(0.5 if args.once else args.interval)  # a period for the first deltas
        while True:
            sample = monitor.sample()
            now = time.monotonic()
            changes = monitor.alerts.update(sample, now)
            firing = monitor.alerts.firing()
            sample["alerts_firing"] = [{"alertname": a.name, **a.labels} for a in firing]
            if lines is not None:
                outputs.write(lines.path, lines.append, json.dumps(sample))
            elif args.json:
                out.write(json.dumps(sample) + "\n")
                out.flush()
            if table is not None:
                table.write(sample)
            if metrics:
                metrics.update(sample, firing)
                if args.textfile:
                    outputs.write(args.textfile, metrics.write_textfile, args.textfile)
            for status, alert in changes:
                if webhook:
                    webhook.send(alertmanager_payload(status, alert, monitor.alerts.instance,
                                                      time.time()))  # fmt: skip
            taken += 1
            if args.once or (args.count and taken >= args.count):
                return 0
            time.sleep(args.interval)
    finally:
        if webhook is not None:
            webhook.close()
        if lines is not None:
            lines.close()
        if server is not None:
            server.shutdown()
            server.server_close()
