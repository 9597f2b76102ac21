"""The console's billing forms. They check shapes only; the billing services decide."""

from decimal import Decimal

from django import forms

from infra_os.choices import RatedResource
from infra_os.filtersets import month_validator

MONTH_HELP = "YYYY-MM, in the billing time zone."


class MonthInput(forms.TextInput):
    input_type = "month"


class MonthForm(forms.Form):
    month = forms.CharField(validators=[month_validator], widget=MonthInput, help_text=MONTH_HELP)


class PricingPlanForm(forms.Form):
    name = forms.CharField(max_length=63)
    description = forms.CharField(max_length=200, required=False)
    currency = forms.RegexField(r"^[A-Za-z]{3}$", initial="USD", max_length=3,
                                error_messages={"invalid": "Use a three-letter code, e.g. USD."},
                                help_text="ISO 4217, e.g. USD or EUR.")
    is_default = forms.BooleanField(
        label="Default plan", required=False,
        help_text="Tenants without a plan of their own are billed on it (another default "
        "stops being one).")


class PricingRateForm(forms.Form):
    resource = forms.ChoiceField(choices=RatedResource.choices)
    match = forms.CharField(
        max_length=64, required=False, label="GPU model or model name",
        help_text="e.g. H100 (a model name for tokens); empty: anything without its own rate.")
    unit_price = forms.DecimalField(
        label="Unit price", min_value=Decimal(0), max_digits=14, decimal_places=6,
        help_text="Per GPU-hour, server-hour, million tokens or GPU-month.")


class ReservationForm(forms.Form):
    tenant = forms.ModelChoiceField(queryset=None, to_field_name="name", empty_label=None)
    gpu_model = forms.CharField(label="GPU model", max_length=64, help_text="e.g. H100")
    gpus = forms.IntegerField(label="GPUs", min_value=1)
    starts_on = forms.DateField(label="First day", widget=forms.DateInput(attrs={"type": "date"}))
    ends_on = forms.DateField(label="Last day", required=False,
                              widget=forms.DateInput(attrs={"type": "date"}),
                              help_text="Included; empty: until the reservation is deleted.")

    def __init__(self, *args, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants


class TenantPlanForm(forms.Form):
    plan = forms.ModelChoiceField(queryset=None, required=False, empty_label="Default plan",
                                  to_field_name="name")

    def __init__(self, *args, plans, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["plan"].queryset = plans
