"""Writing one column of many rows in one statement, where Django's bulk_update (a CASE per
row and field, resolved in Python) costs too much for a scheduling cycle."""

from collections.abc import Mapping
from typing import Any

from django.db import connection, models


def bulk_set(model: type[models.Model], field: str, values: Mapping[int, Any]) -> int:
    """Set `field` to values[pk] for each pk, in one UPDATE … FROM (VALUES …) statement
    (PostgreSQL, and SQLite from 3.33). Values go through the field's own conversion, so JSON
    columns take lists and dicts."""
    if not values:
        return 0
    table = model._meta.db_table
    model_field = model._meta.get_field(field)
    if not isinstance(model_field, models.Field):
        raise TypeError(f"{field} is a relation, not a column")
    column = str(model_field.column)
    db_type = model_field.db_type(connection) or "text"
    quote = connection.ops.quote_name
    rows = ", ".join(["(%s, %s)"] * len(values))
    params: list[Any] = []
    for pk, value in values.items():
        params.extend((pk, model_field.get_db_prep_save(value, connection)))
    # Parameters arrive untyped in VALUES: cast them to the column's type.
    sql = (
        f"UPDATE {quote(table)} SET {quote(column)} = CAST(v.value AS {db_type}) "  # noqa: S608
        f"FROM (VALUES {rows}) AS v(id, value) WHERE {quote(table)}.id = CAST(v.id AS bigint)"
    )
    if connection.vendor == "sqlite":
        # SQLite names VALUES columns column1, column2.
        sql = (
            f"UPDATE {quote(table)} SET {quote(column)} = v.column2 "  # noqa: S608
            f"FROM (VALUES {rows}) AS v WHERE {quote(table)}.id = v.column1"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
