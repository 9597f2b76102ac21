"""`ogai.bulk` against a real table (ogai owns none): a cluster's text and JSON columns."""

import pytest

from ogai.bulk import bulk_set
from podsys.models import Cluster


@pytest.mark.django_db
def test_bulk_set_writes_text_numbers_and_json_per_row_and_nothing_else():
    a, b, c = (Cluster.objects.create(name=name, driver="fake") for name in "abc")

    assert bulk_set(Cluster, "sync_error", {a.pk: "BMC unreachable", b.pk: "it's \"quoted\""}) == 2
    assert bulk_set(Cluster, "options", {a.pk: {"nodes": 3}, b.pk: ["x", 1.5, None]}) == 2
    assert bulk_set(Cluster, "capacity", {}) == 0

    rows = {row.pk: row for row in Cluster.objects.all()}
    assert rows[a.pk].sync_error == "BMC unreachable"
    assert rows[b.pk].sync_error == "it's \"quoted\""
    assert rows[a.pk].options == {"nodes": 3}
    assert rows[b.pk].options == ["x", 1.5, None]
    assert (rows[c.pk].sync_error, rows[c.pk].options) == ("", {})


def test_bulk_set_refuses_a_relation():
    with pytest.raises(TypeError, match="relation"):
        bulk_set(Cluster, "nodes", {1: 2})
