"""Usage, invoices and pricing. Usage and invoices show the current tenant; pricing is managed
by platform admins (others see the plan their tenant is billed on)."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.charts import ChartSeries, stacked_bars_svg
from frontend.forms import add_service_errors
from frontend.forms_billing import (
    MonthForm,
    PricingPlanForm,
    PricingRateForm,
    ReservationForm,
    TenantPlanForm,
)
from frontend.lists import list_response
from frontend.tables_billing import InvoiceTable, ReservationTable
from infra_os.choices import InvoiceState
from infra_os.filtersets import InvoiceFilterSet
from infra_os.invoice_export import invoice_csv, invoice_filename, invoice_pdf
from infra_os.models import Invoice
from infra_os.selectors import tenant_list
from infra_os.selectors_billing import (
    invoice_list,
    plan_tenants,
    pricing_plan_list,
    reservation_list,
    usage_by_day,
)
from infra_os.services.billing import (
    billing_time_zone,
    current_month,
    invoice_close,
    invoice_note,
    invoice_rate,
    parse_month,
    plan_of,
    pricing_plan_create,
    pricing_plan_delete,
    pricing_plan_update,
    pricing_rate_delete,
    pricing_rate_set,
    reservation_create,
    reservation_delete,
    tenant_set_pricing_plan,
)
from infra_os.services.rating import month_period, next_month


def _month_from(request, default):
    """The month asked for in ?month=YYYY-MM (the default when absent or wrong) and the form
    that shows it, with the error when it was wrong."""
    asked = "month" in request.GET
    form = MonthForm(request.GET if asked else None, initial={"month": f"{default:%Y-%m}"})
    if asked and form.is_valid():
        return parse_month(form.cleaned_data["month"]), form
    return default, form


# Usage ----------------------------------------------------------------------------------------


@login_required
def usage(request):
    tenant = current_tenant(request)
    month, form = _month_from(request, current_month())
    context = {"form": form, "month": month, "time_zone": billing_time_zone(),
               "previous": (month - timedelta(days=1)).replace(day=1),
               "next": next_month(month) if next_month(month) <= current_month() else None}
    if tenant is not None:
        summary = usage_by_day(user=request.user, tenant=tenant, start=month,
                               end=next_month(month))
        days = summary.days
        context["summary"] = summary
        context["charts"] = [
            {"series": series, "totals": series.key_totals(),
             "svg": stacked_bars_svg(
                 days=days, unit=series.unit, title=f"{series.label} by day, {month:%Y-%m}",
                 series=[ChartSeries(key or "unspecified",
                                     {day: values[key] for day, values in series.by_day.items()
                                      if key in values})
                         for key in series.keys])}
            for series in summary.series
        ]
    return render(request, "frontend/billing/usage.html", context)


# Invoices -------------------------------------------------------------------------------------


def _current_invoices(request):
    tenant = current_tenant(request)
    queryset = invoice_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


@login_required
def invoices(request):
    last_month = (current_month() - timedelta(days=1)).replace(day=1)
    return list_response(
        request,
        template="frontend/billing/invoices.html",
        table_class=InvoiceTable,
        queryset=_current_invoices(request),
        filterset_class=InvoiceFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"month": "Month (YYYY-MM)"},
        context={"rate_form": MonthForm(initial={"month": f"{last_month:%Y-%m}"})},
    )


@login_required
@require_POST
def invoice_rate_view(request):
    tenant = current_tenant(request)
    if tenant is None:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:invoices")
    form = MonthForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a month as YYYY-MM, e.g. 2026-10.")
        return redirect("frontend:invoices")
    try:
        invoice = invoice_rate(actor=request.user, tenant=tenant,
                               month=parse_month(form.cleaned_data["month"]))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:invoices")
    messages.success(request, f"{invoice.month:%Y-%m} rated: {invoice.total} "
                     f"{invoice.currency}.")
    return redirect("frontend:invoice", pk=invoice.pk)


def _invoice(request, pk: int) -> Invoice:
    return get_object_or_404(_current_invoices(request).prefetch_related("lines"), pk=pk)


@login_required
def invoice_view(request, pk: int):
    invoice = _invoice(request, pk)
    access = console_access(request)
    month_over = timezone.now() >= month_period(invoice.month, billing_time_zone()).end
    draft = invoice.state == InvoiceState.DRAFT
    return render(request, "frontend/billing/invoice.html", {
        "invoice": invoice, "lines": list(invoice.lines.all()), "note": invoice_note(invoice),
        "can_rate": draft and access.can_admin,
        "can_close": draft and access.platform_admin and month_over,
        "month_over": month_over,
    })


@login_required
@require_POST
def invoice_rerate_view(request, pk: int):
    invoice = _invoice(request, pk)
    try:
        invoice = invoice_rate(actor=request.user, tenant=invoice.tenant, month=invoice.month)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Rated again: {invoice.total} {invoice.currency}.")
    return redirect("frontend:invoice", pk=invoice.pk)


@login_required
@require_POST
def invoice_close_view(request, pk: int):
    invoice = _invoice(request, pk)
    try:
        invoice = invoice_close(actor=request.user, invoice=invoice)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Invoice {invoice.month:%Y-%m} closed: {invoice.total} "
                         f"{invoice.currency}. It will not change again.")
    return redirect("frontend:invoice", pk=invoice.pk)


@login_required
def invoice_download(request, pk: int, kind: str):
    invoice = _invoice(request, pk)
    if kind == "csv":
        response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    else:
        response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{invoice_filename(invoice, kind)}"'
    return response


# Pricing --------------------------------------------------------------------------------------


def _require_platform_admin(request) -> None:
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin manages pricing.")


@login_required
def pricing(request):
    """Platform admins: every plan, the tenants on each, and reservations. Others: the plan the
    current tenant is billed on, and its reservations."""
    access = console_access(request)
    tenant = current_tenant(request)
    reservations = reservation_list(user=request.user)
    context: dict = {}
    if access.platform_admin:
        on_plan = plan_tenants(user=request.user)
        plans = list(pricing_plan_list(user=request.user))
        context["plans"] = [{"plan": plan, "tenants": on_plan.get(plan.pk, [])}
                            for plan in plans]
        context["default_tenants"] = on_plan.get(None, [])
        context["has_default"] = any(plan.is_default for plan in plans)
        # One select per tenant, drawn from this one list of plans (a form per row would
        # query the plans once per tenant).
        context["plan_names"] = [plan.name for plan in plans]
        context["tenant_rows"] = tenant_list(user=request.user).select_related("pricing_plan")
    else:
        plan = plan_of(tenant) if tenant else None
        context["own_plan"] = pricing_plan_list(user=request.user).filter(
            pk=plan.pk).first() if plan else None
        reservations = reservations.filter(tenant_id=tenant.pk) if tenant else reservations.none()
    table = ReservationTable(reservations, exclude=() if access.platform_admin else ("actions",))
    context["reservations"] = table
    return render(request, "frontend/billing/pricing.html", context)


@login_required
def pricing_plan_create_view(request):
    _require_platform_admin(request)
    form = PricingPlanForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            plan = pricing_plan_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Plan {plan.name} created. Now give it rates.")
            return redirect("frontend:pricing-plan", pk=plan.pk)
    return render(request, "frontend/billing/plan_form.html", {
        "form": form, "heading": "New pricing plan", "submit_label": "Create plan"})


def _plan(request, pk: int):
    _require_platform_admin(request)
    return get_object_or_404(pricing_plan_list(user=request.user), pk=pk)


@login_required
def pricing_plan_view(request, pk: int):
    """A plan: its fields (editable), its rates (set, delete) and who is billed on it."""
    plan = _plan(request, pk)
    form = PricingPlanForm(request.POST or None, initial={
        "name": plan.name, "description": plan.description, "currency": plan.currency,
        "is_default": plan.is_default})
    if request.method == "POST" and form.is_valid():
        try:
            pricing_plan_update(actor=request.user, plan=plan, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Plan {form.cleaned_data['name']} saved.")
            return redirect("frontend:pricing-plan", pk=plan.pk)
    return _plan_page(request, plan, form=form, rate_form=PricingRateForm())


def _plan_page(request, plan, *, form, rate_form, status: int = 200):
    on_plan = plan_tenants(user=request.user)
    tenants = on_plan.get(plan.pk, []) + (on_plan.get(None, []) if plan.is_default else [])
    return render(request, "frontend/billing/plan.html", {
        "plan": plan, "rates": list(plan.rates.all()), "form": form, "rate_form": rate_form,
        "tenants": tenants,
    }, status=status)


@login_required
@require_POST
def pricing_rate_set_view(request, pk: int):
    plan = _plan(request, pk)
    rate_form = PricingRateForm(request.POST)
    if rate_form.is_valid():
        try:
            rate = pricing_rate_set(actor=request.user, plan=plan, **rate_form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(rate_form, exc)
        else:
            messages.success(request, f"{rate.get_resource_display()} "
                             f"{rate.match or '(any other)'}: {rate.unit_price} "
                             f"{plan.currency}.")
            return redirect("frontend:pricing-plan", pk=plan.pk)
    form = PricingPlanForm(initial={"name": plan.name, "description": plan.description,
                                    "currency": plan.currency, "is_default": plan.is_default})
    return _plan_page(request, plan, form=form, rate_form=rate_form, status=400)


@login_required
@require_POST
def pricing_rate_delete_view(request, pk: int, rate_pk: int):
    plan = _plan(request, pk)
    rate = get_object_or_404(plan.rates.all(), pk=rate_pk)
    pricing_rate_delete(actor=request.user, rate=rate)
    messages.success(request, f"Rate {rate.get_resource_display()} {rate.match or '(any other)'}"
                     " deleted.")
    return redirect("frontend:pricing-plan", pk=plan.pk)


@login_required
@require_POST
def pricing_plan_delete_view(request, pk: int):
    plan = _plan(request, pk)
    try:
        pricing_plan_delete(actor=request.user, plan=plan)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:pricing-plan", pk=plan.pk)
    messages.success(request, f"Plan {plan.name} deleted.")
    return redirect("frontend:pricing")


@login_required
@require_POST
def tenant_plan_view(request, name: str):
    _require_platform_admin(request)
    tenant = get_object_or_404(tenant_list(user=request.user), name=name)
    form = TenantPlanForm(request.POST, plans=pricing_plan_list(user=request.user))
    if not form.is_valid():
        messages.error(request, f"{tenant.name}: {' '.join(form.errors.get('plan', []))}")
        return redirect("frontend:pricing")
    plan = form.cleaned_data["plan"]
    tenant_set_pricing_plan(actor=request.user, tenant=tenant, plan=plan)
    messages.success(request, f"{tenant.name} is billed on "
                     f"{plan.name if plan else 'the default plan'} from its next rating.")
    return redirect("frontend:pricing")


@login_required
def reservation_create_view(request):
    _require_platform_admin(request)
    form = ReservationForm(request.POST or None, tenants=tenant_list(user=request.user),
                           initial={"starts_on": current_month()})
    if request.method == "POST" and form.is_valid():
        try:
            reservation = reservation_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Reserved {reservation.gpus} x {reservation.gpu_model} "
                             f"for {reservation.tenant.name}.")
            return redirect("frontend:pricing")
    return render(request, "frontend/billing/plan_form.html", {
        "form": form, "heading": "New reservation", "submit_label": "Reserve",
        "intro": "GPUs of a model reserved for a tenant, billed each month at the plan's "
        "reserved price (a part month pays its share of days); the GPU-hours they cover are "
        "not billed again."})


@login_required
@require_POST
def reservation_delete_view(request, pk: int):
    _require_platform_admin(request)
    reservation = get_object_or_404(reservation_list(user=request.user), pk=pk)
    reservation_delete(actor=request.user, reservation=reservation)
    messages.success(request, f"Reservation of {reservation.gpus} x {reservation.gpu_model} for "
                     f"{reservation.tenant.name} deleted.")
    return redirect("frontend:pricing")
