from django.db import models


class NodeHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    NOT_READY = "not_ready", "Not ready"
    LOST = "lost", "Lost"


class CordonSource(models.TextChoices):
    """Who took a node out of service: a health check's cordon is lifted by that check passing
    again; an operator's only by an operator."""

    NONE = "", "In service"
    OPERATOR = "operator", "Operator"
    HEALTH_CHECK = "health_check", "Health check"
    # Held out of the scheduler's hands while a check that needs every GPU of the node runs;
    # back in service when it ends (unless it failed).
    CHECK_RUNNING = "check_running", "Exclusive health check running"


class OsFamily(models.TextChoices):
    UBUNTU_2204 = "ubuntu22.04", "Ubuntu 22.04"
    UBUNTU_2404 = "ubuntu24.04", "Ubuntu 24.04"
    RHEL_9 = "rhel9", "RHEL / Rocky 9"


class ContainerRuntime(models.TextChoices):
    CONTAINERD = "containerd", "containerd"
    DOCKER = "docker", "Docker"


class Orchestrator(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes node"
    SLURM = "slurm", "Slurm node"
    NONE = "none", "None (bare nodes)"


class DeploymentKind(models.TextChoices):
    STACK = "stack", "Software stack"
    ACCOUNTS = "accounts", "User accounts"


class DeploymentState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


DEPLOYMENT_FINAL_STATES = (DeploymentState.SUCCEEDED, DeploymentState.FAILED,
                           DeploymentState.CANCELLED)


class TaskStatus(models.TextChoices):
    RUNNING = "running", "Running"
    OK = "ok", "OK"
    CHANGED = "changed", "Changed"
    SKIPPED = "skipped", "Skipped"
    FAILED = "failed", "Failed"
    UNREACHABLE = "unreachable", "Unreachable"


class CheckSeverity(models.TextChoices):
    FATAL = "fatal", "Fatal (cordons the node)"
    WARNING = "warning", "Warning"


class CheckTrigger(models.TextChoices):
    SCHEDULE = "schedule", "Schedule"
    MANUAL = "manual", "On demand"


class CheckState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    # The check could not be carried out (launch refused, no result): says nothing of the node.
    ERROR = "error", "Error"


class PoolNodeState(models.TextChoices):
    BOOTING = "booting", "Booting"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    RETURNED = "returned", "Returned"


class ScaleEventKind(models.TextChoices):
    UP = "up", "Scale up"
    DOWN = "down", "Scale down"
    FAILED = "failed", "Request failed"
    REFUSED = "refused", "Refused (budget)"
