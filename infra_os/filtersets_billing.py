"""Filters of billing shared by the API and the console."""

import django_filters
from django.core.validators import RegexValidator

from infra_os.choices import InvoiceState
from infra_os.models import Invoice, Reservation

month_validator = RegexValidator(r"^\d{4}-(0[1-9]|1[0-2])$",
                                 "Give a month as YYYY-MM, e.g. 2026-10.")


class InvoiceFilterSet(django_filters.FilterSet):
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


class ReservationFilterSet(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    gpu_model = django_filters.CharFilter(label="GPU model")

    class Meta:
        model = Reservation
        fields = ["tenant", "gpu_model"]
