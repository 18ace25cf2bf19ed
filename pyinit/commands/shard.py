"""``pyinit shard``: JSON Lines or text into token shards for ``pyinit.data``."""

from __future__ import annotations

import argparse
import sys

from pyinit import argtypes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help=".jsonl or text, may be .gz")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the shards go")
    parser.add_argument("--shards", required=True, type=argtypes.whole(1, 65536), metavar="N",
                        help="how many shard files")  # fmt: skip
    parser.add_argument("--field", default="text", help="the JSON field holding the text")
    parser.add_argument("--tokenizer", default="byte", metavar="byte|PATH",
                        help="byte (built in) or a tokenizer.json")  # fmt: skip
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "text"), help="input lines")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="count and skip bad lines instead of stopping")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace shards already in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def main(args: argparse.Namespace) -> int:
    from pyinit.data.sharder import shard

    summary = shard(args.inputs, args.out, args.shards, text_field=args.field,
                    tokenizer=args.tokenizer, fmt=args.format, skip_invalid=args.skip_invalid,
                    force=args.force, progress=None if args.quiet else sys.stderr)  # fmt: skip
    sys.stdout.write(summary.to_text())
    return 0
