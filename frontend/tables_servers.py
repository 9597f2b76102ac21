"""The tables of the bare-metal pages (L0): servers, racks, provisioning profiles and batches."""

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html

from frontend.tables import DATETIME, ConsoleTable
from frontend.tables_jobs import _link
from frontend.templatetags.console_jobs import ago
from frontend.templatetags.console_servers import (
    batch_state_badge,
    health_text_badge,
    power_badge,
    server_state_badge,
)
from infra_os.choices import RunState, ServerAllocation
from infra_os.models import ProvisioningBatch, ProvisioningProfile, Rack, Server

BMC_ERROR_CHARS = 60


def server_link(name: str) -> str:
    return _link(reverse("frontend:server", args=[name]), name)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


class ServerTable(ConsoleTable):
    # The boxes belong to the bulk-action form above the table (form="bulk-form"), so the
    # table area can be re-sorted and paged by htmx without nesting forms.
    servers = tables.CheckBoxColumn(
        accessor="name", verbose_name="",
        attrs={
            "th__input": {"aria-label": "Select every server shown",
                          "onclick": "document.querySelectorAll('input[name=servers]"
                                     "[form=bulk-form]').forEach(b => b.checked = this.checked)"},
            "td__input": {"form": "bulk-form",
                          "aria-label": lambda record: f"Select {record.name}"},
            "td": {"class": "select"}, "th": {"class": "select"},
        },
    )
    name = tables.Column(attrs={"td": {"class": "strong nowrap mono"}})
    rack = tables.Column(accessor="rack__name", verbose_name="Rack", default="—")
    state = tables.Column()
    power_state = tables.Column(verbose_name="Power", default="—")
    health = tables.Column(default="—")
    gpus = tables.Column(verbose_name="GPUs", empty_values=(), order_by=("gpu_count",),
                         attrs={"td": {"class": "nowrap"}})
    allocation = tables.Column(empty_values=())
    last_seen_at = tables.Column(verbose_name="Last seen", empty_values=(),
                                 attrs={"td": {"class": "nowrap"}})
    bmc_error = tables.Column(verbose_name="BMC error", orderable=False, default="",
                              attrs={"td": {"class": "clip reason"}})

    class Meta(ConsoleTable.Meta):
        model = Server
        fields = ("servers", "name", "rack", "state", "power_state", "health", "gpus",
                  "allocation", "last_seen_at", "bmc_error")
        empty_text = "No servers match. Register one, or import a file of them."
        row_attrs = {"data-server": lambda record: record.name}

    def render_name(self, record):
        return server_link(record.name)

    def render_state(self, record):
        badge = server_state_badge(record.state)
        run = getattr(record, "provisioning_state", None)
        if run and record.state == "provisioning":
            return format_html('{} <a class="muted" href="{}" hx-boost="false">{}</a>', badge,
                               reverse("frontend:batch", args=[record.provisioning_batch_id]),
                               RunState(run).label.lower())
        return badge

    def render_power_state(self, value):
        return power_badge(value)

    def render_health(self, value):
        return health_text_badge(value)

    def render_gpus(self, record):
        return gpus_cell(record)

    def render_allocation(self, record):
        leased_to = getattr(record, "leased_to", None)
        if leased_to:
            return format_html('<span class="badge badge-accent">Leased</span> {}', leased_to)
        if record.allocation == ServerAllocation.CLUSTER:
            return format_html('<span class="badge badge-info">Node</span> {}',
                               record.allocated_to)
        return format_html('<span class="muted">{}</span>', "Free")

    def render_last_seen_at(self, value):
        if value is None:
            return format_html('<span class="muted">{}</span>', "Never")
        return format_html('<span title="{}">{}</span>', value.strftime("%Y-%m-%d %H:%M:%S"),
                           ago(value))

    def render_bmc_error(self, value):
        return format_html('<span class="bmc-error" title="{}">{}</span>', value,
                           _short(value, BMC_ERROR_CHARS))


