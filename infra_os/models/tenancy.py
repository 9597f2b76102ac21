from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from infra_os.choices import Role
from ogai.models import TimeStampedModel

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$",
    "Use 1 to 63 lowercase letters, digits and hyphens, starting and ending with a letter or "
    "digit (it becomes a Kubernetes namespace).",
)


class Tenant(TimeStampedModel):
    """An organisation renting the computing centre; every resource above L0 belongs to one."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[slug_validator],
        error_messages={"unique": "A tenant with this name already exists."},
    )
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    pricing_plan = models.ForeignKey("infra_os.PricingPlan", on_delete=models.PROTECT, null=True,
                                     blank=True, related_name="tenants",
                                     help_text="Empty: the default plan")
    log_retention_days = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(3650)],
        help_text="Days its jobs' output is kept in the log store (whole days).")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name


class Membership(TimeStampedModel):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user"),
            models.CheckConstraint(
                condition=models.Q(role__in=Role.values), name="membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant.name} ({self.get_role_display()})"
