"""Filters shared by the API and the console."""

import django_filters
from django.core.validators import RegexValidator
from django.db.models import Q
from django.utils import timezone

from infra_os.choices import (
    BatchState,
    InvitationState,
    InvoiceState,
    LeaseState,
    Role,
    ServerState,
)
from infra_os.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Invoice,
    Lease,
    Membership,
    ProvisioningBatch,
    Quota,
    Reservation,
    Server,
    Tenant,
)
from ogai.filters import FilterSet


class TenantFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")

    class Meta:
        model = Tenant
        fields = ["q", "is_active"]

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(name__icontains=value) | Q(display_name__icontains=value)
            | Q(description__icontains=value)
        )


class MembershipFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    role = django_filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["q", "tenant", "role"]

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(user__username__icontains=value) | Q(user__email__icontains=value)
            | Q(user__first_name__icontains=value) | Q(user__last_name__icontains=value)
        )


class QuotaFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")

    class Meta:
        model = Quota
        fields = ["tenant"]


class ApiTokenFilterSet(FilterSet):
    STATES = (("active", "Active"), ("expired", "Expired"), ("revoked", "Revoked"))
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name")
    state = django_filters.ChoiceFilter(choices=STATES, method="by_state", label="State")

    class Meta:
        model = ApiToken
        fields = ["q", "state"]

    def by_state(self, queryset, name, value):
        now = timezone.now()
        live = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        if value == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if value == "expired":
            return queryset.filter(revoked_at__isnull=True, expires_at__lte=now)
        return queryset.filter(live, revoked_at__isnull=True)


class InvitationFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    username = django_filters.CharFilter(label="Username")
    state = django_filters.ChoiceFilter(choices=InvitationState.choices, method="by_state",
                                        label="State")

    class Meta:
        model = Invitation
        fields = ["tenant", "username", "state"]

    def by_state(self, queryset, name, value):
        # "expired" covers pending invitations past their time, as the answer shows them.
        now = timezone.now()
        pending = Q(state=InvitationState.PENDING)
        if value == InvitationState.PENDING:
            return queryset.filter(pending, expires_at__gt=now)
        if value == InvitationState.EXPIRED:
            return queryset.filter(Q(state=value) | pending & Q(expires_at__lte=now))
        return queryset.filter(state=value)


class AuditEventFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    tenant = django_filters.CharFilter(field_name="tenant_name", label="Tenant")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_name", label="Actor")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["q", "tenant", "action", "actor", "since", "until"]

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(action__icontains=value) | Q(object_repr__icontains=value)
            | Q(actor_name__icontains=value)
        )


class LeaseFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    server = django_filters.CharFilter(field_name="server__name", label="Server")
    state = django_filters.ChoiceFilter(choices=LeaseState.choices)

    class Meta:
        model = Lease
        fields = ["tenant", "server", "state"]


class ServerFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    rack = django_filters.CharFilter(field_name="rack__name", label="Rack")
    state = django_filters.ChoiceFilter(choices=ServerState.choices)
    power_state = django_filters.CharFilter(label="Power")
    mismatch = django_filters.BooleanFilter(method="has_mismatch", label="Mismatch")

    class Meta:
        model = Server
        fields = ["q", "rack", "state", "allocation", "power_state", "mismatch"]

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(name__icontains=value) | Q(description__icontains=value)
            | Q(gpu_model__icontains=value) | Q(bmc__address__icontains=value)
        )

    def has_mismatch(self, queryset, name, value):
        return queryset.exclude(mismatches=[]) if value else queryset.filter(mismatches=[])


class ProvisioningBatchFilterSet(FilterSet):
    state = django_filters.ChoiceFilter(choices=BatchState.choices)

    class Meta:
        model = ProvisioningBatch
        fields = ["state"]

month_validator = RegexValidator(r"^\d{4}-(0[1-9]|1[0-2])$",
                                 "Give a month as YYYY-MM, e.g. 2026-10.")


class InvoiceFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    month = django_filters.CharFilter(method="by_month", label="Month",
                                      validators=[month_validator],
                                      help_text="YYYY-MM, e.g. 2026-10")
    state = django_filters.ChoiceFilter(choices=InvoiceState.choices)

    class Meta:
        model = Invoice
        fields = ["tenant", "month", "state"]

    def by_month(self, queryset, name, value):
        year, month = value.split("-")
        return queryset.filter(month__year=int(year), month__month=int(month))


class ReservationFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    gpu_model = django_filters.CharFilter(label="GPU model")

    class Meta:
        model = Reservation
        fields = ["tenant", "gpu_model"]
