"""The playground's arena: a member's vote on two versions' answers to one prompt."""

from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from mmodel.choices import Vote
from mmodel.models import ArenaVote, ModelVersion

# A prompt is kept for reading the votes back, not for replaying long conversations.
MAX_PROMPT_CHARS = 20_000


@transaction.atomic
def arena_vote_record(*, actor, tenant: Tenant, left_version: ModelVersion,
                      right_version: ModelVersion, vote: str, prompt: str = "") -> ArenaVote:
    """Record which of two answers was better. Both versions must be the tenant's and differ;
    the vote is one of `Vote`."""
    require_role(actor, tenant, WRITE_ROLES)
    errors: dict[str, str] = {}
    for field, version in (("left_version", left_version), ("right_version", right_version)):
        if version.model.tenant_id != tenant.pk:
            errors[field] = f"{version.label} is not a model version of {tenant.name}."
    if not errors and left_version.pk == right_version.pk:
        errors["right_version"] = "Compare two different versions: both sides are " \
                                  f"{left_version.label}."
    if vote not in Vote.values:
        errors["vote"] = f"Vote one of {', '.join(Vote.values)}; {vote!r} is none of them."
    if len(prompt) > MAX_PROMPT_CHARS:
        errors["prompt"] = f"The prompt has {len(prompt):,} characters; at most " \
                           f"{MAX_PROMPT_CHARS:,} are kept."
    if errors:
        raise ValidationError(errors)
    record = ArenaVote.objects.create(tenant=tenant, user=actor, left=left_version,
                                      right=right_version, vote=vote, prompt=prompt)
    audit_record(actor=actor, action="arena.vote", obj=record, tenant=tenant,
                 changes={"left": left_version.label, "right": right_version.label,
                          "vote": vote})
    return record
