"""``pyinit nvml``: NVML's view of the GPUs, or every answer recorded for a replay."""

from __future__ import annotations

import argparse
import json
import sys

from pyinit import argtypes
from pyinit.errors import EXIT_FAILURE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nvml-replay", metavar="FILE", help=argtypes.REPLAY_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--record", action="store_true",
                        help="print every NVML answer, replayable by FakeNvml")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from pyinit.nvml import DriverNvml, FakeNvml, NvmlUnavailable, backend_for, read_nvml

    backend = backend_for(args) or DriverNvml()
    try:
        if args.record:
            sys.stdout.write(json.dumps(FakeNvml.record(backend), indent=1) + "\n")
            return 0
        view = read_nvml(backend)
    except NvmlUnavailable as e:
        print(f"pyinit: NVML unavailable: {e}", file=sys.stderr)
        return EXIT_FAILURE
    sys.stdout.write(json.dumps(view.to_dict(), indent=2) + "\n" if args.json else view.to_text())
    return 0
