"""What every API input is held to, whatever its serializer: a field it does not know is an
error, in POST as in PUT and PATCH. A typo ("replica: 4", "gpu: 2", "descripton") must not
silently run or save something else."""

from rest_framework import serializers

# Django's form posts (the browsable API's forms) carry the CSRF token as a field.
IGNORED_FIELDS = frozenset({"csrfmiddlewaretoken"})


def refuse_unknown_fields(data, fields) -> None:
    """Raise a 400 naming each key of `data` (a dict or QueryDict) that is not in `fields`."""
    if not hasattr(data, "keys"):
        return
    unknown = sorted(set(data.keys()) - set(fields) - IGNORED_FIELDS)
    if unknown:
        raise serializers.ValidationError({name: "Unknown field." for name in unknown})


class RejectUnknownFields:
    """For a nested serializer (the viewsets check the top level of every input)."""

    def to_internal_value(self, data):
        refuse_unknown_fields(data, self.fields)
        return super().to_internal_value(data)
