"""The tables of the model pages (L4): models, evaluation runs, benchmarks and deployments,
and the state badge of a deployment."""

import django_tables2 as tables
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html

from aistation.selectors import job_waiting_reason
from frontend.tables import DATETIME, ConsoleTable
from frontend.tables_jobs import _link
from frontend.tables_ylink import LiveRunsMixin, run_state_badge, with_waiting_reason
from frontend.templatetags.console_jobs import state_badge
from mmodel.choices import DeploymentState, VersionStatus
from mmodel.models import Benchmark, Deployment, EvaluationRun, Model, ModelVersion
from mmodel.selectors.deployments import deployment_state, deployment_waiting_reason

DEPLOYMENT_STATE_TONES = {
    DeploymentState.STARTING: "info",
    DeploymentState.READY: "success",
    DeploymentState.DEGRADED: "warning",
    DeploymentState.SCALED_TO_ZERO: "muted",
    DeploymentState.STOPPED: "muted",
    DeploymentState.FAILED: "danger",
}
VERSION_STATUS_TONES = {VersionStatus.IMPORTING: "info", VersionStatus.READY: "success",
                        VersionStatus.FAILED: "danger"}


def deployment_state_badge(state: str) -> str:
    return state_badge(state, DeploymentState, DEPLOYMENT_STATE_TONES, {DeploymentState.STARTING})


def version_status_badge(status: str) -> str:
    return state_badge(status, VersionStatus, VERSION_STATUS_TONES, {VersionStatus.IMPORTING})


def model_version_link(version: ModelVersion | None) -> str:
    if version is None:
        return format_html('<span class="muted">{}</span>', "—")
    return _link(reverse("frontend:model-version", args=[version.pk]), version.label)


class ModelTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    version_count = tables.Column(verbose_name="Versions", attrs={"td": {"class": "num"}})
    latest_version = tables.Column(verbose_name="Latest", default="—",
                                   attrs={"td": {"class": "num"}})
    bytes_total = tables.Column(verbose_name="Size", default="—",
                                attrs={"td": {"class": "num nowrap"}})
    description = tables.Column(orderable=False, attrs={"td": {"class": "clip muted"}})
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Created",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Model
        fields = ("name", "version_count", "latest_version", "bytes_total", "description",
                  "created_at")
        empty_text = "No models yet: import one from a directory or register a training run."
        row_attrs = {"data-model": lambda record: record.name}

    def render_name(self, record):
        return _link(reverse("frontend:model", args=[record.pk]), record.name)

    def render_latest_version(self, record, value):
        return _link(reverse("frontend:model-version", args=[record.latest_version_id]),
                     f"v{value}")

    def render_bytes_total(self, value):
        return filesizeformat(value)


class EvaluationRunTable(LiveRunsMixin, ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    name = tables.Column(attrs={"td": {"class": "strong nowrap"}})
    version = tables.Column(verbose_name="Version", orderable=False)
    benchmark_names = tables.Column(verbose_name="Benchmarks", empty_values=(), orderable=False,
                                    attrs={"td": {"class": "clip muted"}})
    state = tables.Column(empty_values=(), orderable=False)
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = EvaluationRun
        template_name = "frontend/ylink/runs_table.html"
        fields = ("id", "name", "version", "benchmark_names", "state", "created_at")
        empty_text = "No evaluations yet."
        row_attrs = {"data-run": lambda record: record.pk}

    def render_name(self, record):
        return _link(reverse("frontend:evaluation-run", args=[record.pk]), record.name)

    def render_version(self, record):
        return model_version_link(record.version)

    def render_benchmark_names(self, record):
        return ", ".join(benchmark.name for benchmark in record.benchmarks.all()) or "—"

    def render_state(self, record):
        return with_waiting_reason(run_state_badge(record.state), job_waiting_reason(record.job))


class BenchmarkTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    kind = tables.Column()
    documents = tables.Column(attrs={"td": {"class": "num"}})
    few_shot = tables.Column(verbose_name="Few-shot", attrs={"td": {"class": "num"}})
    owner = tables.Column(accessor="tenant__name", verbose_name="Owner", default="shared",
                          orderable=False)
    description = tables.Column(orderable=False, attrs={"td": {"class": "clip muted"}})
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Added",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Benchmark
        fields = ("name", "kind", "documents", "few_shot", "owner", "description", "created_at")
        empty_text = "No benchmarks yet: upload one."
        row_attrs = {"data-benchmark": lambda record: record.name}

    def render_kind(self, record):
        return record.get_kind_display()


class DeploymentTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong mono"}})
    version = tables.Column(orderable=False)
    runtime = tables.Column()
    replicas = tables.Column(verbose_name="Replicas ready", empty_values=(),
                             attrs={"td": {"class": "num nowrap"}})
    state = tables.Column(empty_values=(), orderable=False)
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Created",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Deployment
        fields = ("name", "version", "runtime", "replicas", "state", "created_at")
        empty_text = "No deployments yet: deploy a ready model version."
        row_attrs = {"data-deployment": lambda record: record.name}

    def render_name(self, record):
        return _link(reverse("frontend:deployment", args=[record.pk]), record.name)

    def render_version(self, record):
        return model_version_link(record.version)

    def render_runtime(self, record):
        return record.runtime

    def render_replicas(self, record):
        ready = sum(1 for replica in record.replica_set.all() if replica.ready)
        return format_html('<span data-ready="{}">{}</span> <span class="muted">/ {}</span>',
                           ready, ready, record.replicas)

    def render_state(self, record):
        return with_waiting_reason(deployment_state_badge(deployment_state(record)),
                                   deployment_waiting_reason(record))
