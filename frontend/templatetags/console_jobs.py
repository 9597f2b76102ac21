"""Template filters of the job and cluster pages: state badges and small number formats."""

import shlex

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from aistation.choices import FINAL_STATES, AttemptState, JobState
from podsys.choices import NodeHealth

register = template.Library()

# Waiting is blue, holding GPUs is the accent (with a live dot), done is green, red or grey.
JOB_STATE_TONES = {
    JobState.QUEUED: "info",
    JobState.ADMITTED: "accent",
    JobState.RUNNING: "accent",
    JobState.SUCCEEDED: "success",
    JobState.FAILED: "danger",
    JobState.CANCELLED: "muted",
    JobState.PREEMPTED: "warning",
    JobState.RESTARTING: "warning",
}
ATTEMPT_STATE_TONES = {
    AttemptState.LAUNCHING: "accent",
    AttemptState.RUNNING: "accent",
    AttemptState.SUCCEEDED: "success",
    AttemptState.FAILED: "danger",
    AttemptState.CANCELLED: "muted",
    AttemptState.PREEMPTED: "warning",
}
LIVE_STATES = {JobState.ADMITTED, JobState.RUNNING, AttemptState.LAUNCHING}
HEALTH_TONES = {NodeHealth.HEALTHY: "success", NodeHealth.NOT_READY: "warning",
                NodeHealth.LOST: "danger"}


def state_badge(state: str, choices, tones, live_states=LIVE_STATES) -> str:
    """A coloured badge with the state's label; states still moving pulse (`badge-live`)."""
    if not state:
        return format_html('<span class="muted">{}</span>', "—")
    try:
        label = choices(state).label
    except ValueError:
        label = state
    live = " badge-live" if state in live_states else ""
    return format_html('<span class="badge badge-{}{}" data-state="{}">{}</span>',
                       tones.get(state, "muted"), live, state, label)


@register.filter
def job_state_badge(state: str) -> str:
    return state_badge(state, JobState, JOB_STATE_TONES)


@register.filter
def attempt_state_badge(state: str) -> str:
    return state_badge(state, AttemptState, ATTEMPT_STATE_TONES)


@register.filter
def health_badge(health: str) -> str:
    try:
        label = NodeHealth(health).label
    except ValueError:
        label = health
    return format_html('<span class="badge badge-{}">{}</span>', HEALTH_TONES.get(health, "muted"),
                       label)


@register.filter
def is_final(state: str) -> bool:
    return state in FINAL_STATES


@register.filter
def gib(mib) -> str:
    """MiB as GiB, without a trailing .0: 524288 → "512"."""
    if mib in (None, ""):
        return "—"
    return f"{mib / 1024:.1f}".removesuffix(".0")


@register.filter
def cores(value) -> str:
    """CPU cores with at most two decimals and no trailing zeros: 1.50 → "1.5", 2.0 → "2"."""
    if value in (None, ""):
        return "—"
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


@register.filter
def ago(moment) -> str:
    """ "3 minutes ago", or "just now" under a minute (timesince says "0 minutes")."""
    if not moment:
        return "never"
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"


@register.filter
def duration(seconds) -> str:
    """Seconds as "2h 05m", "3m 20s" or "45s"."""
    if seconds in (None, ""):
        return "—"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def join_command(command) -> str:
    """An argument list as one line a person could paste into a shell."""
    return shlex.join(command) if isinstance(command, list) else str(command)


@register.filter(name="nodes")
def nodes_text(placement) -> str:
    """One node per replica, a node holding several counted: "node-a (2), node-b"."""
    if not placement:
        return "—"
    counts: dict[str, int] = {}
    for node in placement:
        counts[node] = counts.get(node, 0) + 1
    return ", ".join(name if count == 1 else f"{name} ({count})" for name, count in counts.items())
