from django.conf import settings
from django.db import models

from infra_os.models import Tenant
from mmodel.choices import Vote
from mmodel.models.registry import ModelVersion


class ArenaVote(models.Model):
    """A member's verdict on two answers to one prompt in the playground; ratings (Elo) are
    computed from the votes in order."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="arena_votes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                             related_name="+")
    left = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="+")
    right = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="+")
    vote = models.CharField(max_length=16, choices=Vote.choices)
    prompt = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(left=models.F("right")),
                                   name="arena_vote_two_versions"),
        ]

    def __str__(self) -> str:
        return f"{self.left_id} vs {self.right_id}: {self.vote}"
