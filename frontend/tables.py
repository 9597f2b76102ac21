"""The console's tables: one per list page, rendered with frontend/tables/table.html."""

import django_tables2 as tables
from django.utils.html import format_html, format_html_join

from infra_os.choices import Role
from infra_os.models import ApiToken, AuditEvent, Membership, Quota, Tenant

DATETIME = "Y-m-d H:i"


def _badge(text: str, tone: str):
    return format_html('<span class="badge badge-{}">{}</span>', tone, text)


ROLE_TONES = {Role.ADMIN: "accent", Role.MEMBER: "info", Role.VIEWER: "muted"}
STATE_TONES = {"active": "success", "expired": "warning", "revoked": "danger"}


def gpu_limits_text(limits: dict) -> str:
    return ", ".join(f"{model}: {count}" for model, count in sorted(limits.items()))


class ConsoleTable(tables.Table):
    class Meta:
        template_name = "frontend/tables/table.html"
        attrs = {"class": "data-table"}


class TenantTable(ConsoleTable):
    name = tables.Column(verbose_name="Name", attrs={"td": {"class": "mono"}})
    display_name = tables.Column(verbose_name="Display name")
    description = tables.Column(orderable=False, attrs={"td": {"class": "clip"}})
    member_count = tables.Column(verbose_name="Members", attrs={"td": {"class": "num"}})
    gpus = tables.Column(accessor="quota__gpus", verbose_name="GPU quota",
                         attrs={"td": {"class": "num"}})
    log_retention_days = tables.Column(verbose_name="Logs kept", attrs={"td": {"class": "num"}})
    my_role = tables.Column(verbose_name="Your role")
    is_active = tables.Column(verbose_name="Status")
    actions = tables.TemplateColumn(
        template_name="frontend/tenants/row_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Tenant
        fields = ("name", "display_name", "description", "member_count", "gpus",
                  "log_retention_days", "my_role", "is_active")
        empty_text = "No tenants match."

    def render_log_retention_days(self, value):
        return f"{value} day{'s' if value != 1 else ''}"

    def render_my_role(self, value):
        return _badge(Role(value).label, ROLE_TONES[Role(value)])

    def render_is_active(self, value):
        return _badge("Active", "success") if value else _badge("Inactive", "muted")


class MembershipTable(ConsoleTable):
    username = tables.Column(accessor="user__username", verbose_name="User",
                             attrs={"td": {"class": "strong"}})
    full_name = tables.Column(accessor="user__get_full_name", verbose_name="Name",
                              order_by=("user__first_name", "user__last_name"))
    email = tables.Column(accessor="user__email", verbose_name="Email")
    role = tables.Column()
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Member since")
    actions = tables.TemplateColumn(
        template_name="frontend/members/row_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Membership
        fields = ("username", "full_name", "email", "role", "created_at")
        empty_text = "No members match."

    def render_role(self, value, record):
        return _badge(record.get_role_display(), ROLE_TONES[Role(record.role)])


class QuotaTable(ConsoleTable):
    tenant = tables.Column(accessor="tenant__name", verbose_name="Tenant",
                           attrs={"td": {"class": "mono"}})
    gpus = tables.Column(verbose_name="GPUs", attrs={"td": {"class": "num"}})
    cpu_cores = tables.Column(verbose_name="CPU cores", attrs={"td": {"class": "num"}})
    memory_gib = tables.Column(verbose_name="Memory (GiB)", attrs={"td": {"class": "num"}})
    storage_gib = tables.Column(verbose_name="Storage (GiB)", attrs={"td": {"class": "num"}})
    gpu_model_limits = tables.Column(verbose_name="Per-GPU-model limits", orderable=False,
                                     empty_values=())
    updated_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Updated")

    class Meta(ConsoleTable.Meta):
        model = Quota
        fields = ("tenant", "gpus", "cpu_cores", "memory_gib", "storage_gib",
                  "gpu_model_limits", "updated_at")
        empty_text = "This tenant has no quota."

    def render_gpu_model_limits(self, value):
        return gpu_limits_text(value) if value else "No per-model limits"


class ApiTokenTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    prefix = tables.Column(verbose_name="Prefix", orderable=False, attrs={"td": {"class": "mono"}})
    state = tables.Column(empty_values=(), orderable=False)
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Created")
    expires_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Expires",
                                       default="Never")
    last_used_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Last used",
                                         default="Never used")
    actions = tables.TemplateColumn(
        template_name="frontend/tokens/row_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = ApiToken
        fields = ("name", "prefix", "state", "created_at", "expires_at", "last_used_at")
        empty_text = "You have no API tokens."
        row_attrs = {"data-token": lambda record: record.name}

    def render_prefix(self, value):
        return f"ogai_{value}_…"

    def render_state(self, record):
        return _badge(record.state.capitalize(), STATE_TONES[record.state])


class AuditEventTable(ConsoleTable):
    created_at = tables.DateTimeColumn(format="Y-m-d H:i:s", verbose_name="Time",
                                       attrs={"td": {"class": "nowrap"}})
    actor_name = tables.Column(verbose_name="Actor")
    action = tables.Column(attrs={"td": {"class": "mono"}})
    object_repr = tables.Column(verbose_name="Object")
    changes = tables.Column(orderable=False, empty_values=(), attrs={"td": {"class": "clip"}})
    source_ip = tables.Column(verbose_name="Source IP", attrs={"td": {"class": "mono"}})

    class Meta(ConsoleTable.Meta):
        model = AuditEvent
        fields = ("created_at", "actor_name", "action", "object_repr", "changes", "source_ip")
        empty_text = "No audit events match."

    def render_changes(self, value):
        if not value:
            return "—"
        return format_html_join("; ", "{}: {}", (
            (key, _change_text(change)) for key, change in value.items()
        ))


def _change_text(change) -> str:
    if isinstance(change, dict) and set(change) == {"from", "to"}:
        return f"{change['from']} → {change['to']}"
    return str(change)
