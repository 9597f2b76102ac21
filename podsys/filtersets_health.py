"""Filters of the health check runs, shared by the API and the console."""

import django_filters

from ogai.filters import FilterSet
from podsys.choices import CheckSeverity, CheckState
from podsys.models import HealthCheckRun


class HealthCheckRunFilterSet(FilterSet):
    node = django_filters.NumberFilter(field_name="node_id", label="Node id")
    cluster = django_filters.CharFilter(field_name="node__cluster__name", label="Cluster")
    check_name = django_filters.CharFilter(label="Check")
    state = django_filters.ChoiceFilter(choices=CheckState.choices)
    severity = django_filters.ChoiceFilter(choices=CheckSeverity.choices)

    class Meta:
        model = HealthCheckRun
        fields = ["node", "cluster", "check_name", "state", "severity", "trigger"]
