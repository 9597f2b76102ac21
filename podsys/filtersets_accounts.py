"""Filters of the cluster account lists, shared by the API and the console."""

import django_filters

from ogai.filters import FilterSet
from podsys.models import ClusterGroup, ClusterUser


class ClusterUserFilterSet(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", label="Cluster")
    username = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ClusterUser
        fields = ["cluster", "username", "is_active"]


class ClusterGroupFilterSet(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", label="Cluster")

    class Meta:
        model = ClusterGroup
        fields = ["cluster", "is_active"]
