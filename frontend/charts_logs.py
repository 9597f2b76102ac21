"""Server-side SVG of the log search page: how many lines match, per slice of the time
searched. Same look as `frontend.charts`: text in currentColor, the shared palette, every text
escaped. A bar links to the search narrowed to its slice."""

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from aistation.logstore.base import Bucket
from frontend.charts import PALETTE
from frontend.charts_training import WIDTH, _axis, _empty, _open, _y_grid

HEIGHT = 170
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 22, 26
X_LABELS = 7


def _clock_style(span: timedelta) -> str:
    if span <= timedelta(minutes=10):
        return "%H:%M:%S"
    if span <= timedelta(days=1):
        return "%H:%M"
    if span <= timedelta(days=7):
        return "%a %H:%M"
    return "%d %b"


def _local(moment: datetime, style: str) -> str:
    return timezone.localtime(moment).strftime(style)


def log_histogram_svg(*, buckets: Sequence[Bucket], since: datetime, until: datetime,
                      title: str, zoom_url: Callable[[datetime, datetime], str] | None = None,
                      empty_text: str = "No lines match in this time") -> SafeString:
    """One bar per bucket from `since` to `until`, a count axis, clock labels below; with
    `zoom_url`, each bar links to the search of its own slice."""
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = _open(HEIGHT, title)
    parts.append(f'<text x="{LEFT}" y="12" fill="currentColor" fill-opacity="0.7">lines</text>')
    counts = [bucket.count for bucket in buckets]
    _, top, step = _axis(0.0, float(max(counts, default=0)), zero_based=True)
    if step < 1:
        top, step = float(max(math.ceil(top), 1)), 1.0  # counts: whole-number ticks

    def py(value: float) -> float:
        return TOP + plot_height - plot_height * value / top

    _y_grid(parts, left=LEFT, right=WIDTH - RIGHT, py=py, low=0.0, high=top, step=step)
    span = until - since
    width = span / max(len(buckets), 1)
    slot = plot_width / max(len(buckets), 1)
    bar = max(slot * 0.8, 1.0)
    tooltip_style = "%Y-%m-%d %H:%M:%S" if span <= timedelta(days=1) else "%Y-%m-%d %H:%M"
    for index, bucket in enumerate(buckets):
        if not bucket.count:
            continue
        x = LEFT + slot * index + (slot - bar) / 2
        size = plot_height * bucket.count / top
        end = bucket.start + width
        label = (f"{_local(bucket.start, tooltip_style)} to {_local(end, tooltip_style)}: "
                 f"{bucket.count} line{'s' if bucket.count != 1 else ''}")
        rect = (f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_height - size:.1f}" '
                f'width="{bar:.1f}" height="{size:.1f}" fill="{PALETTE[0]}">'
                f"<title>{escape(label)}</title></rect>")
        if zoom_url is not None:
            rect = f'<a href="{escape(zoom_url(bucket.start, end))}">{rect}</a>'
        parts.append(rect)
    style = _clock_style(span)
    for index in range(X_LABELS):
        moment = since + span * index / (X_LABELS - 1)
        x = LEFT + plot_width * index / (X_LABELS - 1)
        anchor = "start" if index == 0 else "end" if index == X_LABELS - 1 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}" '
                     f'fill="currentColor" fill-opacity="0.7">{escape(_local(moment, style))}'
                     "</text>")
    if not any(counts):
        _empty(parts, LEFT + plot_width / 2, TOP + plot_height / 2, empty_text)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text in it is escaped above
