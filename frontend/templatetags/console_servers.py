"""Template filters of the bare-metal pages: server, power, health, batch and run badges."""

from django import template
from django.utils.html import format_html

from frontend.templatetags.console_jobs import state_badge
from infra_os.choices import BatchState, LeaseState, RunState, ServerState

register = template.Library()

SERVER_STATE_TONES = {
    ServerState.REGISTERED: "muted",
    ServerState.PROVISIONING: "accent",
    ServerState.PROVISIONED: "success",
    ServerState.FAILED: "danger",
    ServerState.RETIRED: "muted",
}
BATCH_STATE_TONES = {
    BatchState.RUNNING: "accent",
    BatchState.SUCCEEDED: "success",
    BatchState.PARTIAL: "warning",
    BatchState.FAILED: "danger",
    BatchState.CANCELLED: "muted",
}
RUN_STATE_TONES = {
    RunState.WAITING: "muted",
    RunState.PREPARING: "info",
    RunState.REBOOTING: "accent",
    RunState.AWAITING_CALLBACK: "accent",
    RunState.PROVISIONED: "success",
    RunState.FAILED: "danger",
    RunState.CANCELLED: "muted",
}
LEASE_STATE_TONES = {LeaseState.SCHEDULED: "info", LeaseState.ACTIVE: "success",
                     LeaseState.ENDED: "muted", LeaseState.CANCELLED: "warning"}
LIVE = {ServerState.PROVISIONING, BatchState.RUNNING, RunState.PREPARING, RunState.REBOOTING,
        RunState.AWAITING_CALLBACK}
POWER_TONES = {"On": "success", "Off": "muted"}
HEALTH_TONES = {"OK": "success", "Warning": "warning", "Critical": "danger"}


@register.filter
def server_state_badge(state: str) -> str:
    return state_badge(state, ServerState, SERVER_STATE_TONES, LIVE)


@register.filter
def batch_state_badge(state: str) -> str:
    return state_badge(state, BatchState, BATCH_STATE_TONES, LIVE)


@register.filter
def run_state_badge(state: str) -> str:
    return state_badge(state, RunState, RUN_STATE_TONES, LIVE)


@register.filter
def lease_state_badge(state: str) -> str:
    return state_badge(state, LeaseState, LEASE_STATE_TONES, LIVE)


@register.filter
def power_badge(power: str) -> str:
    """The BMC's word for the power state ("On", "Off", "PoweringOn"…), "—" before it spoke."""
    if not power:
        return format_html('<span class="muted">{}</span>', "—")
    return format_html('<span class="badge badge-{}">{}</span>',
                       POWER_TONES.get(power, "warning"), power)


@register.filter
def health_text_badge(health: str) -> str:
    """The BMC's health word (Redfish: OK, Warning, Critical)."""
    if not health:
        return format_html('<span class="muted">{}</span>', "—")
    return format_html('<span class="badge badge-{}">{}</span>',
                       HEALTH_TONES.get(health, "muted"), health)


@register.filter
def bytes_text(value) -> str:
    """A disk's capacity: 960197124096 → "960 GB" (decimal, as disks are sold)."""
    if value in (None, ""):
        return "—"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{size:.0f} {unit}" if size >= 10 or unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(value)  # pragma: no cover
