import django_filters

from ogai.filters import FilterSet
from podsys.choices import NodeHealth
from podsys.models import Cluster, Node


class ClusterFilterSet(FilterSet):
    class Meta:
        model = Cluster
        fields = ["driver", "is_active"]


class NodeFilterSet(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", label="Cluster")
    name = django_filters.CharFilter(label="Node name")
    health = django_filters.ChoiceFilter(choices=NodeHealth.choices)
    gpu_model = django_filters.CharFilter()

    class Meta:
        model = Node
        fields = ["cluster", "name", "health", "gpu_model", "schedulable"]
