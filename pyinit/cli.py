"""The ``pyinit`` command: parses arguments and dispatches; the work lives in
the subpackages."""

from __future__ import annotations

import argparse
import os
import sys

EXIT_FINDINGS = 1


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _cmd_topo(args: argparse.Namespace) -> int:
    from pyinit.topology import scan

    topo = scan(args.sysfs_root, expect_gpus=args.expect_gpus, probe_bar0=not args.no_bar0)
    sys.stdout.write(topo.to_json() if args.json else topo.to_text())
    return EXIT_FINDINGS if topo.has_errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyinit", description="pod-init supervisor")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topo = sub.add_parser("topo", help="PCIe topology: matrix, links, BARs, findings")
    topo.add_argument("--sysfs-root", default="/sys", metavar="DIR")
    topo.add_argument("--json", action="store_true", help="print one JSON object")
    topo.add_argument("--expect-gpus", type=_non_negative, metavar="N")
    topo.add_argument("--no-bar0", action="store_true", help="do not map GPU BAR0")
    topo.set_defaults(handler=_cmd_topo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.handler(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader left (`pyinit topo | head`); silence the flush at exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FINDINGS
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"pyinit: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_FINDINGS


if __name__ == "__main__":
    sys.exit(main())
