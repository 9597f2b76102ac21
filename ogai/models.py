"""Abstract model mixins shared by every layer. The ogai app itself owns no tables."""

from django.db import models


class TimeStampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def assign_changes(instance: models.Model, fields: dict) -> dict:
    """Set `fields` on `instance`; return what changed as {field: {"from", "to"}} for the audit
    log (empty when nothing did)."""
    changes = {}
    for field, value in fields.items():
        current = getattr(instance, field)
        if current != value:
            changes[field] = {"from": current, "to": value}
            setattr(instance, field, value)
    return changes
