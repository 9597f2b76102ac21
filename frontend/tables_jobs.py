"""The tables of the job, queue and cluster pages (L1 and L2)."""

import django_tables2 as tables
from django.db.models import F
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from aistation.choices import FINAL_STATES
from aistation.models import Job, Queue
from frontend.tables import DATETIME, ConsoleTable
from frontend.templatetags.console_jobs import ago, job_state_badge, nodes_text
from podsys.models import Cluster


def _link(url: str, text) -> str:
    # Links inside the table area leave it: they must not be boosted into #table-area.
    return format_html('<a href="{}" hx-boost="false">{}</a>', url, text)


def job_link(job: Job) -> str:
    return _link(reverse("frontend:job", args=[job.pk]), job.name)


def job_cell(job: Job) -> str:
    return format_html('<span class="muted mono">#{}</span> {}', job.pk, job_link(job))


def gpus_cell(job: Job) -> str:
    """GPUs: per replica times replicas; the split shows when there are several."""
    if job.replicas == 1:
        return str(job.gpus_per_replica)
    return format_html('{} <span class="muted">({}\N{MULTIPLICATION SIGN}{})</span>', job.gpus,
                       job.gpus_per_replica, job.replicas)


class LiveJobsMixin:
    """A table of jobs that keeps itself fresh: its template polls while a shown job may still
    change (see frontend/jobs/table.html)."""

    @property
    def live(self) -> bool:
        page = getattr(self, "page", None)
        rows = page.object_list if page is not None else self.rows
        return any(row.record.state not in FINAL_STATES for row in rows)


class JobTable(LiveJobsMixin, ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    name = tables.Column(attrs={"td": {"class": "strong nowrap"}})
    queue = tables.Column(accessor="queue__name", verbose_name="Queue")
    state = tables.Column()
    gpus = tables.Column(verbose_name="GPUs", empty_values=(),
                         attrs={"td": {"class": "num nowrap"}})
    reason = tables.Column(orderable=False, attrs={"td": {"class": "clip reason"}})
    position = tables.Column(verbose_name="Pos.", attrs={"td": {"class": "num"}},
                             default="")
    owner = tables.Column(accessor="owner__username", verbose_name="Owner", default="—")
    created_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Submitted",
                                       attrs={"td": {"class": "nowrap"}})
    started_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started", default="—",
                                       attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Job
        template_name = "frontend/jobs/table.html"
        fields = ("id", "name", "queue", "state", "gpus", "reason", "position", "owner",
                  "created_at", "started_at")
        empty_text = "No jobs match."
        row_attrs = {"data-job": lambda record: record.pk}

    def render_name(self, record):
        return job_link(record)

    def render_queue(self, record):
        return _link(reverse("frontend:queue", args=[record.queue_id]), record.queue.name)

    def render_state(self, record):
        return job_state_badge(record.state)

    def render_gpus(self, record):
        return gpus_cell(record)

    def order_gpus(self, queryset, is_descending):
        queryset = queryset.annotate(gpus_total=F("gpus_per_replica") * F("replicas"))
        return queryset.order_by(("-" if is_descending else "") + "gpus_total", "-pk"), True

    def render_reason(self, value):
        return format_html('<span title="{}">{}</span>', value, value)


class BacklogTable(ConsoleTable):
    """A queue's waiting jobs, in the order the scheduler will consider them."""

    position = tables.Column(verbose_name="Pos.", default="—", orderable=False,
                             attrs={"td": {"class": "num"}})
    job = tables.Column(accessor="name", verbose_name="Job", orderable=False,
                        attrs={"td": {"class": "strong"}})
    owner = tables.Column(accessor="owner__username", verbose_name="Owner", default="—",
                          orderable=False)
    gpus = tables.Column(verbose_name="GPUs", empty_values=(), orderable=False,
                         attrs={"td": {"class": "num"}})
    priority = tables.Column(orderable=False, attrs={"td": {"class": "num"}})
    queued_at = tables.Column(verbose_name="Waiting", orderable=False,
                              attrs={"td": {"class": "nowrap"}})
    reason = tables.Column(verbose_name="Why it waits", orderable=False,
                           attrs={"td": {"class": "reason"}})

    class Meta(ConsoleTable.Meta):
        model = Job
        fields = ("position", "job", "owner", "gpus", "priority", "queued_at", "reason")
        empty_text = "Nothing waits in this queue."
        row_attrs = {"data-job": lambda record: record.pk}

    def render_job(self, record):
        return job_cell(record)

    def render_gpus(self, record):
        return gpus_cell(record)

    def render_queued_at(self, value):
        return format_html('<span title="{}">{}</span>', value.strftime("%Y-%m-%d %H:%M:%S"),
                           _waited(value))


