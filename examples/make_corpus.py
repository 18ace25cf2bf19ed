"""A small corpus for the examples, made from this project's own text (which
the project may redistribute): every paragraph of its Markdown and Python
files, one JSON line each, repeated until the corpus has --megabytes.

    python examples/make_corpus.py --out build/corpus.jsonl --megabytes 4
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def paragraphs() -> list[str]:
    found = []
    for path in sorted(
        [*ROOT.glob("*.md"), *ROOT.glob("pyinit/**/*.py"), *ROOT.glob("bench/*.md")]
    ):
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            if len(block.strip()) > 40:
                found.append(block.strip())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--megabytes", type=float, default=4.0)
    args = parser.parse_args()
    blocks = paragraphs()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.tmp")
    written, copy = 0, 0
    with open(temp, "w", encoding="utf-8") as f:
        while written < args.megabytes * 1e6:
            for block in blocks:
                # A copy number keeps repeated paragraphs distinct records.
                line = json.dumps({"text": block, "copy": copy}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode())
                if written >= args.megabytes * 1e6:  # the size asked for, within a record
                    break
            copy += 1
    os.replace(temp, out)
    print(f"{out}: {written / 1e6:.2f} MB, {len(blocks)} paragraphs, {copy} copies")


if __name__ == "__main__":
    main()
