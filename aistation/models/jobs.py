from django.conf import settings
from django.db import models

from aistation.choices import AttemptState, JobState
from aistation.models.queues import Queue
from infra_os.models import Tenant
from ogai.models import TimeStampedModel
from podsys.models import Cluster


class Job(TimeStampedModel):
    """A unit of work: a command run as `replicas` processes (a gang), started all at once or not
    at all, retried up to `max_restarts` times. Every state change is a JobEvent."""

    # Tenant and cluster are looked up with a state: the two indexes below serve both, and every
    # index more costs each submission and each change of state.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs",
                               db_index=False)
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs",
                                db_index=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                              related_name="jobs")
    name = models.CharField(max_length=100)
    priority = models.IntegerField(default=0)

    image = models.CharField(max_length=500, blank=True)
    # The named environment its command runs in, where the cluster offers several (a local
    # cluster's Python environments, a Kubernetes cluster's named images); blank: the
    # cluster's default.
    environment = models.CharField(max_length=100, blank=True)
    # The working folder shipped with it, unpacked as its processes' working directory.
    workdir = models.ForeignKey("aistation.Workdir", null=True, blank=True,
                                on_delete=models.PROTECT, related_name="jobs")
    command = models.JSONField()
    env = models.JSONField(default=dict, blank=True)
    gpus_per_replica = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    cpu_per_replica = models.FloatField(default=1.0)
    memory_mib_per_replica = models.PositiveIntegerField(default=1024)
    # Its network (`network: {attachments, rdma}`): RDMA devices each replica holds on its node
    # (counted like GPUs), and the cluster's extra networks each replica attaches, in order.
    rdma_per_replica = models.PositiveIntegerField(default=0)
    networks = models.JSONField(default=list, blank=True)
    replicas = models.PositiveIntegerField(default=1)
    # A Ray cluster (`kind: ray`): {"workers": N, "head": {gpus, cpu, memory_mib}, "worker":
    # {…}, "dashboard": bool}; its replicas are the head and the N workers, and `command` is
    # its entrypoint. Null for any other job.
    ray = models.JSONField(null=True, blank=True)
    max_restarts = models.PositiveIntegerField(default=0)
    time_limit_s = models.PositiveIntegerField(null=True, blank=True)
    # A service runs until stopped and answers on `ports` (a notebook, a model server).
    service = models.BooleanField(default=False)
    ports = models.JSONField(default=list, blank=True)
    # Environment the job's processes get but no page or API shows (tokens), encrypted with
    # `ogai.crypto` as a JSON object.
    secret_env = models.TextField(blank=True, editable=False)
    # Folders of the data directory the job's processes see besides their own run and
    # checkpoint folders ([{"path": ..., "read_only": ...}]): set by the platform's services for
    # the datasets, models and run folders a toolchain step names, never taken from a request.
    mounts = models.JSONField(default=list, blank=True, editable=False)
    # Labels its workloads carry on their cluster besides the platform's own (a role such as
    # `ogai.io/role: model-server`): set by the platform's services, never from a request.
    labels = models.JSONField(default=dict, blank=True, editable=False)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    reason = models.TextField(blank=True)
    # A fleet queue's job: where the dispatcher sent it and why, or why no cluster takes it.
    dispatch = models.TextField(blank=True)
    position = models.PositiveIntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    excluded_nodes = models.JSONField(default=list, blank=True)
    attained_gpu_s = models.FloatField(default=0)
    # Seconds waited before the current wait (queued_at: when it began) or the current attempt.
    waited_s = models.FloatField(default=0)
    # The current attempt's nodes (one per replica) while admitted or running.
    placement = models.JSONField(default=list, blank=True)
    # Nodes its cluster's last cycle drained for it while queued (the starvation bound): one
    # such job per queue across a fleet, so other clusters' cycles read it.
    reserved_nodes = models.JSONField(default=list, blank=True)
    borrowed = models.BooleanField(default=False)
    attempt_count = models.PositiveIntegerField(default=0)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    rerun_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="reruns")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "state"]),
            models.Index(fields=["tenant", "state"]),
            models.Index(fields=["state"], name="job_state"),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(replicas__gte=1),
                                   name="job_at_least_one_replica"),
            models.CheckConstraint(condition=models.Q(cpu_per_replica__gt=0),
                                   name="job_cpu_positive"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def network(self) -> dict:
        """Its network as the API shows it: {"attachments": [...], "rdma": N}."""
        return {"attachments": list(self.networks), "rdma": self.rdma_per_replica}


class Attempt(models.Model):
    """One start of a job on a cluster: its placement, its end and why it ended."""

    # Indexed by the (job, number) and (cluster, state) pairs below.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts",
                            db_index=False)
    number = models.PositiveIntegerField()
    workload_id = models.CharField(max_length=63, unique=True)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="attempts",
                                db_index=False)
    placement = models.JSONField(default=list)
    borrowed = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=AttemptState.choices,
                             default=AttemptState.LAUNCHING)
    launched = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # Every replica's output is in the log store (set once the attempt has ended and its
    # logs were read to their end): the shipper stops reading it.
    logs_shipped = models.BooleanField(default=False)

    class Meta:
        ordering = ["job_id", "number"]
        indexes = [
            models.Index(fields=["cluster", "state"], name="attempt_cluster_state"),
            models.Index(fields=["state"], name="attempt_state"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number}"


class JobEvent(models.Model):
    """One transition of a job, with a reason a person can read."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state or '-'} → {self.to_state}"
