"""``pyinit report``: where every GPU-hour of a run went, as HTML, cost and findings."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyinit import argtypes
from pyinit.errors import InputError, as_utf8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a pyinit run folder (--run-dir; one per node), or a folder "
                        "of nodes' folders (pyinit-run)")  # fmt: skip
    parser.add_argument("--out", metavar="FILE.html",
                        help="where the HTML goes (default: RUN_DIR/report.html)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--price-per-gpu-hour", type=argtypes.number(0.0, 1e6), metavar="P",
                        help="what one GPU-hour costs, for the cost lines")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from pyinit.analysis.report import build, text
    from pyinit.analysis.report_html import render_html
    from pyinit.analysis.timeline import run_folders
    from pyinit.jsonfile import write_text

    given = [Path(f) for f in args.run_dirs]
    for folder in given:
        if not folder.is_dir():
            raise InputError("not a folder (give the run's --run-dir)", file=str(folder))
    report = build([node for folder in given for node in run_folders(folder)],
                   args.price_per_gpu_hour)  # fmt: skip
    document = report.summary()
    out = Path(args.out) if args.out else given[0] / "report.html"
    # A folder's name need not be UTF-8; the page and the lines show such bytes as \xNN.
    write_text(out, as_utf8(render_html(report, document)))
    document["html"] = str(out)
    if args.json:
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        sys.stdout.write(as_utf8(text(document) + f"wrote {out}\n"))
    return 0
