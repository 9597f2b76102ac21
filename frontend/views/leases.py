"""Server leases (bare-metal service). Members see their tenant's leases; platform admins see
every lease, lease free provisioned servers to tenants, and end or cancel leases."""

import django_tables2 as tables
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.forms import add_service_errors
from frontend.lists import list_response
from frontend.tables import DATETIME, ConsoleTable
from infra_os.choices import LeaseState
from infra_os.filtersets import LeaseFilterSet
from infra_os.models import Lease
from infra_os.selectors import leasable_server_list, lease_list, tenant_list
from infra_os.services.leases import lease_create, lease_end

LEASE_TONES = {LeaseState.SCHEDULED: "info", LeaseState.ACTIVE: "success",
               LeaseState.ENDED: "muted", LeaseState.CANCELLED: "warning"}
DATETIME_INPUT = forms.DateTimeInput(attrs={"type": "datetime-local"},
                                     format="%Y-%m-%dT%H:%M")


class LeaseTable(ConsoleTable):
    id = tables.Column(verbose_name="ID", attrs={"td": {"class": "num mono"}})
    server = tables.Column(accessor="server__name", verbose_name="Server",
                           attrs={"td": {"class": "mono strong"}})
    tenant = tables.Column(accessor="tenant__name", verbose_name="Tenant",
                           attrs={"td": {"class": "mono"}})
    state = tables.Column()
    gpus = tables.Column(verbose_name="GPUs", empty_values=(), attrs={"td": {"class": "nowrap"}})
    starts_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Starts",
                                      attrs={"td": {"class": "nowrap"}})
    ends_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Ends",
                                    attrs={"td": {"class": "nowrap"}})
    ended_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Ended", default="—",
                                     attrs={"td": {"class": "nowrap"}})
    note = tables.Column(orderable=False, default="", attrs={"td": {"class": "clip"}})
    actions = tables.TemplateColumn(
        template_name="frontend/leases/row_actions.html", verbose_name="", orderable=False,
        attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Lease
        fields = ("id", "server", "tenant", "state", "gpus", "starts_at", "ends_at", "ended_at",
                  "note")
        empty_text = "No leases match."
        row_attrs = {"data-lease": lambda record: record.pk}

    def render_state(self, record):
        return format_html('<span class="badge badge-{}">{}</span>',
                           LEASE_TONES[LeaseState(record.state)], record.get_state_display())

    def render_gpus(self, record):
        if not record.gpus:
            return "—"
        return format_html("{} <span class=\"muted\">{}</span>", record.gpus, record.gpu_model)


class LeaseCreateForm(forms.Form):
    server = forms.ModelChoiceField(
        queryset=None, to_field_name="name", empty_label="Choose a server",
        help_text="Provisioned servers that are not cluster nodes.",
    )
    tenant = forms.ModelChoiceField(queryset=None, to_field_name="name",
                                    empty_label="Choose a tenant")
    starts_at = forms.DateTimeField(
        label="Starts", required=False, widget=DATETIME_INPUT,
        help_text=f"In {settings.TIME_ZONE}; empty: now.",
    )
    ends_at = forms.DateTimeField(label="Ends", widget=DATETIME_INPUT,
                                  help_text=f"In {settings.TIME_ZONE}.")
    note = forms.CharField(max_length=200, required=False)

    def __init__(self, *args, servers, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["server"].queryset = servers
        self.fields["server"].label_from_instance = self._server_label
        self.fields["tenant"].queryset = tenants

    @staticmethod
    def _server_label(server) -> str:
        gpus = server.billed_gpu_count
        if not gpus:
            return server.name
        return f"{server.name} ({gpus}\N{MULTIPLICATION SIGN} {server.billed_gpu_model})"

    def clean(self):
        data = super().clean()
        if not data.get("starts_at"):
            data["starts_at"] = timezone.now()
        return data


def _visible_leases(request):
    """Every lease for platform admins; the current tenant's for everyone else."""
    queryset = lease_list(user=request.user)
    if console_access(request).platform_admin:
        return queryset
    tenant = current_tenant(request)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _leases_page(request, form, status: int = 200):
    admin = console_access(request).platform_admin
    return list_response(
        request,
        template="frontend/leases/list.html",
        table_class=LeaseTable,
        queryset=_visible_leases(request),
        filterset_class=LeaseFilterSet,
        hidden_filters=() if admin else ("tenant",),
        table_kwargs={"exclude": () if admin else ("tenant", "actions")},
        context={"form": form},
        status=status,
    )


def _create_form(request, data=None) -> LeaseCreateForm:
    return LeaseCreateForm(
        data, servers=leasable_server_list(user=request.user),
        tenants=tenant_list(user=request.user).filter(is_active=True),
        auto_id="new-lease-%s",  # the filter bar above the table has its own tenant and server
    )


@login_required
def leases(request):
    form = _create_form(request) if console_access(request).platform_admin else None
    return _leases_page(request, form)


@login_required
@require_POST
def lease_create_view(request):
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can lease servers.")
    form = _create_form(request, request.POST)
    if form.is_valid():
        try:
            lease = lease_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            started = "starts now" if lease.state == LeaseState.ACTIVE else \
                f"starts {timezone.localtime(lease.starts_at):%Y-%m-%d %H:%M}"
            messages.success(request, f"{lease.server.name} leased to {lease.tenant.name}; it "
                             f"{started} and ends "
                             f"{timezone.localtime(lease.ends_at):%Y-%m-%d %H:%M}.")
            return redirect("frontend:leases")
    return _leases_page(request, form)


@login_required
@require_POST
def lease_end_view(request, pk: int):
    lease = get_object_or_404(_visible_leases(request), pk=pk)
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can end a lease.")
    try:
        lease = lease_end(actor=request.user, lease=lease)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        if lease.state == LeaseState.CANCELLED:
            messages.success(request, f"Lease {lease.pk} of {lease.server.name} cancelled.")
        else:
            messages.success(request, f"Lease {lease.pk} of {lease.server.name} ended; its "
                             "usage is recorded.")
    return redirect("frontend:leases")
