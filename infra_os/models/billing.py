from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from infra_os.choices import InvoiceState, RatedResource
from infra_os.models.tenancy import Tenant
from ogai.models import TimeStampedModel

currency_validator = RegexValidator(r"^[A-Z]{3}$", "Use a three-letter ISO 4217 code, e.g. USD.")


class PricingPlan(TimeStampedModel):
    """Prices for usage. A tenant is billed on its own plan (`Tenant.pricing_plan`), else on the
    default one."""

    name = models.CharField(max_length=63, unique=True,
                            error_messages={"unique": "A plan with this name already exists."})
    description = models.CharField(max_length=200, blank=True)
    currency = models.CharField(max_length=3, default="USD", validators=[currency_validator])
    is_default = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=models.Q(is_default=True),
                                    name="pricing_plan_one_default"),
        ]

    def __str__(self) -> str:
        return self.name


class PricingRate(models.Model):
    plan = models.ForeignKey(PricingPlan, on_delete=models.CASCADE, related_name="rates")
    resource = models.CharField(max_length=24, choices=RatedResource.choices)
    match = models.CharField(max_length=64, blank=True,
                             help_text="A GPU model (or a model name for tokens); empty: any")
    unit_price = models.DecimalField(max_digits=14, decimal_places=6,
                                     validators=[MinValueValidator(Decimal(0))])

    class Meta:
        ordering = ["plan", "resource", "match"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "resource", "match"],
                                    name="pricing_rate_unique"),
            models.CheckConstraint(condition=models.Q(unit_price__gte=0),
                                   name="pricing_rate_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.plan.name}: {self.resource} {self.match or '*'} {self.unit_price}"


class Reservation(TimeStampedModel):
    """Capacity a tenant reserved for whole months at the plan's reserved price: GPU-hours of
    that GPU model up to the reserved amount are covered by it instead of billed by the hour."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="reservations")
    gpu_model = models.CharField(max_length=64)
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    starts_on = models.DateField()
    ends_on = models.DateField(null=True, blank=True, help_text="Last day included; empty: open")

    class Meta:
        ordering = ["tenant__name", "-starts_on"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_on__isnull=True) | models.Q(ends_on__gte=models.F(
                    "starts_on")), name="reservation_ends_after_start"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}: {self.gpus} x {self.gpu_model}"


class Invoice(models.Model):
    """A tenant's bill for one calendar month in `time_zone`. A draft is rated again on demand;
    a closed invoice never changes."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    month = models.DateField(help_text="The first day of the month billed")
    time_zone = models.CharField(max_length=64)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    plan_name = models.CharField(max_length=63)
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=8, choices=InvoiceState.choices,
                             default=InvoiceState.DRAFT)
    total = models.DecimalField(max_digits=16, decimal_places=2, default=Decimal("0.00"))
    rated_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL,
                                  null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-month", "tenant__name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month"], name="invoice_one_per_month"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name} {self.month:%Y-%m}"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    resource = models.CharField(max_length=24, choices=RatedResource.choices)
    match = models.CharField(max_length=64, blank=True)
    description = models.CharField(max_length=200)
    quantity = models.DecimalField(max_digits=20, decimal_places=6)
    unit = models.CharField(max_length=24)
    unit_price = models.DecimalField(max_digits=14, decimal_places=6)
    amount = models.DecimalField(max_digits=16, decimal_places=2)

    class Meta:
        ordering = ["invoice", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="invoice_line_position"),
        ]

    def __str__(self) -> str:
        return self.description
