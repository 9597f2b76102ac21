"""The base of every FilterSet, shared by the API and the console."""

import django_filters
from django import forms
from django.db import connection, models
from django_filters.utils import get_model_field
from drf_spectacular.utils import extend_schema_field


class FilterSet(django_filters.FilterSet):
    """A number filter on an integer column (an id, most often) takes a whole number the
    column can hold. A value past it (`?dataset=99999999999999999999`) is refused like any
    invalid filter — a 400 in the API, a form error in the console — instead of reaching the
    database driver, which overflows on it (SQLite: OverflowError, a 500)."""

    @classmethod
    def get_filters(cls):
        filters = super().get_filters()
        for filter_ in filters.values():
            if isinstance(filter_, django_filters.NumberFilter):
                _bound_to_column(filter_, _integer_column(cls._meta.model, filter_.field_name))
        return filters


def _integer_column(model, field_name: str | None) -> models.Field | None:
    """The integer column `field_name` filters on (a relation's target column), or None."""
    if model is None or not field_name:
        return None
    field = get_model_field(model, field_name)
    if field is not None and field.is_relation:
        field = field.target_field
    return field if isinstance(field, models.IntegerField) else None


def _bound_to_column(filter_: django_filters.NumberFilter, column: models.Field | None) -> None:
    if column is None:
        return
    low, high = connection.ops.integer_field_range(column.get_internal_type())
    # The filter's own attributes, not its class's: a declared filter is shared by subclasses,
    # and this is the same for every one of them.
    filter_.field_class = forms.IntegerField
    filter_.extra.setdefault("min_value", low)
    filter_.extra.setdefault("max_value", high)
    schema = {"type": "integer"}
    schema.update({key: value for key, value in (("minimum", low), ("maximum", high),
                                                 ("description", filter_.label))
                   if value is not None})
    extend_schema_field(schema)(filter_)
