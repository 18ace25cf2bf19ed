"""``pyinit report``'s page: the accounted run (``pyinit.analysis.report``) as one
HTML file of inline SVG charts, readable with no server and no script."""

from __future__ import annotations

import html
import time
from typing import Any

import numpy as np

from pyinit.analysis import timeline
from pyinit.analysis.report import (
    CATEGORIES,
    COLOURS,
    LABELS,
    Report,
    checkpoint_line,
    clock_text,
    count_of,
    ended_line,
    money_text,
)

WIDTH = 900


def _coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time covered by sorted, disjoint intervals in each bin between edges."""
    if not len(starts):
        return np.zeros(len(edges) - 1)
    durations = ends - starts
    before = np.concatenate([[0.0], np.cumsum(durations)])

    def covered(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right")
        partial = np.where(
            k > 0,
            np.clip(t - starts[np.maximum(k - 1, 0)], 0, durations[np.maximum(k - 1, 0)]),
            0.0,
        )
        return before[np.maximum(k - 1, 0)] * (k > 0) + partial

    return np.diff(covered(edges))


def svg_timeline(report: Report) -> str:
    """One row per rank; each pixel column takes the colour of the category
    that filled most of its time."""
    left, row_h, columns = 90, 16, WIDTH - 110
    span = report.wall_s or 1.0
    edges = np.linspace(0, span, columns + 1)
    shown = report.ranks[:64]
    height = 30 + row_h * len(shown)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="phases per rank">'
    ]
    for row, rank in enumerate(shown):
        y = 10 + row * row_h
        parts.append(
            f'<text x="4" y="{y + 12}" class="label">node {rank.node} rank {rank.rank}</text>'
        )
        cover = np.stack([_coverage(*rank.intervals[key], edges) for key in COLOURS])
        winner = np.where(cover.max(axis=0) > 0, cover.argmax(axis=0), -1)
        keys = list(COLOURS)
        x = 0
        while x < columns:  # runs of one colour as one rectangle
            run_end = x
            while run_end < columns and winner[run_end] == winner[x]:
                run_end += 1
            if winner[x] >= 0:
                parts.append(
                    f'<rect x="{left + x}" y="{y}" width="{run_end - x}" '
                    f'height="{row_h - 3}" fill="{COLOURS[keys[winner[x]]]}"/>'
                )
            x = run_end
    parts.append(
        f'<text x="{left}" y="{height - 4}" class="label">0 s</text>'
        f'<text x="{WIDTH - 20}" y="{height - 4}" class="label" text-anchor="end">'
        f"{clock_text(span)}</text></svg>"
    )
    return "".join(parts)


def svg_breakdown(document: dict[str, Any]) -> str:
    """The shares as one stacked bar."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="40" role="img" '
        f'aria-label="breakdown">'
    ]
    x = 0.0
    for key in COLOURS:
        share = document["breakdown"][key]["share"]
        w = share * WIDTH
        if w > 0:
            parts.append(
                f'<rect x="{x:.1f}" y="4" width="{w:.1f}" height="32" '
                f'fill="{COLOURS[key]}"><title>{LABELS[key]}: {share:.1%}</title></rect>'
            )
        x += w
    parts.append("</svg>")
    return "".join(parts)


def _bins(t: np.ndarray, values: np.ndarray, edges: np.ndarray, how: Any) -> np.ndarray:
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
    out = np.full(len(edges) - 1, np.nan)
    if not len(t):
        return out
    order = np.argsort(index, kind="stable")
    index, values = index[order], values[order]
    cuts = np.flatnonzero(np.diff(index)) + 1
    for chunk_index, chunk in zip(np.split(index, cuts), np.split(values, cuts), strict=True):
        finite = chunk[np.isfinite(chunk)]
        if len(finite):
            out[chunk_index[0]] = how(finite)
    return out


