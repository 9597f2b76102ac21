"""Abstract model mixins shared by every layer. The ogai app itself owns no tables."""

from django.core.exceptions import ValidationError
from django.db import models


class TimeStampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def assign_changes(instance: models.Model, fields: dict, *, allowed: tuple[str, ...]) -> dict:
    """Set `fields` on `instance`; return what changed as {field: {"from", "to"}} for the audit
    log (empty when nothing did). A field outside `allowed` is refused, naming it."""
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise ValidationError({name: "This field cannot be changed." for name in unknown})
    changes = {}
    for field, value in fields.items():
        current = getattr(instance, field)
        if current != value:
            changes[field] = {"from": current, "to": value}
            setattr(instance, field, value)
    return changes
