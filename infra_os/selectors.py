"""Reads, always scoped to the caller."""

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from infra_os.access import is_platform_admin, member_tenant_ids, scope_to_user
from infra_os.models import ApiToken, AuditEvent, Membership, Quota, Tenant


def tenant_list(*, user) -> QuerySet[Tenant]:
    """Tenants the user sees, each with its member count and the user's own role in it."""
    my_role = Membership.objects.filter(tenant_id=OuterRef("pk"), user_id=user.pk).values("role")
    queryset = Tenant.objects.select_related("quota").annotate(
        member_count=Count("memberships", distinct=True), my_role=Subquery(my_role[:1])
    )
    return scope_to_user(queryset, user, tenant_field="pk")


def membership_list(*, user) -> QuerySet[Membership]:
    return scope_to_user(Membership.objects.select_related("tenant", "user"), user)


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
