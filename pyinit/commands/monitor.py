"""``pyinit monitor``: GPU utilization, PCIe bandwidth and NVMe latency, with alerts."""

from __future__ import annotations

import argparse

from pyinit import argtypes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--interval", type=argtypes.seconds(0.1, 3600), default=5.0, metavar="S",
        help="seconds between samples")  # fmt: skip
    add("--once", action="store_true", help="one sample (a table, or JSON with --json), then exit")
    add("--json", action="store_true", help="JSON Lines on stdout instead of the live table")
    add("--out", metavar="FILE", help="append JSON Lines to FILE")
    add("--prometheus", metavar="HOST:PORT", help="serve /metrics (e.g. 127.0.0.1:9400)")
    add("--textfile", metavar="PATH", help="node_exporter textfile, replaced atomically")
    add("--webhook", metavar="URL", help="Alertmanager-style alerts, firing and resolved")
    add("--webhook-header", action="append", metavar="'NAME: VALUE'",
        help="an HTTP header for the webhook (repeatable; never logged)")  # fmt: skip
    add("--thresholds", metavar="FILE", help="JSON: gpu_util_low, nvme_read_latency_us...")
    add("--count", type=argtypes.whole(0, 1 << 30), default=0, help=argparse.SUPPRESS)
    add("--sys-block", default="/sys/block", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    from pyinit.monitor import watch

    return watch(args, args.nvml_backend)
