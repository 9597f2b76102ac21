"""Reads, always scoped to the caller."""

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum
from django.utils import timezone

from infra_os.access import is_platform_admin, member_tenant_ids, scope_to_user
from infra_os.choices import (
    LIVE_LEASE_STATES,
    InvitationState,
    Role,
    RunState,
    ServerAllocation,
    ServerState,
)
from infra_os.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Lease,
    Membership,
    ProvisioningBatch,
    ProvisioningProfile,
    ProvisioningRun,
    Quota,
    Rack,
    Server,
    Tenant,
)


def tenant_list(*, user) -> QuerySet[Tenant]:
    """Tenants the user sees, each with its member count and the user's own role in it."""
    my_role = Membership.objects.filter(tenant_id=OuterRef("pk"), user_id=user.pk).values("role")
    queryset = Tenant.objects.select_related("quota").annotate(
        member_count=Count("memberships", distinct=True), my_role=Subquery(my_role[:1])
    )
    return scope_to_user(queryset, user, tenant_field="pk")


def membership_list(*, user) -> QuerySet[Membership]:
    return scope_to_user(Membership.objects.select_related("tenant", "user"), user)


def invitation_list(*, user) -> QuerySet[Invitation]:
    """Invitations addressed to the user, and those of the tenants the user is a tenant admin
    of (platform admins: all). A tenant's members and viewers do not see its invitations."""
    queryset = Invitation.objects.select_related("tenant", "invited_by")
    if is_platform_admin(user):
        return queryset
    if not user.is_authenticated:
        return queryset.none()
    admin_of = Membership.objects.filter(user=user, role=Role.ADMIN, tenant__is_active=True) \
        .values("tenant_id")
    return queryset.filter(Q(username=user.get_username()) | Q(tenant_id__in=admin_of))


def invitation_inbox(*, user) -> QuerySet[Invitation]:
    """Invitations addressed to the user alone: the only ones the user may accept or decline,
    platform admins included."""
    if not user.is_authenticated:
        return Invitation.objects.none()
    return Invitation.objects.select_related("tenant", "invited_by") \
        .filter(username=user.get_username())


def pending_invitations(*, user) -> QuerySet[Invitation]:
    """The user's invitations still waiting for an answer."""
    return invitation_inbox(user=user).filter(state=InvitationState.PENDING,
                                              expires_at__gt=timezone.now())


def quota_list(*, user) -> QuerySet[Quota]:
    return scope_to_user(Quota.objects.select_related("tenant"), user)


def api_token_list(*, user) -> QuerySet[ApiToken]:
    """A user's own tokens; platform admins see every token (never a secret)."""
    queryset = ApiToken.objects.select_related("user")
    if is_platform_admin(user):
        return queryset
    return queryset.filter(user_id=user.pk) if user.is_authenticated else queryset.none()


def audit_event_list(*, user) -> QuerySet[AuditEvent]:
    """Events of the caller's tenants, and the caller's own events that belong to no tenant."""
    queryset = AuditEvent.objects.select_related("actor", "tenant")
    if is_platform_admin(user):
        return queryset
    if not user.is_authenticated:
        return queryset.none()
    return queryset.filter(
        Q(tenant_id__in=member_tenant_ids(user)) | Q(tenant__isnull=True, actor_id=user.pk)
    )


def tenants_for_switcher(*, user) -> QuerySet[Tenant]:
    return scope_to_user(Tenant.objects.filter(is_active=True), user, tenant_field="pk")


def user_memberships(*, user) -> QuerySet[Membership]:
    return Membership.objects.filter(user_id=user.pk).select_related("tenant")


def tenant_counts(*, user, tenant: Tenant) -> dict[str, int]:
    """The dashboard's numbers for one tenant the user sees."""
    quota = quota_list(user=user).filter(tenant=tenant).first()
    return {
        "members": membership_list(user=user).filter(tenant=tenant).count(),
        "quota_gpus": quota.gpus if quota else 0,
        "quota_cpu_cores": quota.cpu_cores if quota else 0,
        "quota_memory_gib": quota.memory_gib if quota else 0,
        "quota_storage_gib": quota.storage_gib if quota else 0,
        "active_tokens": ApiToken.objects.filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()),
            user_id=user.pk,
            revoked_at__isnull=True,
        ).count(),
    }


# -- server leases ---------------------------------------------------------------------------


def lease_list(*, user) -> QuerySet[Lease]:
    """Leases of the caller's tenants (platform admins: all)."""
    return scope_to_user(Lease.objects.select_related("server", "tenant", "created_by"), user)


def leasable_server_list(*, user) -> QuerySet[Server]:
    """Servers a platform admin may lease now: provisioned and not a cluster node (an overlap
    with another lease is told when the lease is created)."""
    if not is_platform_admin(user):
        return Server.objects.none()
    return Server.objects.filter(state=ServerState.PROVISIONED, allocation=ServerAllocation.FREE)


def leased_gpus_by_tenant(*, tenant_ids, at) -> dict[int, int]:
    """{tenant id: GPUs of its leases in force at `at`} (tenants without any are left out).
    A lease is in force from its start to its end whatever the sweep has marked yet, so a late
    sweep never lends a leased GPU to a job."""
    return dict(
        Lease.objects.filter(tenant_id__in=tenant_ids, state__in=LIVE_LEASE_STATES,
                             starts_at__lte=at, ends_at__gt=at, gpus__gt=0)
        .values("tenant_id").annotate(gpus=Sum("gpus")).values_list("tenant_id", "gpus")
    )


def _platform_admins_only(queryset: QuerySet, user) -> QuerySet:
    """Servers, racks and provisioning are the operator's: others see none (a 404)."""
    return queryset if is_platform_admin(user) else queryset.none()


def server_list(*, user) -> QuerySet[Server]:
    """Servers with their rack, BMC, the state of their newest provisioning run and the
    tenant of their live lease, if any."""
    newest_run = ProvisioningRun.objects.filter(server_id=OuterRef("pk")).order_by("-pk")
    live_lease = Lease.objects.filter(server_id=OuterRef("pk"), state__in=LIVE_LEASE_STATES) \
        .order_by("starts_at")
    queryset = Server.objects.select_related("rack", "bmc").annotate(
        provisioning_state=Subquery(newest_run.values("state")[:1]),
        provisioning_batch_id=Subquery(newest_run.values("batch_id")[:1]),
        leased_to=Subquery(live_lease.values("tenant__name")[:1]),
    )
    return _platform_admins_only(queryset, user)


def rack_list(*, user) -> QuerySet[Rack]:
    return _platform_admins_only(Rack.objects.annotate(server_count=Count("servers")), user)


def provisioning_profile_list(*, user) -> QuerySet[ProvisioningProfile]:
    return _platform_admins_only(ProvisioningProfile.objects.all(), user)


def provisioning_batch_list(*, user) -> QuerySet[ProvisioningBatch]:
    """Batches with their runs counted by state."""
    counts = {f"runs_{state}": Count("runs", filter=Q(runs__state=state))
              for state in RunState.values}
    queryset = ProvisioningBatch.objects.select_related("profile", "created_by") \
        .annotate(runs_total=Count("runs"), **counts)
    return _platform_admins_only(queryset, user)


def provisioning_run_list(*, user) -> QuerySet[ProvisioningRun]:
    return _platform_admins_only(ProvisioningRun.objects.select_related("server", "batch"), user)
