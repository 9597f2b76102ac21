from django.conf import settings
from django.db import models
from django.utils import timezone

from infra_os.choices import InvitationState, Role
from ogai.models import TimeStampedModel


class Invitation(TimeStampedModel):
    """A tenant's offer of a role to the account named `username`; that account's owner alone
    accepts or declines it. The name is kept as typed, whether or not it is an account, so
    inviting tells the tenant admin nothing about which accounts exist."""

    tenant = models.ForeignKey("infra_os.Tenant", on_delete=models.CASCADE,
                               related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL,
                                   null=True, blank=True, related_name="+")
    expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=InvitationState.choices,
                             default=InvitationState.PENDING)
    responded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "username"], condition=models.Q(state="pending"),
                name="invitation_one_pending",
                violation_error_message="This username already has a pending invitation.",
            ),
            models.CheckConstraint(
                condition=models.Q(role__in=Role.values), name="invitation_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.username} to {self.tenant.name} as {self.get_role_display().lower()}"

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def status(self) -> str:
        """The state as people read it: a pending invitation past its time is expired."""
        if self.state == InvitationState.PENDING and self.is_expired:
            return InvitationState.EXPIRED
        return self.state
