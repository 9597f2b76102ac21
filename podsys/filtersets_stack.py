"""Filters of the stack profile and deployment run lists, shared by the API and the console."""

import django_filters

from ogai.filters import FilterSet
from podsys.choices import DeploymentKind, DeploymentState, Orchestrator, OsFamily
from podsys.models import DeploymentRun, StackProfile


class StackProfileFilterSet(FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    os_family = django_filters.ChoiceFilter(choices=OsFamily.choices)
    orchestrator = django_filters.ChoiceFilter(choices=Orchestrator.choices)

    class Meta:
        model = StackProfile
        fields = ["name", "os_family", "orchestrator"]


class DeploymentRunFilterSet(FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", label="Cluster")
    profile = django_filters.CharFilter(field_name="profile__name", label="Stack profile")
    kind = django_filters.ChoiceFilter(choices=DeploymentKind.choices)
    state = django_filters.ChoiceFilter(choices=DeploymentState.choices)

    class Meta:
        model = DeploymentRun
        fields = ["cluster", "profile", "kind", "state", "check_mode"]
