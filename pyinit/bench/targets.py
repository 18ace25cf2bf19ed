"""A benchmark's targets: each a ratio against its anchor, met or missed,
said the same way by every benchmark and kept in its JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ratio_target(name: str, ours: float, anchor: float, need: float, at_least: bool = True,
                 device_best: float | None = None,
                 rounds: Sequence[float] = ()) -> dict[str, Any]:  # fmt: skip
    """Our figure over the anchor's, against `need` (a floor, or a ceiling
    where `at_least` is False). `device_best` is the most the device gave
    the same work in this run (fio's best read): a floor above it over the
    anchor cannot be met by any reader, and the row says so. `rounds`: the
    same ratio in each round, ours beside the anchor's run of that round;
    with two or more, the row keeps their range, so a verdict within a
    shared device's round-to-round spread shows as one."""
    ratio = ours / anchor
    met = ratio >= need if at_least else ratio <= need
    row = {"target": name, "ratio": round(ratio, 3), "need": need, "at_least": at_least,
           "met": met}  # fmt: skip
    if at_least and device_best is not None and device_best / anchor < need:
        row["device_allows"] = round(device_best / anchor, 3)
    if len(rounds) > 1:
        row["rounds"] = [round(min(rounds), 3), round(max(rounds), 3)]
    return row


def print_targets(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        verdict = "met" if row["met"] else "MISSED"
        sense = ">=" if row["at_least"] else "<="
        allows = row.get("device_allows")
        why = f" (above the device: its best read is {allows:.2f}x)" if allows else ""
        if "rounds" in row:
            low, high = row["rounds"]
            why += f" (rounds {low:.2f}-{high:.2f}x)"
        print(f"target {row['target']}: {row['ratio']:.2f}x ({sense} {row['need']}) {verdict}{why}")
