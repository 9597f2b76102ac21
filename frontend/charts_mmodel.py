"""Server-side SVG of the model pages: a version's lineage graph, versions compared across
benchmarks (grouped bars), and a deployment's traffic by minute (lines). Same look as
`frontend.charts`: text in currentColor, the shared palette, every text escaped."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from frontend.charts import PALETTE, _number
from frontend.charts_training import WIDTH, _axis, _empty, _open, _y_grid

# Lineage ----------------------------------------------------------------------------------

KIND_LABELS = {
    "dataset_version": "dataset version",
    "pipeline_run": "pipeline run",
    "training_run": "training run",
    "model_version": "model version",
}
KIND_COLORS = {
    "dataset_version": PALETTE[2],
    "pipeline_run": PALETTE[1],
    "training_run": PALETTE[4],
    "model_version": PALETTE[0],
}
NODE_W, NODE_H, COLUMN_GAP, ROW_GAP, MARGIN = 170, 44, 56, 18, 12


def _columns(nodes: Sequence[Mapping], edges: Sequence[Sequence[str]]) -> dict[str, int]:
    """Each node's column: the longest path to it from a node nothing leads to, so every arrow
    points right (a dataset version, the pipeline run that made the next one, the training run
    on it, the model version it produced). A cycle, which lineage never has, stops at the
    number of nodes."""
    column = {node["id"]: 0 for node in nodes}
    for _ in range(len(nodes)):
        changed = False
        for source, target in edges:
            if source in column and target in column and column[target] < column[source] + 1:
                column[target] = column[source] + 1
                changed = True
        if not changed:
            break
    return column


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


def lineage_svg(*, graph: Mapping, urls: Mapping[str, str], current: str = "",
                title: str) -> SafeString:
    """Nodes as labelled boxes in columns (data on the left, the model on the right), arrows
    from what was made from what; a box links to its page where `urls` has one."""
    nodes = list(graph.get("nodes") or [])
    edges = [tuple(edge) for edge in graph.get("edges") or []]
    column = _columns(nodes, edges)
    by_column: dict[int, list[Mapping]] = {}
    for node in nodes:
        by_column.setdefault(column[node["id"]], []).append(node)
    rows = max((len(items) for items in by_column.values()), default=1)
    columns = max(by_column, default=0) + 1
    width = max(WIDTH, 2 * MARGIN + columns * NODE_W + (columns - 1) * COLUMN_GAP)
    height = 2 * MARGIN + rows * NODE_H + (rows - 1) * ROW_GAP
    place: dict[str, tuple[float, float]] = {}
    for index, items in by_column.items():
        # Each column centred vertically.
        top = MARGIN + (rows - len(items)) * (NODE_H + ROW_GAP) / 2
        for row, node in enumerate(items):
            place[node["id"]] = (MARGIN + index * (NODE_W + COLUMN_GAP),
                                 top + row * (NODE_H + ROW_GAP))
    parts = [
        f'<svg class="chart lineage" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" '
        f'font-family="inherit" font-size="11">',
        f"<title>{escape(title)}</title>",
        '<defs><marker id="lineage-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="currentColor" fill-opacity="0.6"/></marker>'
        "</defs>",
    ]
    for source, target in edges:
        if source not in place or target not in place:
            continue
        (x1, y1), (x2, y2) = place[source], place[target]
        start_x, start_y = x1 + NODE_W, y1 + NODE_H / 2
        end_x, end_y = x2, y2 + NODE_H / 2
        bend = (end_x - start_x) / 2
        parts.append(
            f'<path class="lineage-edge" data-from="{escape(source)}" data-to="{escape(target)}" '
            f'd="M {start_x:.1f} {start_y:.1f} C {start_x + bend:.1f} {start_y:.1f}, '
            f'{end_x - bend:.1f} {end_y:.1f}, {end_x:.1f} {end_y:.1f}" fill="none" '
            f'stroke="currentColor" stroke-opacity="0.55" stroke-width="1.5" '
            f'marker-end="url(#lineage-arrow)"/>')
    for node in nodes:
        x, y = place[node["id"]]
        kind = node.get("kind", "")
        color = KIND_COLORS.get(kind, PALETTE[8])
        mine = node["id"] == current
        box = (
            f'<g class="lineage-node" data-node="{escape(node["id"])}" data-kind="{escape(kind)}">'
            f"<title>{escape(KIND_LABELS.get(kind, kind))}: {escape(node.get('label', ''))}"
            f"</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="6" '
            f'fill="{color}" fill-opacity="{0.22 if mine else 0.1}" stroke="{color}" '
            f'stroke-width="{2.5 if mine else 1.2}"/>'
            f'<text x="{x + 8:.1f}" y="{y + 16:.1f}" fill="{color}" font-size="10" '
            f'font-weight="600">{escape(KIND_LABELS.get(kind, kind).upper())}</text>'
            f'<text x="{x + 8:.1f}" y="{y + 33:.1f}" fill="currentColor">'
            f"{escape(_clip(str(node.get('label', '')), 26))}</text></g>"
        )
        url = urls.get(node["id"])
        parts.append(f'<a href="{escape(url)}">{box}</a>' if url and not mine else box)
    if not nodes:
        _empty(parts, width / 2, height / 2, "No lineage recorded")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above


# Versions across benchmarks ----------------------------------------------------------------

@dataclass(frozen=True)
class BenchmarkAxis:
    name: str
    metric: str
    lower_is_better: bool


def grouped_bars_svg(*, benchmarks: Sequence[BenchmarkAxis],
                     series: Sequence[tuple[str, Mapping[str, float]]],
                     title: str) -> SafeString:
    """A group of bars per benchmark, one bar per version, each scaled so the best version of
    that benchmark reaches 1 (for lower-is-better metrics the best is the lowest: its bar is
    `best / value`). Metrics of different units thus share one axis; tooltips keep the raw
    values."""
    legend_rows = math.ceil(len(series) / 4) if series else 0
    plot_height = 180
    top_pad, bottom_pad = 24, 34
    height = top_pad + plot_height + bottom_pad + legend_rows * 18
    left, right = 48, 16
    plot_width = WIDTH - left - right
    parts = _open(height, title)
    parts.append(f'<text x="{left}" y="12" fill="currentColor" fill-opacity="0.7">'
                 "relative to the best version of each benchmark</text>")
    for step in range(5):
        tick = step / 4
        y = top_pad + plot_height - plot_height * tick
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="currentColor" stroke-opacity="0.15"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'fill="currentColor" fill-opacity="0.7">{tick:.2f}</text>')
    slot = plot_width / max(len(benchmarks), 1)
    bar = max(min(slot * 0.8 / max(len(series), 1), 48.0), 2.0)
    drawn = 0
    for index, axis in enumerate(benchmarks):
        values = {label: scores.get(axis.name) for label, scores in series}
        present = [value for value in values.values() if value is not None]
        group_left = left + slot * index + (slot - bar * len(series)) / 2
        arrow = "↓" if axis.lower_is_better else "↑"
        parts.append(f'<text x="{left + slot * index + slot / 2:.1f}" '
                     f'y="{top_pad + plot_height + 16}" text-anchor="middle" '
                     f'fill="currentColor">{escape(_clip(axis.name, 22))}</text>')
        parts.append(f'<text x="{left + slot * index + slot / 2:.1f}" '
                     f'y="{top_pad + plot_height + 29}" text-anchor="middle" '
                     f'fill="currentColor" fill-opacity="0.6">{escape(axis.metric)} {arrow}'
                     "</text>")
        if not present:
            continue
        best = min(present) if axis.lower_is_better else max(present)
        for number, (label, _) in enumerate(series):
            value = values[label]
            if value is None:
                continue
            if axis.lower_is_better:
                share = best / value if value > 0 else 1.0
            else:
                share = value / best if best > 0 else 0.0
            share = max(0.0, min(share, 1.0))
            size = plot_height * share
            x = group_left + bar * number
            parts.append(
                f'<rect class="bar" data-version="{escape(label)}" '
                f'data-benchmark="{escape(axis.name)}" x="{x:.1f}" '
                f'y="{top_pad + plot_height - size:.1f}" width="{bar - 1:.1f}" '
                f'height="{size:.1f}" fill="{PALETTE[number % len(PALETTE)]}">'
                f"<title>{escape(label)} · {escape(axis.name)}: {escape(axis.metric)} "
                f"{value:.4g}{' (best)' if value == best else ''}</title></rect>")
            drawn += 1
    if not drawn:
        _empty(parts, left + plot_width / 2, top_pad + plot_height / 2,
               "No scores to compare yet")
    for number, (label, _) in enumerate(series):
        x = left + (number % 4) * (plot_width / 4)
        y = top_pad + plot_height + bottom_pad + (number // 4) * 18
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="10" height="10" '
                     f'fill="{PALETTE[number % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="{y + 9:.1f}" fill="currentColor">'
                     f"{escape(_clip(label, 30))}</text>")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above


# Traffic by minute ---------------------------------------------------------------------------

def minutes_svg(*, minutes: Sequence[datetime], series: Sequence[tuple[str, Sequence]],
                unit: str, title: str, empty_text: str = "No requests in this period"
                ) -> SafeString:
    """Lines over time, one point a minute, x labelled HH:MM in the current time zone; a
    missing value (None) breaks its line."""
    height = 220
    left, right, top_pad, bottom_pad = 64, 16, 24, 34
    legend = len(series) > 1
    plot_width, plot_height = WIDTH - left - right, height - top_pad - bottom_pad
    total_height = height + (18 if legend else 0)
    parts = _open(total_height, title)
    parts.append(f'<text x="{left}" y="12" fill="currentColor" fill-opacity="0.7">'
                 f"{escape(unit)}</text>")
    values = [value for _, points in series for value in points if value is not None]
    if not minutes or not values:
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{top_pad + plot_height}" '
                     f'y2="{top_pad + plot_height}" stroke="currentColor" stroke-opacity="0.25"/>')
        _empty(parts, left + plot_width / 2, top_pad + plot_height / 2, empty_text)
        parts.append("</svg>")
        return mark_safe("".join(parts))  # noqa: S308 - escaped above
    y_low, y_high, y_step = _axis(0.0, max(values), zero_based=True)
    count = len(minutes)

    def px(index: int) -> float:
        return left + (plot_width * index / (count - 1) if count > 1 else plot_width / 2)

    def py(value: float) -> float:
        return top_pad + plot_height - plot_height * (value - y_low) / (y_high - y_low)

    _y_grid(parts, left=left, right=WIDTH - right, py=py, low=y_low, high=y_high, step=y_step)
    label_every = max(1, math.ceil(count / 8))
    for index, minute in enumerate(minutes):
        if index % label_every == 0:
            parts.append(f'<text x="{px(index):.1f}" y="{height - 16}" text-anchor="middle" '
                         f'fill="currentColor" fill-opacity="0.7">'
                         f"{timezone.localtime(minute):%H:%M}</text>")
    for number, (label, points) in enumerate(series):
        color = PALETTE[number % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for index, value in enumerate(points):
            if value is None:
                runs.append([])
                continue
            runs[-1].append(f"{px(index):.1f},{py(value):.1f}")
            parts.append(f'<circle cx="{px(index):.1f}" cy="{py(value):.1f}" r="2" '
                         f'fill="{color}"><title>{timezone.localtime(minutes[index]):%H:%M} · '
                         f"{escape(label)}: {_number(float(value))} {escape(unit)}</title>"
                         "</circle>")
        for run in runs:
            if len(run) > 1:
                parts.append(f'<polyline class="line" data-series="{escape(label)}" '
                             f'points="{" ".join(run)}" fill="none" stroke="{color}" '
                             'stroke-width="2" stroke-linejoin="round"/>')
        if legend:
            x = left + number * (plot_width / 4)
            parts.append(f'<rect x="{x:.1f}" y="{height + 2}" width="10" height="10" '
                         f'fill="{color}"/>')
            parts.append(f'<text x="{x + 14:.1f}" y="{height + 11}" fill="currentColor">'
                         f"{escape(label)}</text>")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above

