"""The tables of the toolchain pages (L3): datasets, pipeline runs and training runs, and the
state badge of a run."""

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html

from aistation.selectors import job_waiting_reason
from frontend.tables import DATETIME, ConsoleTable
from frontend.tables_jobs import _link
from frontend.templatetags.console_jobs import state_badge
from ylink.choices import FINAL_RUN_STATES, DatasetKind, RunState
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun

RUN_STATE_TONES = {
    RunState.QUEUED: "info",
    RunState.RUNNING: "accent",
    RunState.RESTARTING: "warning",
    RunState.FINISHING: "accent",
    RunState.SUCCEEDED: "success",
    RunState.FAILED: "danger",
    RunState.CANCELLED: "muted",
}
LIVE_RUN_STATES = {RunState.RUNNING, RunState.FINISHING}


def with_waiting_reason(badge: str, reason: str) -> str:
    """A state badge, and beside it why the work waits for the scheduler (if it does)."""
    if not reason:
        return badge
    return format_html('{} <span class="reason-text muted" data-waiting-reason>{}</span>', badge,
                       reason)


def run_state_badge(state: str) -> str:
    return state_badge(state, RunState, RUN_STATE_TONES, LIVE_RUN_STATES)


def version_label(version: DatasetVersion) -> str:
    return f"{version.dataset.name} v{version.number}"


def version_url(version: DatasetVersion) -> str:
    return f"{reverse('frontend:dataset', args=[version.dataset_id])}?version={version.number}"


def version_link(version: DatasetVersion | None) -> str:
    if version is None:
        return format_html('<span class="muted">{}</span>', "—")
    return _link(version_url(version), version_label(version))


class LiveRunsMixin:
    """A table of runs that keeps itself fresh while a shown run may still change (the
    template frontend/ylink/runs_table.html polls)."""

    @property
    def live(self) -> bool:
        page = getattr(self, "page", None)
        rows = page.object_list if page is not None else self.rows
        return any(row.record.state not in FINAL_RUN_STATES for row in rows)


class DatasetTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    kind = tables.Column()
    version_count = tables.Column(verbose_name="Versions", attrs={"td": {"class": "num"}})
    latest_version = tables.Column(verbose_name="Latest", default="—",
                                   attrs={"td": {"class": "num"}})
    description = tables.Column(orderable=False, attrs={"td": {"class": "clip muted"}})
    created_by = tables.Column(accessor="created_by__username", verbose_name="Created by",
                               default="—")
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Created",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Dataset
        fields = ("name", "kind", "version_count", "latest_version", "description",
                  "created_by", "created_at")
        empty_text = "No datasets yet: create one, then upload a corpus."
        row_attrs = {"data-dataset": lambda record: record.pk}

    def render_name(self, record):
        return _link(reverse("frontend:dataset", args=[record.pk]), record.name)

    def render_kind(self, record):
        tone = "info" if record.kind == DatasetKind.INSTRUCTION else "muted"
        return format_html('<span class="badge badge-{}">{}</span>', tone,
                           "instructions" if record.kind == DatasetKind.INSTRUCTION else "text")

    def render_latest_version(self, record, value):
        return _link(f"{reverse('frontend:dataset', args=[record.pk])}?version={value}",
                     f"v{value}")


class PipelineRunTable(LiveRunsMixin, ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    name = tables.Column(attrs={"td": {"class": "strong nowrap"}})
    state = tables.Column(empty_values=(), orderable=False)
    input_version = tables.Column(verbose_name="Input", orderable=False)
    output_version = tables.Column(verbose_name="Output", orderable=False, empty_values=())
    steps = tables.Column(verbose_name="Steps", orderable=False,
                          attrs={"td": {"class": "clip muted"}})
    replicas = tables.Column(attrs={"td": {"class": "num"}})
    created_by = tables.Column(accessor="created_by__username", verbose_name="Started by",
                               default="—")
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = PipelineRun
        template_name = "frontend/ylink/runs_table.html"
        fields = ("id", "name", "state", "input_version", "output_version", "steps", "replicas",
                  "created_by", "created_at")
        empty_text = "No pipeline runs yet: open a dataset version and run a pipeline on it."
        row_attrs = {"data-run": lambda record: record.pk}

    def render_name(self, record):
        return _link(reverse("frontend:pipeline-run", args=[record.pk]), record.name)

    def render_state(self, record):
        return with_waiting_reason(run_state_badge(record.state), job_waiting_reason(record.job))

    def render_input_version(self, record):
        return version_link(record.input_version)

    def render_output_version(self, record):
        return version_link(record.output_version)

    def render_steps(self, value):
        names = " → ".join(step.get("type", "?") for step in value)
        return format_html('<span title="{}">{}</span>', names, names)


class TrainingRunTable(LiveRunsMixin, ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    name = tables.Column(attrs={"td": {"class": "strong nowrap"}})
    kind = tables.Column()
    state = tables.Column(empty_values=(), orderable=False)
    step = tables.Column(verbose_name="Step", empty_values=(),
                         attrs={"td": {"class": "num nowrap"}})
    loss = tables.Column(default="—", attrs={"td": {"class": "num"}})
    tokens_per_s = tables.Column(verbose_name="Tokens/s", default="—",
                                 attrs={"td": {"class": "num"}})
    dataset_version = tables.Column(verbose_name="Data", orderable=False)
    gpus = tables.Column(verbose_name="GPUs", empty_values=(), attrs={"td": {"class": "num"}})
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = TrainingRun
        template_name = "frontend/ylink/runs_table.html"
        fields = ("id", "name", "kind", "state", "step", "loss", "tokens_per_s",
                  "dataset_version", "gpus", "created_at")
        empty_text = "No training runs yet."
        row_attrs = {"data-run": lambda record: record.pk}

    def render_name(self, record):
        return _link(reverse("frontend:training-run", args=[record.pk]), record.name)

    def render_kind(self, record):
        return record.get_kind_display()

    def render_state(self, record):
        return with_waiting_reason(run_state_badge(record.state), job_waiting_reason(record.job))

    def render_step(self, record):
        if not record.total_steps:
            return str(record.step) if record.step else "—"
        return format_html('{} <span class="muted">/ {}</span>', record.step, record.total_steps)

    def render_loss(self, value):
        return f"{value:.4f}"

    def render_tokens_per_s(self, value):
        return f"{value:,.0f}"

    def render_dataset_version(self, record):
        return version_link(record.dataset_version)

    def render_gpus(self, record):
        if record.replicas == 1:
            return str(record.gpus)
        return format_html('{} <span class="muted">({}\N{MULTIPLICATION SIGN}{})</span>',
                           record.gpus * record.replicas, record.gpus, record.replicas)