def _waited(since) -> str:
    text = ago(since)
    return "under a minute" if text == "just now" else text.removesuffix(" ago")


class RunningJobsTable(ConsoleTable):
    job = tables.Column(accessor="name", verbose_name="Job", orderable=False,
                        attrs={"td": {"class": "strong"}})
    state = tables.Column(orderable=False)
    owner = tables.Column(accessor="owner__username", verbose_name="Owner", default="—",
                          orderable=False)
    gpus = tables.Column(verbose_name="GPUs", empty_values=(), orderable=False,
                         attrs={"td": {"class": "num"}})
    placement = tables.Column(verbose_name="Nodes", orderable=False, empty_values=(),
                              attrs={"td": {"class": "mono"}})
    started_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started", default="—",
                                       orderable=False, attrs={"td": {"class": "nowrap"}})

    class Meta(ConsoleTable.Meta):
        model = Job
        fields = ("job", "state", "owner", "gpus", "placement", "started_at")
        empty_text = "Nothing from this queue runs now."
        row_attrs = {"data-job": lambda record: record.pk}

    def render_job(self, record):
        return job_cell(record)

    def render_state(self, record):
        return job_state_badge(record.state)

    def render_gpus(self, record):
        return gpus_cell(record)

    def render_placement(self, value):
        return nodes_text(value)


class QueueTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    cluster = tables.Column(accessor="cluster__name", verbose_name="Cluster")
    policy = tables.Column()
    gpu_limit = tables.Column(verbose_name="GPU limit", default="Quota",
                              attrs={"td": {"class": "num"}})
    default_priority = tables.Column(verbose_name="Priority", attrs={"td": {"class": "num"}})
    pending = tables.Column(verbose_name="Waiting", attrs={"td": {"class": "num"}})
    running = tables.Column(attrs={"td": {"class": "num"}})
    gpus_in_use = tables.Column(verbose_name="GPUs in use", attrs={"td": {"class": "num"}})
    is_active = tables.Column(verbose_name="Status")
    actions = tables.TemplateColumn(
        template_name="frontend/queues/row_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Queue
        fields = ("name", "cluster", "policy", "gpu_limit", "default_priority", "pending",
                  "running", "gpus_in_use", "is_active")
        empty_text = "This tenant has no queues."

    def render_name(self, record):
        return _link(reverse("frontend:queue", args=[record.pk]), record.name)

    def render_cluster(self, record):
        return _link(reverse("frontend:cluster", args=[record.cluster.name]), record.cluster.name)

    def render_policy(self, record):
        return record.get_policy_display()

    def render_is_active(self, value):
        return format_html('<span class="badge badge-{}">{}</span>',
                           "success" if value else "muted", "Active" if value else "Closed")


class ClusterTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong"}})
    display_name = tables.Column(verbose_name="Display name", default="—")
    driver = tables.Column(attrs={"td": {"class": "mono"}})
    scope = tables.Column(accessor="tenant__name", verbose_name="Used by", empty_values=())
    node_count = tables.Column(verbose_name="Nodes", attrs={"td": {"class": "num"}})
    gpu_count = tables.Column(verbose_name="GPUs", default=0, attrs={"td": {"class": "num"}})
    allocated = tables.Column(verbose_name="Allocated", empty_values=(), orderable=False,
                              attrs={"td": {"class": "num"}})
    last_synced_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Last synced",
                                           default="Never", attrs={"td": {"class": "nowrap"}})
    sync_error = tables.Column(verbose_name="Sync", orderable=False, empty_values=())

    class Meta(ConsoleTable.Meta):
        model = Cluster
        fields = ("name", "display_name", "driver", "scope", "node_count", "gpu_count",
                  "allocated", "last_synced_at", "sync_error")
        empty_text = "No clusters are registered yet."

    def __init__(self, *args, allocated: dict[int, int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocated_by_cluster = allocated or {}

    def render_name(self, record):
        return _link(reverse("frontend:cluster", args=[record.name]), record.name)

    def render_scope(self, record):
        if record.tenant_id is None:
            return mark_safe('<span class="badge badge-info">All tenants</span>')
        return format_html('<span class="badge badge-accent">{}</span>', record.tenant.name)

    def render_allocated(self, record):
        held = self.allocated_by_cluster.get(record.pk, 0)
        total = record.gpu_count or 0
        return format_html('{} <span class="muted">/ {}</span>', held, total)

    def render_sync_error(self, record):
        if record.sync_error:
            return format_html('<span class="badge badge-danger" title="{}">Failing</span>',
                               record.sync_error)
        if record.last_synced_at is None:
            return mark_safe('<span class="badge badge-muted">Not synced</span>')
        return mark_safe('<span class="badge badge-success">OK</span>')
