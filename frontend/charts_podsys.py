"""Server-side SVG of the node page: a metric over time, one line per GPU. Same look as
`frontend.charts`: text in currentColor, the shared palette, every text escaped."""

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from frontend.charts import PALETTE
from frontend.charts_training import WIDTH, _axis, _empty, _open, _y_grid, thin, y_label

# A line breaks where two readings are further apart than this many typical intervals: the
# exporter did not answer then, and a straight line would draw readings nobody took.
GAP_FACTOR = 3.0
# The most points a line keeps (the chart is ~700 px wide).
MAX_POINTS = 300


def _clock(moment: float, style: str) -> str:
    return timezone.localtime(datetime.fromtimestamp(moment, tz=UTC)).strftime(style)


def _breaks(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The points cut into runs where a reading is missing."""
    if len(points) < 3:
        return [list(points)]
    steps = sorted(b[0] - a[0] for a, b in pairwise(points))
    typical = steps[len(steps) // 2] or 1.0
    runs: list[list[tuple[float, float]]] = [[points[0]]]
    for before, point in pairwise(points):
        if point[0] - before[0] > typical * GAP_FACTOR:
            runs.append([])
        runs[-1].append(point)
    return runs


def time_lines_svg(*, series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
                   start: datetime, end: datetime, unit: str, title: str,
                   empty_text: str = "No readings in this period") -> SafeString:
    """Lines over wall-clock time from `start` to `end` (points are (unix time, value)), the x
    axis labelled HH:MM in the current time zone, a legend when there are several lines."""
    height = 220
    left, right, top_pad, bottom_pad = 64, 16, 24, 34
    drawn = [(label, thin(sorted(points), MAX_POINTS)) for label, points in series if points]
    legend_rows = math.ceil(len(drawn) / 6) if len(drawn) > 1 else 0
    plot_width, plot_height = WIDTH - left - right, height - top_pad - bottom_pad
    parts = _open(height + legend_rows * 18, title)
    parts.append(f'<text x="{left}" y="12" fill="currentColor" fill-opacity="0.7">'
                 f"{escape(unit)}</text>")
    values = [value for _, points in drawn for _, value in points]
    if not values:
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{top_pad + plot_height}" '
                     f'y2="{top_pad + plot_height}" stroke="currentColor" stroke-opacity="0.25"/>')
        _empty(parts, left + plot_width / 2, top_pad + plot_height / 2, empty_text)
        parts.append("</svg>")
        return mark_safe("".join(parts))  # noqa: S308 - escaped above
    x_low, x_high = start.timestamp(), end.timestamp()
    if x_high <= x_low:
        x_high = x_low + 1
    y_low, y_high, y_step = _axis(min(min(values), 0.0), max(values), zero_based=True)

    def px(x: float) -> float:
        return left + plot_width * (min(max(x, x_low), x_high) - x_low) / (x_high - x_low)

    def py(y: float) -> float:
        return top_pad + plot_height - plot_height * (y - y_low) / (y_high - y_low)

    _y_grid(parts, left=left, right=WIDTH - right, py=py, low=y_low, high=y_high, step=y_step)
    for index in range(7):
        moment = x_low + (x_high - x_low) * index / 6
        parts.append(f'<text x="{px(moment):.1f}" y="{height - 16}" text-anchor="middle" '
                     f'fill="currentColor" fill-opacity="0.7">{_clock(moment, "%H:%M")}</text>')
    for number, (label, points) in enumerate(drawn):
        color = PALETTE[number % len(PALETTE)]
        for run in _breaks(points):
            if len(run) == 1:
                x, y = run[0]
                parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" fill="{color}"/>')
                continue
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
            parts.append(f'<polyline class="line" data-series="{escape(label)}" '
                         f'points="{path}" fill="none" stroke="{color}" stroke-width="1.6" '
                         'stroke-linejoin="round"/>')
        last_x, last_y = points[-1]
        parts.append(f'<circle cx="{px(last_x):.1f}" cy="{py(last_y):.1f}" r="2.5" '
                     f'fill="{color}"><title>{escape(label)} at '
                     f"{_clock(last_x, '%H:%M:%S')}"
                     f": {y_label(last_y)} {escape(unit)}</title></circle>")
        if legend_rows:
            x = left + (number % 6) * (plot_width / 6)
            y = height + (number // 6) * 18
            parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="10" height="10" '
                         f'fill="{color}"/>')
            parts.append(f'<text x="{x + 14:.1f}" y="{y + 11}" fill="currentColor">'
                         f"{escape(label)} · {y_label(last_y)}</text>")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above
