from django.core.exceptions import ValidationError
from django.db import models

from infra_os.models import Tenant
from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel
from podsys.choices import PoolNodeState, ScaleEventKind


class Fleet(TimeStampedModel):
    """Clusters whose queues a dispatcher shares out: a fleet queue's jobs go to one of them."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator],
                            error_messages={"unique": "A fleet with this name already exists."})
    display_name = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name


class ElasticPool(TimeStampedModel):
    """Nodes bought from a capacity provider when a fleet's work fits nowhere; they join
    `cluster` and go back when empty for the cool-down."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=63, validators=[slug_validator])
    cluster = models.ForeignKey("podsys.Cluster", on_delete=models.PROTECT,
                                related_name="pools", help_text="The cluster its nodes join.")
    provider = models.CharField(max_length=200,
                                help_text="Dotted path of a podsys.providers class.")
    provider_options = models.JSONField(default=dict, blank=True)
    node_type = models.CharField(max_length=63)
    max_nodes = models.PositiveIntegerField(default=0)
    # Spend allowed per calendar month (0: no limit), in the pricing plans' currency.
    max_spend_per_month = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    cool_down_s = models.PositiveIntegerField(default=600)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["fleet__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["fleet", "name"], name="pool_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.fleet.name}/{self.name}"

    def clean(self) -> None:
        if self.cluster_id and self.fleet_id and self.cluster.fleet_id != self.fleet_id:
            raise ValidationError({"cluster": "The pool's nodes must join a cluster of its fleet."})


class PoolBudget(models.Model):
    """What one tenant's work may buy from a pool (0: no limit beyond the pool's own)."""

    pool = models.ForeignKey(ElasticPool, on_delete=models.CASCADE, related_name="budgets")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="pool_budgets")
    max_nodes = models.PositiveIntegerField(default=0)
    max_spend_per_month = models.DecimalField(max_digits=12, decimal_places=2, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "tenant"], name="pool_budget_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.pool}: {self.tenant}"


class NodeRequest(models.Model):
    """One provisioning request: all the nodes of a gang (and the small jobs riding along), asked
    for at once; its jobs are admitted once every node is ready."""

    pool = models.ForeignKey(ElasticPool, on_delete=models.CASCADE, related_name="requests")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="node_requests")
    request_id = models.CharField(max_length=63, unique=True)
    jobs = models.JSONField(default=list)  # the ids of the jobs it is for
    nodes = models.PositiveIntegerField()
    tries = models.PositiveIntegerField(default=1)
    retry_at = models.DateTimeField(null=True, blank=True)
    failed = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.request_id


class PoolNode(models.Model):
    """A node bought from the pool's provider, from its request until it is returned."""

    pool = models.ForeignKey(ElasticPool, on_delete=models.CASCADE, related_name="nodes")
    request = models.ForeignKey(NodeRequest, null=True, on_delete=models.SET_NULL,
                                related_name="pool_nodes")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="pool_nodes")
    name = models.CharField(max_length=253)  # its node name in the cluster (once it joined)
    # The provider's id for it, where that is not its node name (blank: `name`).
    provider_id = models.CharField(max_length=253, blank=True)
    state = models.CharField(max_length=16, choices=PoolNodeState.choices,
                             default=PoolNodeState.BOOTING)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    # The jobs it was bought for while they wait: no other work is placed on it.
    claims = models.JSONField(default=list, blank=True)
    requested_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True, blank=True)
    empty_since = models.DateTimeField(null=True, blank=True)
    returned_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["pool_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="pool_node_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name


class ScaleEvent(models.Model):
    """A decision of the pool's autoscaler, in words: the console's event list."""

    pool = models.ForeignKey(ElasticPool, on_delete=models.CASCADE, related_name="events")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="scale_events")
    kind = models.CharField(max_length=16, choices=ScaleEventKind.choices)
    nodes = models.PositiveIntegerField(default=0)
    reason = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pool} {self.kind}: {self.reason}"
