"""A benchmark's targets: each a ratio against its anchor, met or missed,
said the same way by every benchmark and kept in its JSON."""

from __future__ import annotations

from typing import Any


def ratio_target(name: str, ours: float, anchor: float, need: float,
                 at_least: bool = True) -> dict[str, Any]:  # fmt: skip
    """Our figure over the anchor's, against `need` (a floor, or a ceiling
    where `at_least` is False)."""
    ratio = ours / anchor
    met = ratio >= need if at_least else ratio <= need
    return {"target": name, "ratio": round(ratio, 3), "need": need, "at_least": at_least,
            "met": met}  # fmt: skip


def print_targets(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        verdict = "met" if row["met"] else "MISSED"
        sense = ">=" if row["at_least"] else "<="
        print(f"target {row['target']}: {row['ratio']:.2f}x ({sense} {row['need']}) {verdict}")
