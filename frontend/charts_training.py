"""Server-side SVG charts of the toolchain pages: bars (a dataset's length histogram), a funnel
(documents through a pipeline's steps) and lines over steps (loss, throughput, learning rate).
Same look as `frontend.charts`: text in currentColor, the shared palette, every text escaped."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from frontend.charts import PALETTE, _number

WIDTH = 760
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 34
# The most points a line keeps: a run may log thousands of steps; a chart this wide shows ~600.
MAX_POINTS = 600


def _open(height: int, title: str) -> list[str]:
    return [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" '
        f'font-family="inherit" font-size="11">',
        f"<title>{escape(title)}</title>",
    ]


def _empty(parts: list[str], x: float, y: float, text: str) -> None:
    parts.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle" fill="currentColor" '
                 f'fill-opacity="0.6">{escape(text)}</text>')


def short_number(value: float) -> str:
    """1234 → "1.2k", 3_400_000 → "3.4M": axis labels and bar labels that must stay short."""
    value = float(value)
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.1f}".removesuffix(".0") + suffix
    return _number(value) if value >= 0 else f"-{_number(-value)}"


def bars_svg(*, labels: Sequence[str], values: Sequence[float], unit: str, title: str,
             x_title: str = "", empty_text: str = "Nothing to show") -> SafeString:
    """One vertical bar per label, a y axis in `unit`."""
    height = 240
    plot_width, plot_height = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM
    _, top, tick_step = _axis(0.0, max(values, default=0.0), zero_based=True)
    if all(float(value).is_integer() for value in values) and tick_step < 1:
        top, tick_step = max(math.ceil(top), 1), 1.0  # counts: whole-number ticks
    parts = _open(height, title)
    tick = 0.0
    while tick <= top + tick_step / 2:
        y = TOP + plot_height - plot_height * tick / top
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="currentColor" stroke-opacity="0.15"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'fill="currentColor" fill-opacity="0.7">{_tick_text(tick, tick_step)}'
                     "</text>")
        tick += tick_step
    parts.append(f'<text x="{LEFT}" y="12" fill="currentColor" fill-opacity="0.7">'
                 f"{escape(unit)}</text>")
    if x_title:
        parts.append(f'<text x="{WIDTH - RIGHT}" y="{height - 2}" text-anchor="end" '
                     f'fill="currentColor" fill-opacity="0.7">{escape(x_title)}</text>')
    slot = plot_width / max(len(values), 1)
    bar = max(slot * 0.75, 1.0)
    label_every = max(1, math.ceil(len(values) / 14))
    for index, (label, value) in enumerate(zip(labels, values, strict=True)):
        x = LEFT + slot * index + (slot - bar) / 2
        size = plot_height * float(value) / top
        if size > 0:
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_height - size:.1f}" '
                f'width="{bar:.1f}" height="{size:.1f}" fill="{PALETTE[0]}">'
                f"<title>{escape(label)}: {_number(float(value))} {escape(unit)}</title></rect>")
        if index % label_every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 18}" text-anchor="middle" '
                         f'fill="currentColor" fill-opacity="0.7">{escape(label)}</text>')
    if not any(values):
        _empty(parts, LEFT + plot_width / 2, TOP + plot_height / 2, empty_text)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above


@dataclass(frozen=True)
class FunnelStep:
    label: str
    documents_in: int
    documents_out: int


def funnel_svg(*, steps: Sequence[FunnelStep], title: str,
               empty_text: str = "No step has reported yet") -> SafeString:
    """A row per step: a pale bar for the documents that came in, a solid one for those that
    went on, on one scale, so the pipeline narrows like a funnel."""
    row, gap, label_width = 26, 6, 190
    height = TOP + max(len(steps), 1) * (row + gap) + 8
    left = label_width
    plot_width = WIDTH - left - RIGHT - 120
    top = max((max(step.documents_in, step.documents_out) for step in steps), default=0) or 1
    parts = _open(height, title)
    parts.append(f'<text x="{left}" y="14" fill="currentColor" fill-opacity="0.7">documents: '
                 f'<tspan fill="{PALETTE[0]}">■</tspan> kept, '
                 f'<tspan fill="{PALETTE[3]}" fill-opacity="0.35">■</tspan> dropped</text>')
    for index, step in enumerate(steps):
        y = TOP + index * (row + gap)
        width_in = plot_width * step.documents_in / top
        width_out = plot_width * min(step.documents_out, step.documents_in or step.documents_out) \
            / top
        dropped = max(step.documents_in - step.documents_out, 0)
        label = step.label if len(step.label) <= 30 else step.label[:29] + "…"
        parts.append(f'<g class="funnel-step" data-step="{index}">')
        parts.append(f'<text x="{left - 8}" y="{y + row / 2 + 4:.1f}" text-anchor="end" '
                     f'fill="currentColor">{escape(label)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{width_in:.1f}" height="{row}" '
                     f'fill="{PALETTE[3]}" fill-opacity="0.35"><title>{escape(step.label)}: '
                     f"{step.documents_in} in</title></rect>")
        parts.append(f'<rect class="bar" x="{left}" y="{y}" width="{width_out:.1f}" '
                     f'height="{row}" fill="{PALETTE[0]}"><title>{escape(step.label)}: '
                     f"{step.documents_out} out</title></rect>")
        note = f"{step.documents_in:,} → {step.documents_out:,}"
        if dropped:
            note += f" ({dropped:,} dropped)"
        parts.append(f'<text x="{left + max(width_in, width_out) + 6:.1f}" '
                     f'y="{y + row / 2 + 4:.1f}" fill="currentColor" fill-opacity="0.8">'
                     f"{escape(note)}</text>")
        parts.append("</g>")
    if not steps:
        _empty(parts, WIDTH / 2, TOP + row / 2 + 4, empty_text)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above


def _nice_step(span: float, ticks: int = 4) -> float:
    """A 1, 2, 2.5 or 5 times a power of ten near span / ticks."""
    raw = span / ticks if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if power * factor >= raw:
            return power * factor
    return power * 10


def _axis(low: float, high: float, *, zero_based: bool) -> tuple[float, float, float]:
    """The bottom, top and tick spacing of an axis that holds low..high."""
    if zero_based:
        low = min(low, 0.0)
    if high <= low:
        high = low + (abs(low) or 1.0)
    step = _nice_step(high - low)
    return math.floor(low / step) * step, math.ceil(high / step) * step, step


def _tick_text(value: float, step: float) -> str:
    if step >= 1 or value == 0:
        return short_number(value)
    if abs(value) < 1e-3:
        return f"{value:.0e}"
    decimals = -math.floor(math.log10(step))
    if not math.isclose(step * 10**decimals, round(step * 10**decimals)):
        decimals += 1  # 0.25: two places, not one
    return f"{value:.{min(decimals, 6)}f}"


def _y_grid(parts: list[str], *, left: float, right: float, py, low: float, high: float,
            step: float) -> None:
    """Horizontal grid lines from `low` to `high` every `step`, labelled on the left."""
    tick = low
    while tick <= high + step / 2:
        y = py(tick)
        parts.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="currentColor" stroke-opacity="0.15"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'fill="currentColor" fill-opacity="0.7">{_tick_text(tick, step)}</text>')
        tick += step


def thin(points: Sequence[tuple[float, float]], most: int = MAX_POINTS):
    """At most `most` points, evenly taken, the first and last kept."""
    if len(points) <= most:
        return list(points)
    stride = (len(points) - 1) / (most - 1)
    return [points[round(index * stride)] for index in range(most)]


def line_svg(*, points: Sequence[tuple[float, float]], title: str, unit: str,
             x_title: str = "step", zero_based: bool = False, color: str = PALETTE[0],
             empty_text: str = "No points yet") -> SafeString:
    """One line over x (steps), with dots where there are few points."""
    height = 220
    plot_width, plot_height = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM
    points = thin(sorted(points))
    parts = _open(height, title)
    parts.append(f'<text x="{LEFT}" y="12" fill="currentColor" fill-opacity="0.7">'
                 f"{escape(unit)}</text>")
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{height - 2}" text-anchor="end" '
                 f'fill="currentColor" fill-opacity="0.7">{escape(x_title)}</text>')
    if not points:
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_height}" '
                     f'y2="{TOP + plot_height}" stroke="currentColor" stroke-opacity="0.25"/>')
        _empty(parts, LEFT + plot_width / 2, TOP + plot_height / 2, empty_text)
        parts.append("</svg>")
        return mark_safe("".join(parts))  # noqa: S308 - escaped above
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    y_low, y_high, y_step = _axis(min(ys), max(ys), zero_based=zero_based)
    x_low, x_high = min(xs), max(xs)
    if x_high == x_low:
        x_high = x_low + 1

    def px(x: float) -> float:
        return LEFT + plot_width * (x - x_low) / (x_high - x_low)

    def py(y: float) -> float:
        return TOP + plot_height - plot_height * (y - y_low) / (y_high - y_low)

    _y_grid(parts, left=LEFT, right=WIDTH - RIGHT, py=py, low=y_low, high=y_high, step=y_step)
    x_step = max(1.0, _nice_step(x_high - x_low, 6))
    tick = math.ceil(x_low / x_step) * x_step
    while tick <= x_high:
        parts.append(f'<text x="{px(tick):.1f}" y="{height - 18}" text-anchor="middle" '
                     f'fill="currentColor" fill-opacity="0.7">{short_number(tick)}</text>')
        tick += x_step
    path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    parts.append(f'<polyline class="line" points="{path}" fill="none" stroke="{color}" '
                 f'stroke-width="2" stroke-linejoin="round" stroke-linecap="round"/>')
    if len(points) <= 40:
        for x, y in points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}">'
                         f"<title>{escape(x_title)} {short_number(x)}: {y:.6g} {escape(unit)}"
                         f"</title></circle>")
    last_x, last_y = points[-1]
    parts.append(f'<text class="last" x="{px(last_x) - 4:.1f}" y="{py(last_y) - 8:.1f}" '
                 f'text-anchor="end" fill="{color}">{y_label(last_y)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above


def y_label(value: float) -> str:
    """A reading for the last point: 4 significant digits, short for big numbers."""
    if abs(value) >= 1000:
        return short_number(value)
    return f"{value:.4g}"
