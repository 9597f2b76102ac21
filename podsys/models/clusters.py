from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from infra_os.models import Tenant
from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel
from podsys.choices import CordonSource, NodeHealth


class Cluster(TimeStampedModel):
    """Where work runs, through one driver. A cluster without a tenant is shared by all."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[slug_validator],
        error_messages={"unique": "A cluster with this name already exists."},
    )
    display_name = models.CharField(max_length=200, blank=True)
    driver = models.CharField(max_length=64, help_text="A key of OGAI_CLUSTER_DRIVERS.")
    options = models.JSONField(default=dict, blank=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="clusters"
    )
    is_active = models.BooleanField(default=True)
    # The fleet whose queues may dispatch work here; none: only its own queues.
    fleet = models.ForeignKey("podsys.Fleet", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="clusters")
    last_synced_at = models.DateTimeField(null=True, blank=True)
    sync_error = models.TextField(blank=True)
    # What its nodes add up to, as of the last sync (see `cluster_sync_nodes`): submissions
    # check a job against it without reading every node.
    capacity = models.JSONField(default=dict, blank=True, editable=False)
    # When the last scheduling cycle looked at its jobs: a cycle asked for before then has
    # nothing left to see and is skipped.
    cycle_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The driver's credentials (a kubeconfig), encrypted with `ogai.crypto`: never shown again,
    # never logged; `podsys.runtime` hands them to the driver.
    credentials = models.TextField(blank=True, editable=False)
    # Scheduling cycles run on this cluster and their time (for `/metrics`): written by the
    # cycle itself, read at scrape time, so every process reports the same figures.
    cycles_total = models.PositiveBigIntegerField(default=0, editable=False)
    cycle_seconds_total = models.FloatField(default=0, editable=False)
    cycle_seconds_last = models.FloatField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name

    def clean(self) -> None:
        if self.driver not in settings.OGAI_CLUSTER_DRIVERS:
            known = ", ".join(sorted(settings.OGAI_CLUSTER_DRIVERS))
            raise ValidationError(
                {"driver": f"Unknown driver {self.driver!r}; use one of {known}."}
            )
        if not isinstance(self.options, dict):
            raise ValidationError({"options": "Give the driver's options as an object."})


class Node(TimeStampedModel):
    """A machine of a cluster, as its driver last reported it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    cpu_cores = models.FloatField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    health = models.CharField(max_length=16, choices=NodeHealth.choices, default=NodeHealth.HEALTHY)
    health_reason = models.TextField(blank=True)
    # Cordoned by an operator or a failed health check: running work stays, nothing new comes.
    schedulable = models.BooleanField(default=True)
    cordon_source = models.CharField(max_length=16, choices=CordonSource.choices, blank=True,
                                     default=CordonSource.NONE)
    # Where Ansible and a metrics scrape reach it (an IP or DNS name); blank: its name.
    address = models.CharField(max_length=253, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    taints = models.JSONField(default=list, blank=True)  # "key=value:Effect", as reported
    # GPUs held by anything on it where the cluster reports that (Kubernetes: every pod's GPU
    # limits, other users' included); None where only the platform places work.
    gpus_in_use = models.PositiveIntegerField(null=True, blank=True)
    # Of those, held by work the platform did not start (a user's own `sbatch`), where the
    # driver tells them apart; the scheduler places around them.
    gpus_foreign = models.PositiveIntegerField(null=True, blank=True)
    # RDMA devices it offers jobs (the cluster's RDMA resource: an InfiniBand/RoCE HCA's shared
    # device or SR-IOV functions), and those held by anything where the cluster reports it.
    rdma_devices = models.PositiveIntegerField(default=0)
    rdma_in_use = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cluster.name})"

    @property
    def takes_work(self) -> bool:
        return self.schedulable and self.health == NodeHealth.HEALTHY
