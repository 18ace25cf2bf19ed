"""``pyinit timeline``: where the seconds went before the first step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a pyinit run folder (--run-dir), or its events.jsonl")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--png", metavar="FILE", help="draw the chart (needs pod-init[plots])")


def main(args: argparse.Namespace) -> int:
    from pyinit.analysis.timeline import build, plot, read_events, table
    from pyinit.jsonfile import write_json

    if args.png:
        from pyinit.extras import require

        require("matplotlib", "pyinit timeline --png")
    timeline = build(read_events(Path(args.run_dir)))
    sys.stdout.write(table(timeline))
    if args.json:
        write_json(args.json, timeline.to_dict())
    if args.png:
        plot(timeline, Path(args.png))
    return 0
