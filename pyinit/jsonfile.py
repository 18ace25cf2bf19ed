"""JSON files that are whole or absent: written under a temporary name beside
the target (its folder made as needed), then renamed over it, so a reader or
a crash never meets half a document."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike[str], document: Any, indent: int | None = 1) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    temp.write_text(json.dumps(document, indent=indent) + "\n")
    os.replace(temp, target)
    return target
