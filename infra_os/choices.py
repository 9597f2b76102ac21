from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# Roles allowed to change a tenant's resources; a viewer only reads.
WRITE_ROLES = frozenset({Role.ADMIN, Role.MEMBER})
ADMIN_ROLES = frozenset({Role.ADMIN})
# Roles whose tokens (and sessions) may call the tenant's deployed models at the gateway and in
# the playground: a call spends the tenant's token budget, so a viewer, who only reads, may not.
MODEL_CALL_ROLES = frozenset({Role.ADMIN, Role.MEMBER})


class ServerState(models.TextChoices):
    """Where a bare-metal server is in its life; its use (lease, cluster) is `ServerAllocation`."""

    REGISTERED = "registered", "Registered"
    PROVISIONING = "provisioning", "Provisioning"
    PROVISIONED = "provisioned", "Provisioned"
    FAILED = "failed", "Provisioning failed"
    RETIRED = "retired", "Retired"


class ServerAllocation(models.TextChoices):
    FREE = "free", "Free"
    CLUSTER = "cluster", "Cluster node"


class PowerAction(models.TextChoices):
    ON = "on", "Power on"
    OFF = "off", "Power off (forced)"
    SHUTDOWN = "shutdown", "Shut down (graceful)"
    CYCLE = "cycle", "Power cycle"


class BootMethod(models.TextChoices):
    PXE = "pxe", "Network boot (PXE)"
    VIRTUAL_MEDIA = "virtual_media", "Virtual media from the image URL"


class BatchState(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    PARTIAL = "partial", "Finished with failures"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class RunState(models.TextChoices):
    WAITING = "waiting", "Waiting for a slot"
    PREPARING = "preparing", "Setting boot"
    REBOOTING = "rebooting", "Power cycling"
    AWAITING_CALLBACK = "awaiting_callback", "Waiting for first boot"
    PROVISIONED = "provisioned", "Provisioned"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A run in one of these states is being driven; a server has at most one.
ACTIVE_RUN_STATES = (RunState.WAITING, RunState.PREPARING, RunState.REBOOTING,
                     RunState.AWAITING_CALLBACK)
# States whose run holds one of its batch's concurrency slots.
BUSY_RUN_STATES = (RunState.PREPARING, RunState.REBOOTING, RunState.AWAITING_CALLBACK)


class LeaseState(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"
    ACTIVE = "active", "Active"
    ENDED = "ended", "Ended"
    CANCELLED = "cancelled", "Cancelled"


LIVE_LEASE_STATES = (LeaseState.SCHEDULED, LeaseState.ACTIVE)


class RatedResource(models.TextChoices):
    """What a price applies to. `match` on a rate narrows it to one GPU model (or, for tokens,
    one model name); a rate with an empty match applies to the rest."""

    GPU_HOUR = "gpu_hour", "GPU-hour"
    SERVER_HOUR = "server_hour", "Server-hour (lease)"
    MILLION_TOKENS = "million_tokens", "Million tokens"
    RESERVED_GPU_MONTH = "reserved_gpu_month", "Reserved GPU-month"


class InvoiceState(models.TextChoices):
    DRAFT = "draft", "Draft"
    CLOSED = "closed", "Closed"


class InvitationState(models.TextChoices):
    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    REVOKED = "revoked", "Revoked"
    EXPIRED = "expired", "Expired"
