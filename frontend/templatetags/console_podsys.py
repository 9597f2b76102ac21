"""Template filters of the PODsys pages: deployment, task and health-check badges."""

from django import template
from django.utils.html import format_html

from frontend.templatetags.console_jobs import state_badge
from podsys.choices import CheckSeverity, CheckState, DeploymentState, TaskStatus

register = template.Library()

DEPLOYMENT_STATE_TONES = {
    DeploymentState.QUEUED: "info",
    DeploymentState.RUNNING: "accent",
    DeploymentState.SUCCEEDED: "success",
    DeploymentState.FAILED: "danger",
    DeploymentState.CANCELLED: "muted",
}
# Ansible's own colours: ok green, changed yellow, failed and unreachable red, skipped blue-grey.
TASK_STATUS_TONES = {
    TaskStatus.RUNNING: "accent",
    TaskStatus.OK: "success",
    TaskStatus.CHANGED: "warning",
    TaskStatus.SKIPPED: "muted",
    TaskStatus.FAILED: "danger",
    TaskStatus.UNREACHABLE: "danger",
}
CHECK_STATE_TONES = {
    CheckState.PENDING: "info",
    CheckState.RUNNING: "accent",
    CheckState.PASSED: "success",
    CheckState.FAILED: "danger",
    CheckState.ERROR: "warning",
}
# A node's state in a deployment run's grid (see podsys.selectors.deployment_grid).
HOST_STATES = {"pending": ("Pending", "muted"), "running": ("Running", "accent"),
               "ok": ("OK", "success"), "failed": ("Failed", "danger"),
               "unreachable": ("Unreachable", "danger")}
SEVERITY_TONES = {CheckSeverity.FATAL: "danger", CheckSeverity.WARNING: "warning"}
SEVERITY_SHORT = {CheckSeverity.FATAL: "Fatal", CheckSeverity.WARNING: "Warning"}
LIVE = {DeploymentState.RUNNING, TaskStatus.RUNNING, CheckState.RUNNING}


@register.filter
def deployment_state_badge(state: str) -> str:
    return state_badge(state, DeploymentState, DEPLOYMENT_STATE_TONES, LIVE)


@register.filter
def task_status_badge(status: str) -> str:
    return state_badge(status, TaskStatus, TASK_STATUS_TONES, LIVE)


@register.filter
def check_state_badge(state: str) -> str:
    return state_badge(state, CheckState, CHECK_STATE_TONES, LIVE)


@register.filter
def host_state_badge(state: str) -> str:
    label, tone = HOST_STATES.get(state, (state or "—", "muted"))
    live = " badge-live" if state == "running" else ""
    return format_html('<span class="badge badge-{}{}" data-state="{}">{}</span>', tone, live,
                       state, label)


@register.filter
def host_state_label(state: str) -> str:
    return HOST_STATES.get(state, (state,))[0]


@register.filter
def severity_badge(severity: str) -> str:
    """"Fatal" (a failure cordons the node) or "Warning"; the long label is the tooltip."""
    if not severity:
        return format_html('<span class="muted">{}</span>', "—")
    try:
        long_label = CheckSeverity(severity).label
    except ValueError:
        long_label = severity
    return format_html('<span class="badge badge-{}" title="{}">{}</span>',
                       SEVERITY_TONES.get(severity, "muted"), long_label,
                       SEVERITY_SHORT.get(severity, severity))


@register.filter
def took_s(run) -> float | None:
    """Seconds from a run's start to its end; None while either is missing."""
    started, finished = getattr(run, "started_at", None), getattr(run, "finished_at", None)
    if not started or not finished:
        return None
    return max((finished - started).total_seconds(), 0.0)


@register.filter
def keys_count(text: str) -> int:
    """SSH public keys in an authorized_keys text: its non-empty lines that are not comments."""
    return sum(1 for line in (text or "").splitlines()
               if line.strip() and not line.lstrip().startswith("#"))
