"""The tables of the PODsys pages (L1): stack profiles, deployment runs, cluster accounts."""

import django_tables2 as tables
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from frontend.tables import DATETIME, ConsoleTable
from frontend.tables_jobs import _link
from frontend.templatetags.console_jobs import duration
from frontend.templatetags.console_podsys import deployment_state_badge, keys_count
from podsys.choices import DEPLOYMENT_FINAL_STATES
from podsys.models import ClusterGroup, ClusterUser, DeploymentRun, StackProfile

# Hosts a run's row names before it says "and N more".
HOSTS_SHOWN = 3


def _muted(text: str):
    return format_html('<span class="muted">{}</span>', text)


def _version(value: str):
    return format_html('<span class="mono">{}</span>', value) if value else _muted("—")


def run_duration_s(run: DeploymentRun) -> float | None:
    """How long the run took, or has been running; None before it started."""
    if run.started_at is None:
        return None
    end = run.finished_at or (None if run.state in DEPLOYMENT_FINAL_STATES else timezone.now())
    return (end - run.started_at).total_seconds() if end else None


class StackProfileTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong mono nowrap"}})
    os_family = tables.Column(verbose_name="OS", attrs={"td": {"class": "nowrap"}})
    driver_version = tables.Column(verbose_name="Driver")
    cuda_version = tables.Column(verbose_name="CUDA")
    cudnn_version = tables.Column(verbose_name="cuDNN", empty_values=())
    nccl_version = tables.Column(verbose_name="NCCL", empty_values=())
    ofed_version = tables.Column(verbose_name="OFED", empty_values=())
    container_runtime = tables.Column(verbose_name="Runtime", empty_values=())
    dcgm_version = tables.Column(verbose_name="DCGM", empty_values=())
    orchestrator = tables.Column(empty_values=())
    offline_mirror = tables.Column(verbose_name="Offline", empty_values=())
    deployment_count = tables.Column(verbose_name="Runs", default=0,
                                     attrs={"td": {"class": "num"}})
    actions = tables.TemplateColumn(
        template_name="frontend/podsys/stack/profile_actions.html", verbose_name="",
        orderable=False, attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = StackProfile
        fields = ("name", "os_family", "driver_version", "cuda_version", "cudnn_version",
                  "nccl_version", "ofed_version", "container_runtime", "dcgm_version",
                  "orchestrator", "offline_mirror", "deployment_count")
        empty_text = "No stack profiles yet: add one to deploy GPU nodes."
        row_attrs = {"data-profile": lambda record: record.name}

    def render_name(self, record):
        return _link(reverse("frontend:stack-profile-edit", args=[record.name]), record.name)

    def render_os_family(self, record):
        return record.get_os_family_display()

    def render_driver_version(self, value):
        return _version(value)

    def render_cuda_version(self, value):
        return _version(value)

    def render_cudnn_version(self, value):
        return _version(value)

    def render_nccl_version(self, value):
        return _version(value)

    def render_ofed_version(self, value):
        return _version(value)

    def render_container_runtime(self, record):
        toolkit = record.container_toolkit_version
        text = record.get_container_runtime_display()
        return format_html('{} <span class="muted mono">{}</span>', text, toolkit) if toolkit \
            else text

    def render_dcgm_version(self, value):
        return _version(value)

    def render_orchestrator(self, record):
        version = record.orchestrator_version
        text = record.get_orchestrator_display()
        return format_html('{} <span class="muted mono">{}</span>', text, version) if version \
            else text

    def render_offline_mirror(self, value):
        if not value:
            return _muted("No")
        return format_html('<span class="badge badge-info" title="{}">{}</span>', value, "Yes")


class DeploymentRunTable(ConsoleTable):
    id = tables.Column(verbose_name="Run", attrs={"td": {"class": "num mono"}})
    cluster = tables.Column(accessor="cluster__name", verbose_name="Cluster")
    kind = tables.Column()
    profile = tables.Column(accessor="profile__name", verbose_name="Profile", default="—")
    hosts = tables.Column(verbose_name="Nodes", orderable=False, empty_values=())
    state = tables.Column()
    started_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Started", default="—",
                                       attrs={"td": {"class": "nowrap"}})
    took = tables.Column(verbose_name="Duration", orderable=False, empty_values=(),
                         attrs={"td": {"class": "nowrap num"}})
    check_mode = tables.Column(verbose_name="Check mode")
    created_by = tables.Column(accessor="created_by__username", verbose_name="By",
                               default="—")

    class Meta(ConsoleTable.Meta):
        model = DeploymentRun
        fields = ("id", "cluster", "kind", "profile", "hosts", "state", "started_at", "took",
                  "check_mode", "created_by")
        empty_text = "No deployment runs yet."
        row_attrs = {"data-run": lambda record: record.pk}

    def render_id(self, record):
        return _link(reverse("frontend:deployment-run", args=[record.pk]), f"#{record.pk}")

    def render_cluster(self, record):
        return _link(reverse("frontend:cluster", args=[record.cluster.name]), record.cluster.name)

    def render_kind(self, record):
        text = record.get_kind_display()
        if record.rerun_of_id:
            return format_html('{} <span class="muted">(re-run of #{})</span>', text,
                               record.rerun_of_id)
        return text

    def render_profile(self, record):
        if not record.profile_id:
            return _muted("—")
        return _link(reverse("frontend:stack-profile-edit", args=[record.profile.name]),
                     record.profile.name)

    def render_hosts(self, record):
        hosts = list(record.hosts or [])
        shown = format_html_join(", ", '<span class="mono">{}</span>',
                                 ((host,) for host in hosts[:HOSTS_SHOWN]))
        if len(hosts) > HOSTS_SHOWN:
            return format_html('{} <span class="muted">and {} more</span>', shown,
                               len(hosts) - HOSTS_SHOWN)
        return shown or _muted("—")

    def render_state(self, record):
        return deployment_state_badge(record.state)

    def render_took(self, record):
        return duration(run_duration_s(record))

    def render_check_mode(self, value):
        return format_html('<span class="badge badge-info">{}</span>', "Check") if value \
            else _muted("No")