def gpus_cell(server) -> str:
    """Reported GPUs against the expected ones; a mismatch is marked and explained on hover."""
    reported = f"{server.gpu_count}" if server.last_seen_at else "?"
    expected = server.expected_gpu_count
    text = format_html("{} <span class=\"muted\">/ {}</span>", reported, expected) if expected \
        else format_html("{}", reported)
    model = server.gpu_model or server.expected_gpu_model
    if model:
        text = format_html('{} <span class="muted">{}</span>', text, model)
    if server.mismatches:
        text = format_html('{} <span class="badge badge-warning" title="{}">Mismatch</span>',
                           text, " ".join(server.mismatches))
    return text


class RackTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong mono"}})
    location = tables.Column(default="—")
    server_count = tables.Column(verbose_name="Servers", attrs={"td": {"class": "num"}})
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Added",
                                       attrs={"td": {"class": "nowrap"}})
    actions = tables.TemplateColumn(
        template_name="frontend/servers/rack_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Rack
        fields = ("name", "location", "server_count", "created_at")
        empty_text = "No racks yet."
        row_attrs = {"data-rack": lambda record: record.name}

    def render_name(self, record):
        return _link(f"{reverse('frontend:servers')}?rack={record.name}", record.name)


class ProfileTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong mono"}})
    description = tables.Column(default="—", orderable=False, attrs={"td": {"class": "clip"}})
    boot_method = tables.Column(verbose_name="Boot")
    user_data = tables.Column(verbose_name="User data", orderable=False, empty_values=())
    updated_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Updated",
                                       attrs={"td": {"class": "nowrap"}})
    actions = tables.TemplateColumn(
        template_name="frontend/provisioning/profile_actions.html", verbose_name="",
        orderable=False, attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = ProvisioningProfile
        fields = ("name", "description", "boot_method", "user_data", "updated_at")
        empty_text = "No profiles yet: add one before the first batch."
        row_attrs = {"data-profile": lambda record: record.name}

    def render_name(self, record):
        return _link(reverse("frontend:profile-edit", args=[record.name]), record.name)

    def render_boot_method(self, record):
        return record.get_boot_method_display()

    def render_user_data(self, record):
        lines = len(record.user_data.splitlines())
        if not lines:
            return format_html('<span class="muted">{}</span>', "None")
        return f"{lines} line{'s' if lines != 1 else ''}"


class BatchTable(ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    name = tables.Column(attrs={"td": {"class": "strong"}})
    profile = tables.Column(accessor="profile__name", verbose_name="Profile")
    state = tables.Column()
    counts = tables.Column(verbose_name="Servers", empty_values=(), orderable=False,
                           attrs={"td": {"class": "nowrap"}})
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Created",
                                       attrs={"td": {"class": "nowrap"}})
    finished_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Finished", default="—",
                                        attrs={"td": {"class": "nowrap"}})
    created_by = tables.Column(accessor="created_by__username", verbose_name="By",
                               default="—")

    class Meta(ConsoleTable.Meta):
        model = ProvisioningBatch
        fields = ("id", "name", "profile", "state", "counts", "created_at", "finished_at",
                  "created_by")
        empty_text = "No batches yet."
        row_attrs = {"data-batch": lambda record: record.pk}

    def render_name(self, record):
        return _link(reverse("frontend:batch", args=[record.pk]), record.name)

    def render_state(self, record):
        return batch_state_badge(record.state)

    def render_counts(self, record):
        done = getattr(record, f"runs_{RunState.PROVISIONED}", 0)
        failed = getattr(record, f"runs_{RunState.FAILED}", 0)
        total = getattr(record, "runs_total", 0)
        text = format_html('<span class="strong">{}</span> <span class="muted">/ {} '
                           'provisioned</span>', done, total)
        if failed:
            text = format_html('{} · <span class="text-danger">{} failed</span>', text, failed)
        return text
