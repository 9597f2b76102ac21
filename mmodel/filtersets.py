"""FilterSets of MModel, shared by the API and the console."""

import django_filters
from django.db.models import Q

from mmodel.choices import ImportState, VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Model, ModelImport, ModelVersion
from ogai.filters import FilterSet


class ModelFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    name = django_filters.CharFilter(label="Name (exact)")
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")

    class Meta:
        model = Model
        fields = ["q", "name", "tenant"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))


class ModelVersionFilterSet(FilterSet):
    model = django_filters.NumberFilter(field_name="model_id", label="Model id")
    model_name = django_filters.CharFilter(field_name="model__name", label="Model name")
    tenant = django_filters.CharFilter(field_name="model__tenant__name", label="Tenant")
    status = django_filters.ChoiceFilter(choices=VersionStatus.choices)
    format = django_filters.ChoiceFilter(choices=WeightsFormat.choices)
    source = django_filters.ChoiceFilter(choices=VersionSource.choices)
    training_run = django_filters.NumberFilter(field_name="training_run_id",
                                               label="Training run id")

    class Meta:
        model = ModelVersion
        fields = ["model", "model_name", "tenant", "status", "format", "source",
                  "training_run"]


class ModelImportFilterSet(FilterSet):
    model = django_filters.NumberFilter(field_name="model_id", label="Model id")
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    state = django_filters.ChoiceFilter(choices=ImportState.choices)

    class Meta:
        model = ModelImport
        fields = ["model", "tenant", "state"]
