"""The console's billing tables: invoices and reservations."""

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html

from frontend.tables import DATETIME, ConsoleTable, _badge
from infra_os.choices import InvoiceState
from infra_os.models import Invoice, Reservation

INVOICE_TONES = {InvoiceState.DRAFT: "warning", InvoiceState.CLOSED: "success"}


class InvoiceTable(ConsoleTable):
    month = tables.Column(verbose_name="Month", attrs={"td": {"class": "mono"}})
    plan_name = tables.Column(verbose_name="Plan", default="none")
    state = tables.Column()
    line_count = tables.Column(verbose_name="Lines", attrs={"td": {"class": "num"}})
    total = tables.Column(attrs={"td": {"class": "num strong"}})
    rated_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Rated")
    closed_at = tables.DateTimeColumn(format=DATETIME, verbose_name="Closed", default="—")

    class Meta(ConsoleTable.Meta):
        model = Invoice
        fields = ("month", "plan_name", "state", "line_count", "total", "rated_at", "closed_at")
        empty_text = "No invoices yet: a month appears here once it is rated."
        row_attrs = {"data-invoice": lambda record: f"{record.month:%Y-%m}"}

    def render_month(self, value, record):
        return format_html('<a href="{}">{}</a>', reverse("frontend:invoice", args=[record.pk]),
                           f"{value:%Y-%m}")

    def render_state(self, value, record):
        return _badge(record.get_state_display(), INVOICE_TONES[InvoiceState(record.state)])

    def render_total(self, value, record):
        return f"{value} {record.currency}"


class ReservationTable(ConsoleTable):
    tenant = tables.Column(accessor="tenant__name", verbose_name="Tenant",
                           attrs={"td": {"class": "mono"}})
    gpu_model = tables.Column(verbose_name="GPU model")
    gpus = tables.Column(verbose_name="GPUs", attrs={"td": {"class": "num"}})
    starts_on = tables.DateColumn(format="Y-m-d", verbose_name="From")
    ends_on = tables.DateColumn(format="Y-m-d", verbose_name="To (incl.)", default="open")
    actions = tables.TemplateColumn(
        template_name="frontend/billing/reservation_actions.html", verbose_name="",
        orderable=False, attrs={"td": {"class": "actions"}},
    )

    class Meta(ConsoleTable.Meta):
        model = Reservation
        fields = ("tenant", "gpu_model", "gpus", "starts_on", "ends_on")
        empty_text = "No reservations."
