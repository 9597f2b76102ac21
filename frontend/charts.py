"""Charts drawn on the server as inline SVG: no JavaScript library, readable without scripts,
and each bar names its value in a tooltip (<title>)."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Distinct on light and dark backgrounds; cycled when there are more series.
PALETTE = ("#4f7cff", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899",
           "#84cc16", "#64748b", "#f97316")
WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 24, 28
LEGEND_ROW = 18


@dataclass(frozen=True)
class ChartSeries:
    label: str
    values: Mapping[date, Decimal]


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above `value`: the axis' top."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5):
        if power * step >= value:
            return power * step
    return power * 10


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def stacked_bars_svg(*, days: Sequence[date], series: Sequence[ChartSeries], unit: str,
                     title: str) -> SafeString:
    """One bar a day, stacked by series, with a y axis in `unit` and a legend below."""
    legend_rows = (len(series) + 3) // 4 if series else 0
    height = HEIGHT + legend_rows * LEGEND_ROW
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum((float(s.values.get(day, 0)) for s in series), 0.0) for day in days]
    top = _nice_ceiling(max(totals, default=0.0))
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" '
        f'font-family="inherit" font-size="11">',
        f"<title>{escape(title)}</title>",
    ]
    for step in range(5):
        tick = top * step / 4
        y = TOP + plot_height - plot_height * step / 4
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="currentColor" stroke-opacity="0.15"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'fill="currentColor" fill-opacity="0.7">{_number(tick)}</text>')
    parts.append(f'<text x="{LEFT}" y="12" fill="currentColor" fill-opacity="0.7">'
                 f"{escape(unit)}</text>")
    slot = plot_width / max(len(days), 1)
    bar = max(slot * 0.7, 1.0)
    label_every = max(1, round(len(days) / 16))
    for index, day in enumerate(days):
        x = LEFT + slot * index + (slot - bar) / 2
        base = float(TOP + plot_height)
        for number, item in enumerate(series):
            value = item.values.get(day)
            if not value:
                continue
            size = plot_height * float(value) / top
            base -= size
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{base:.1f}" width="{bar:.1f}" '
                f'height="{size:.1f}" fill="{PALETTE[number % len(PALETTE)]}">'
                f"<title>{day:%Y-%m-%d} · {escape(item.label)}: {value} {escape(unit)}</title>"
                f"</rect>"
            )
        if index % label_every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
                         f'fill="currentColor" fill-opacity="0.7">{day.day}</text>')
    if not any(totals):
        parts.append(f'<text x="{LEFT + plot_width / 2:.1f}" y="{TOP + plot_height / 2:.1f}" '
                     f'text-anchor="middle" fill="currentColor" fill-opacity="0.6">'
                     f"No use in this period</text>")
    for number, item in enumerate(series):
        x = LEFT + (number % 4) * (plot_width / 4)
        y = HEIGHT + (number // 4) * LEGEND_ROW
        label = item.label if len(item.label) <= 28 else item.label[:27] + "…"
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="10" height="10" '
                     f'fill="{PALETTE[number % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="{y + 9:.1f}" fill="currentColor">'
                     f"{escape(label)}</text>")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above
