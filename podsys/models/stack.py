"""Software-stack profiles and the Ansible runs that deploy them (or push accounts) to nodes."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel
from podsys.choices import (
    ContainerRuntime,
    DeploymentKind,
    DeploymentState,
    Orchestrator,
    OsFamily,
    TaskStatus,
)
from podsys.models.clusters import Cluster


class StackProfile(TimeStampedModel):
    """The versions a GPU node runs, checked against the compatibility matrix on save."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator],
                            error_messages={"unique": "A profile with this name already exists."})
    description = models.CharField(max_length=200, blank=True)
    os_family = models.CharField(max_length=16, choices=OsFamily.choices,
                                 default=OsFamily.UBUNTU_2204)
    driver_version = models.CharField(max_length=32, help_text="NVIDIA driver, e.g. 550.127.05")
    cuda_version = models.CharField(max_length=16, help_text="CUDA toolkit, e.g. 12.4")
    cudnn_version = models.CharField(max_length=16, blank=True)
    nccl_version = models.CharField(max_length=16, blank=True)
    # Blank: no InfiniBand/RoCE stack on these nodes.
    ofed_version = models.CharField(max_length=32, blank=True,
                                    help_text="MLNX OFED / DOCA OFED, e.g. 24.10-1.1.4.0")
    container_runtime = models.CharField(max_length=16, choices=ContainerRuntime.choices,
                                         default=ContainerRuntime.CONTAINERD)
    container_toolkit_version = models.CharField(max_length=16, blank=True,
                                                 help_text="NVIDIA container toolkit")
    dcgm_version = models.CharField(max_length=16, blank=True)
    orchestrator = models.CharField(max_length=16, choices=Orchestrator.choices,
                                    default=Orchestrator.KUBERNETES)
    # Kubernetes (kubelet, kubeadm) or Slurm version, by `orchestrator`.
    orchestrator_version = models.CharField(max_length=16, blank=True)
    # A local package mirror (a path on the nodes or an http(s) URL inside the site): set, every
    # package comes from it and nothing is fetched from the internet.
    offline_mirror = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from podsys.compat import profile_problems

        problems = profile_problems(self)
        if problems:
            raise ValidationError(problems)


class DeploymentRun(TimeStampedModel):
    """One `ansible-runner` run of a shipped playbook against some nodes of a cluster."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="deployments")
    kind = models.CharField(max_length=16, choices=DeploymentKind.choices)
    profile = models.ForeignKey(StackProfile, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="deployments")
    playbook = models.CharField(max_length=100)
    hosts = models.JSONField(default=list, help_text="Node names, in inventory order.")
    # Ansible's check mode: report what would change, change nothing.
    check_mode = models.BooleanField(default=False)
    # The variables given to the playbook (never secrets).
    extra_vars = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=DeploymentState.choices,
                             default=DeploymentState.QUEUED)
    rerun_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="reruns")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # ansible-runner's status and return code, and its play recap per host.
    rc = models.IntegerField(null=True, blank=True)
    stats = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} run {self.pk} on {self.cluster.name}"


class DeploymentTaskResult(models.Model):
    """One task on one host, as the run's event stream reported it."""

    run = models.ForeignKey(DeploymentRun, on_delete=models.CASCADE, related_name="results")
    host = models.CharField(max_length=253)
    # The task's order in the run (its first start), for the per-node grid's columns.
    position = models.PositiveIntegerField()
    play = models.CharField(max_length=200, blank=True)
    role = models.CharField(max_length=100, blank=True)
    task = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=TaskStatus.choices,
                              default=TaskStatus.RUNNING)
    changed = models.BooleanField(default=False)
    # What the task said: its msg, stdout/stderr (tail), rc, for failures above all.
    output = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["run", "position", "host"]
        constraints = [
            models.UniqueConstraint(fields=["run", "host", "position"],
                                    name="deployment_task_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.host}: {self.task} ({self.status})"
