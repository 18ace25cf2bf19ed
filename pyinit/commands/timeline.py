"""``pyinit timeline``: where the seconds went before the first step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a pyinit run folder (--run-dir), its events.jsonl, or "
                        "pyinit-run of a one-node run")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--png", metavar="FILE", help="draw the chart (needs pod-init[plots])")


def main(args: argparse.Namespace) -> int:
    from pyinit.analysis.timeline import build, plot, read_events, run_folders, table
    from pyinit.errors import InputError
    from pyinit.jsonfile import write_json

    folders = run_folders(Path(args.run_dir))
    if len(folders) > 1:
        names = ", ".join(folder.name for folder in folders[:3])
        more = ", ..." if len(folders) > 3 else ""
        raise InputError(f"holds {len(folders)} nodes' run folders ({names}{more}): give one",
                         file=args.run_dir)  # fmt: skip

    events = read_events(folders[0])  # a folder that is not a run's is named first
    if args.png:
        from pyinit.extras import require

        require("matplotlib", "pyinit timeline --png")
    timeline = build(events)
    sys.stdout.write(table(timeline))
    if args.json:
        write_json(args.json, timeline.to_dict())
    if args.png:
        plot(timeline, Path(args.png))
    return 0