def svg_series(
    title: str,
    span: float,
    lines: list[tuple[str, str, np.ndarray, np.ndarray]],
    unit: str,
    stacked: bool = False,
) -> str | None:
    """Lines (or stacked areas) over the run: (label, colour, t, values),
    averaged into at most 300 bins; bins without a value are left out, not
    drawn as zero. None when no line has a value."""
    height, left, plot_w, plot_h = 190, 60, WIDTH - 80, 140
    edges = np.linspace(0, span or 1.0, 301)
    centres = (edges[:-1] + edges[1:]) / 2
    binned = [(label, colour, _bins(t, v, edges, np.mean)) for label, colour, t, v in lines]
    if not any(np.isfinite(v).any() for _, _, v in binned):
        return None
    if stacked:  # each area on the ones before it, where the first has a value
        total = np.where(np.isfinite(binned[0][2]), 0.0, np.nan)
        stacked_rows = []
        for label, colour, values in binned:
            total = total + np.nan_to_num(values)
            stacked_rows.append((label, colour, total.copy()))
        binned = stacked_rows
    top = max(float(np.nanmax(v)) for _, _, v in binned if np.isfinite(v).any()) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="{html.escape(title)}">',
        f'<rect x="{left}" y="10" width="{plot_w}" height="{plot_h}" class="frame"/>',
        f'<text x="4" y="20" class="label">{_number(top)} {unit}</text>',
        f'<text x="4" y="{10 + plot_h}" class="label">0</text>',
    ]
    for label, colour, values in reversed(binned) if stacked else binned:
        points = [
            (left + c / (span or 1.0) * plot_w, 10 + plot_h - v / top * plot_h)
            for c, v in zip(centres, values, strict=True)
            if np.isfinite(v)
        ]
        if not points:
            continue
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        if stacked:
            base = f"{points[-1][0]:.1f},{10 + plot_h} {points[0][0]:.1f},{10 + plot_h}"
            parts.append(
                f'<polygon points="{path} {base}" fill="{colour}" fill-opacity="0.85">'
                f"<title>{html.escape(label)}</title></polygon>"
            )
        else:
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" '
                f'stroke-width="2"><title>{html.escape(label)}</title></polyline>'
            )
    legend_x = left
    for label, colour, _ in binned:
        parts.append(
            f'<rect x="{legend_x}" y="{height - 22}" width="12" height="12" '
            f'fill="{colour}"/><text x="{legend_x + 16}" y="{height - 12}" '
            f'class="label">{html.escape(label)}</text>'
        )
        legend_x += 24 + 7 * len(label)
    parts.append(
        f'<text x="{WIDTH - 20}" y="{height - 12}" class="label" text-anchor="end">'
        f"{clock_text(span)}</text></svg>"
    )
    return "".join(parts)


def _number(value: float) -> str:
    for unit, factor in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:.1f}{unit}"
    return f"{value:.3g}"


# The monitor's latency is /sys/block/*/stat's read time (whole milliseconds)
# over the reads of a sample: with few reads, coarse steps of 1 ms / reads.
RESOLUTION_NOTE = (
    "Each sample is the mean time of the reads it saw, from the kernel's counters of "
    "whole milliseconds: with few reads per sample, values fall on steps of 1 ms divided "
    "by the reads."
)


