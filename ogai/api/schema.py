"""The OpenAPI schema says what the API answers, errors and nulls included.

drf-spectacular documents only the success of an operation and takes a declared field's
nullability from its declaration. Two things it cannot see are added here, for every view:
- the errors an operation can answer, all in the one envelope (`ogai.api.errors`);
- null for a read-only field whose value comes through a nullable column (a benchmark shared
  by the platform has no `created_by`): DRF answers null there whatever the field declares.
"""

from django.core.exceptions import FieldDoesNotExist
from drf_spectacular import openapi
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="What went wrong, for programs: `invalid`, "
                                 "`not_found`, `permission_denied`, `parse_error`, …")
    message = serializers.CharField(help_text="What went wrong, for people.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="The errors of each field of the input, by the field's path.")


# What any operation may answer besides its success (services raise ValidationError,
# PermissionDenied and Http404 anywhere, and every request may carry wrong credentials).
ERRORS = [
    ("400", "The request is not valid: `fields` says why, field by field."),
    ("401", "No credentials, or wrong ones: unknown, expired or revoked."),
    ("403", "You may not do this: the message says why."),
    ("404", "No such object, or not one you can see."),
]


class AutoSchema(openapi.AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code, description in self._errors():
            responses.setdefault(code, {
                **self._get_response_for_code(ErrorSerializer, code, ["application/json"],
                                              direction),
                "description": description,
            })
        return responses

    def _errors(self) -> list[tuple[str, str]]:
        errors = list(ERRORS)
        if self.view.get_throttles():
            errors.append(("429", "Too many requests: wait as long as `Retry-After` says."))
        return errors

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        if field.read_only and not field.allow_null and _through_nullable_column(field):
            # Read-only: allow_null changes nothing but what the schema says.
            field.allow_null = True
        return super()._map_serializer_field(field, direction, bypass_extensions)


class OneObjectListSchema(AutoSchema):
    """For a viewset whose `list` answers one object (results and more), not a list."""

    def _is_list_view(self, serializer=None) -> bool:
        return False


def _through_nullable_column(field) -> bool:
    """Whether the field's source crosses a nullable column of its serializer's model."""
    if isinstance(field, serializers.ManyRelatedField | serializers.ListSerializer):
        return False
    model = getattr(getattr(field.parent, "Meta", None), "model", None)
    if model is None or field.source == "*":
        return False
    for name in field.source.split("."):
        try:
            column = model._meta.get_field(name)
        except FieldDoesNotExist:
            return False
        if not column.concrete:
            return False
        if column.null:
            return True
        if not column.many_to_one and not column.one_to_one:
            return False
        model = column.related_model
    return False