class ClusterUserTable(ConsoleTable):
    username = tables.Column(attrs={"td": {"class": "strong mono"}})
    full_name = tables.Column(verbose_name="Name", default="—")
    uid = tables.Column(verbose_name="UID", attrs={"td": {"class": "num mono"}})
    groups = tables.Column(orderable=False, empty_values=())
    keys = tables.Column(verbose_name="Keys", orderable=False, empty_values=(),
                         attrs={"td": {"class": "num"}})
    is_active = tables.Column(verbose_name="Status")
    pushed_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Pushed",
                                      default="Not yet", attrs={"td": {"class": "nowrap"}})
    actions = tables.TemplateColumn(
        template_name="frontend/podsys/accounts/user_actions.html", verbose_name="",
        orderable=False, attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = ClusterUser
        fields = ("username", "full_name", "uid", "groups", "keys", "is_active", "pushed_at")
        empty_text = "No accounts yet."
        row_attrs = {"data-account": lambda record: record.username,
                     "class": lambda record: "" if record.is_active else "muted"}

    def render_groups(self, record):
        names = [group.name for group in record.groups.all()]
        if record.primary_group_id and record.primary_group.name not in names:
            names.insert(0, record.primary_group.name)
        return ", ".join(names) if names else _muted("—")

    def render_keys(self, record):
        return keys_count(record.ssh_public_keys)

    def render_is_active(self, value):
        return format_html('<span class="badge badge-success">{}</span>', "Active") if value \
            else format_html('<span class="badge badge-muted" title="{}">{}</span>',
                             "Deleted from the nodes at the next push", "Removed")


class ClusterGroupTable(ConsoleTable):
    name = tables.Column(attrs={"td": {"class": "strong mono"}})
    gid = tables.Column(verbose_name="GID", attrs={"td": {"class": "num mono"}})
    member_count = tables.Column(verbose_name="Members", default=0,
                                 attrs={"td": {"class": "num"}})
    is_active = tables.Column(verbose_name="Status")
    actions = tables.TemplateColumn(
        template_name="frontend/podsys/accounts/group_actions.html", verbose_name="",
        orderable=False, attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = ClusterGroup
        fields = ("name", "gid", "member_count", "is_active")
        empty_text = "No groups yet."
        row_attrs = {"data-group": lambda record: record.name}

    def render_is_active(self, value):
        return format_html('<span class="badge badge-success">{}</span>', "Active") if value \
            else format_html('<span class="badge badge-muted" title="{}">{}</span>',
                             "Deleted from the nodes at the next push", "Removed")