def svg_percentiles(latency: dict[str, float] | None) -> str:
    if not latency:
        return "<p>No disk reads were sampled.</p>"
    keys = ["p50", "p90", "p99", "max"]
    if len({latency[k] for k in keys}) == 1:
        return f"<p>Every sample: {latency['p50']:,.0f} µs. {RESOLUTION_NOTE}</p>"
    top = max(latency[k] for k in keys) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="120" role="img" '
        f'aria-label="disk read latency">'
    ]
    for i, key in enumerate(keys):
        w = latency[key] / top * (WIDTH - 200)
        parts.append(
            f'<text x="4" y="{24 + i * 24}" class="label">{key}</text>'
            f'<rect x="50" y="{10 + i * 24}" width="{max(w, 1):.1f}" height="18" '
            f'fill="#e0902f"/><text x="{56 + w:.1f}" y="{24 + i * 24}" class="label">'
            f"{latency[key]:,.0f} µs</text>"
        )
    parts.append(f'</svg><p class="label">{RESOLUTION_NOTE}</p>')
    return "".join(parts)


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 960px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 2px 12px 2px 0; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.big { font-size: 28px; font-weight: 600; }
.label { font-size: 11px; fill: #444; } .frame { fill: #fafafa; stroke: #ccc; }
.missing, .failed { color: #8b1e1e; }
"""


def _or_note(chart: str | None, note: str) -> str:
    return chart if chart is not None else f"<p>{html.escape(note)}</p>"


def _breakdown_rows(document: dict[str, Any]) -> str:
    cost = document.get("cost")
    rows = []
    for key, label, colour in CATEGORIES:
        share = document["breakdown"][key]
        spent = money_text(cost["by_loss"].get(key, 0)) if cost and key != "productive" else ""
        rows.append(f'<tr><td><span class="swatch" style="background:{colour}"></span>{label}'
                    f"</td><td>{share['seconds']:,.1f}</td><td>{share['share']:.1%}</td>"
                    f"<td>{spent}</td></tr>")  # fmt: skip
    return "".join(rows)


def _cost_line(document: dict[str, Any]) -> str:
    cost = document.get("cost")
    if not cost:
        return "<p>Cost: give --price-per-gpu-hour.</p>"
    return (f"<p>Cost: <b>{money_text(cost['total'])}</b> at {cost['price_per_hour']:g} per "
            f"{document['unit']}-hour, of which <b>{money_text(cost['not_productive'])}</b> "
            "bought no training step.</p>")  # fmt: skip


def _step_chart(report: Report) -> str:
    """Node 0's ranks' step times, split into waiting for data and the rest."""
    steps = [(r.step_ends, r.step_lengths, r.step_data) for r in report.ranks if r.node == 0]
    t, lengths, data = (np.concatenate([s[i] for s in steps]) if steps else np.zeros(0)
                        for i in range(3))  # fmt: skip
    series = [("waiting for data", COLOURS["data"], t, data),
              ("the rest of the step", COLOURS["productive"], t, lengths - data)]  # fmt: skip
    chart = svg_series("step time", report.wall_s, series, "s per step", stacked=True)
    return _or_note(chart, "No step after the first was recorded.")


def _monitor_charts(report: Report) -> tuple[str, str]:
    """GPU utilization and interconnect traffic from node 0's monitor."""
    m = report.nodes[0].monitor
    if not m:
        return "<p>No monitor samples.</p>", "<p>No monitor samples.</p>"
    no_gpu = "The monitor saw no GPU" + (f" ({m.unavailable})." if m.unavailable else ".")
    t = m.boottime - report.nodes[0].start
    util = svg_series("GPU utilization", report.wall_s,
                      [("GPU utilization, mean", "#2e9d5b", t, m.gpu_util)], "%")  # fmt: skip
    links = svg_series("interconnect", report.wall_s,
                       [("PCIe TX+RX", "#5b8fc7", t, m.pcie),
                        ("NVLink TX+RX", "#7a5cc4", t, m.nvlink)], "B/s")  # fmt: skip
    return _or_note(util, no_gpu), _or_note(links, no_gpu)


def render_html(report: Report, document: dict[str, Any]) -> str:
    unit, cost = document["unit"], document.get("cost")
    util_chart, link_chart = _monitor_charts(report)
    latency = (document.get("monitor") or {}).get("disk_read_latency_us")
    findings_html = "".join(f"<li>{html.escape(note)}</li>" for note in document["findings"])
    missing_html = "".join(
        f'<li class="missing">{html.escape(m)}</li>' for m in document["missing"]
    )
    resumes_html = "".join(
        f"<li>node {r['node']} {html.escape(timeline.resume_line(r))}</li>"
        for r in document.get("resumes", [])
    )
    checkpoints_html = "".join(
        f"<li>{html.escape(checkpoint_line(kind, row))}</li>"
        for kind, row in document.get("checkpoints", {}).items()
    )
    folders = html.escape(", ".join(document["run_dirs"]))
    wall = clock_text(document["wall_s"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pyinit report: {folders}</title>
<style>{STYLE}</style></head><body>
<h1>Where the {unit}-hours went</h1>
<p>{folders}: {count_of(document["ranks"], unit)} on
{count_of(document["nodes"], "node")}, wall {wall} from {document["origin"]},
{document[f"{unit.lower()}_hours"]:.4f} {unit}-hours, {document["steps_per_rank"]:,} steps per rank{
        "" if document["ended"] else " <b>(no end: a partial run)</b>"
    }.</p>
<p class="{"ok" if document["outcome"]["healthy"] else "failed"}">Ended: <b>{
        html.escape(ended_line(document))
    }</b></p>
<p>Effective training time <span class="big">{document["effective_training_time"]:.1%}</span>
(productive step time over wall time, summed over {unit}s)</p>
{svg_breakdown(document)}
<table><tr><th></th><th>{unit}-seconds</th><th>share</th><th>{"cost" if cost else ""}</th></tr>
{_breakdown_rows(document)}</table>
{_cost_line(document)}
<h2>Findings, largest loss first</h2><ol>{findings_html}</ol>
{"<h2>Restarts, step by step</h2><ul>" + resumes_html + "</ul>" if resumes_html else ""}
{"<h2>Checkpoints</h2><ul>" + checkpoints_html + "</ul>" if checkpoints_html else ""}
<h2>Phases per rank</h2>{svg_timeline(report)}
<h2>Step time over the run (node 0's ranks)</h2>{_step_chart(report)}
<h2>GPU utilization</h2>{util_chart}
<h2>Interconnect traffic</h2>{link_chart}
<h2>Disk read latency (monitor)</h2>{svg_percentiles(latency)}
{"<h2>Missing</h2><ul>" + missing_html + "</ul>" if missing_html else ""}
<p class="label">pyinit report, {time.strftime("%Y-%m-%d %H:%M")}</p>
</body></html>
"""
