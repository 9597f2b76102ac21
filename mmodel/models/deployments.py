from django.conf import settings
from django.db import models

from aistation.models import Job, Queue
from infra_os.models import Tenant
from mmodel.choices import Runtime
from mmodel.models.registry import ModelVersion, model_name
from ogai.models import TimeStampedModel


class Deployment(TimeStampedModel):
    """A version answering OpenAI-compatible requests at the gateway under `name`: each replica
    is a service job in `queue` (quota and GPUs like any job)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=100, validators=[model_name],
                            help_text="The model name clients send to /v1/.")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT,
                                related_name="deployments")
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="deployments")
    runtime = models.CharField(max_length=16, choices=Runtime.choices,
                               default=Runtime.TRANSFORMERS)
    replicas = models.PositiveIntegerField(default=1)
    gpus_per_replica = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    cpu_per_replica = models.FloatField(default=2.0)
    memory_mib_per_replica = models.PositiveIntegerField(default=4096)
    # 0: never scaled to zero.
    idle_timeout_s = models.PositiveIntegerField(default=0)
    # Wanted running (False: stopped by a user); scaled_to_zero: stopped for idleness, started
    # again by the next request.
    active = models.BooleanField(default=True)
    scaled_to_zero = models.BooleanField(default=False)
    last_request_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    # The key its replicas' servers require (`Authorization: Bearer`), encrypted with
    # `ogai.crypto`: only the gateway and the platform's evaluation runner send it, so nothing
    # reaches a replica around the gateway's roles, limits and usage. Shown nowhere.
    api_key = models.TextField(blank=True, editable=False)
    # A pool (one with members): the whole models' weights one replica holds at once (the
    # least recently used is evicted for another), and the LoRA adapters it holds at once.
    pool_memory_mib = models.PositiveIntegerField(default=0)
    max_loras = models.PositiveIntegerField(default=8)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="deployment_unique_name"),
            models.CheckConstraint(condition=models.Q(replicas__gte=1),
                                   name="deployment_at_least_one_replica"),
        ]

    def __str__(self) -> str:
        return self.name


class DeploymentMember(models.Model):
    """Another version a pool deployment serves, under its own model name: a LoRA adapter of
    the deployment's version (applied on the replica's one copy of that base), or a whole
    model (loaded by demand within the pool's memory budget)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="members")
    name = models.CharField(max_length=100, validators=[model_name],
                            help_text="The model name clients send to /v1/.")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT,
                                related_name="pool_memberships")

    class Meta:
        ordering = ["deployment", "name"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "name"], name="member_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} in {self.deployment}"


class DeploymentReplica(models.Model):
    """One model server: its current job, and whether its health endpoint answered."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE,
                                   related_name="replica_set")
    index = models.PositiveIntegerField()
    job = models.OneToOneField(Job, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="deployment_replica")
    # "http://host:port" of the server while its job runs, as the cluster gave it for the
    # attempt `workload_id` (a restarted job's new attempt may answer elsewhere); the model
    # name it expects.
    upstream = models.CharField(max_length=500, blank=True)
    workload_id = models.CharField(max_length=63, blank=True)
    served_model = models.CharField(max_length=1000, blank=True)
    ready = models.BooleanField(default=False)
    ready_since = models.DateTimeField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)
    # New jobs the platform submitted for it since it last was ready (a job that ended for good
    # is replaced); past a few it stops trying and the replica is `failed` until started again.
    resubmits = models.PositiveIntegerField(default=0)
    failed = models.BooleanField(default=False)
    # Since when its running job's server has not answered /health (None: it answers, or its
    # job is not running), and whether it answered in this attempt at all: past a grace (a
    # start timeout while it never did) the watch replaces its job.
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    answered = models.BooleanField(default=False)
    # A pool's replica: the model names it held at its last health check.
    holds = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["deployment", "index"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "index"], name="replica_unique_index"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment} replica {self.index}"


class DeploymentStat(models.Model):
    """Requests through the gateway to one deployment in one minute (written in batches by the
    gateway); latencies in a histogram of fixed millisecond buckets for percentiles."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="stats")
    minute = models.DateTimeField()
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0)
    latency_buckets = models.JSONField(default=list, blank=True)
    # Requests that waited for a replica to start (scaled to zero, or starting), and the
    # longest wait.
    cold_starts = models.PositiveIntegerField(default=0)
    cold_start_ms_max = models.FloatField(default=0)

    class Meta:
        ordering = ["deployment", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "minute"], name="stat_once_a_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id} at {self.minute:%Y-%m-%d %H:%M}: {self.requests} requests"


class GatewayLimit(models.Model):
    """A tenant's rate limits at the gateway, per minute; empty: the platform's defaults."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="gateway_limit")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    token_requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Per API token.")
    token_tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Per API token.")

    def __str__(self) -> str:
        return f"gateway limits of tenant {self.tenant_id}"
