"""``pyinit topo``: the PCIe scan, as text or one JSON object."""

from __future__ import annotations

import argparse
import json
import sys

from pyinit import _native, argtypes
from pyinit.errors import EXIT_FAILURE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.add_machine_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--expect-gpus", type=argtypes.whole(0, _native.MAX_EXPECTED_GPUS),
                        metavar="N", help="an error finding when fewer GPUs are found")  # fmt: skip
    parser.add_argument("--no-bar0", action="store_true", help="do not map GPU BAR0")


def main(args: argparse.Namespace) -> int:
    from pyinit.nvml import optional_view
    from pyinit.topology import scan

    nvml = optional_view(args)
    topo = scan(args.sysfs_root, args.expect_gpus, not args.no_bar0, nvml=nvml)
    if args.json:
        document = json.loads(topo.to_json())
        document["nvml"] = nvml.to_dict() if nvml else None
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(topo.to_text() + ("\n" + nvml.to_text() if nvml else ""))
    return EXIT_FAILURE if topo.has_errors else 0
