import django_filters
from django.db.models import Q

from ogai.filters import FilterSet
from ylink.choices import DatasetKind, TrainingKind, VersionFormat
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun


class DatasetFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    name = django_filters.CharFilter(label="Name (exact)")
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    kind = django_filters.ChoiceFilter(choices=DatasetKind.choices)

    class Meta:
        model = Dataset
        fields = ["q", "name", "tenant", "kind"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))


class DatasetVersionFilterSet(FilterSet):
    dataset = django_filters.NumberFilter(field_name="dataset_id", label="Dataset id")
    format = django_filters.ChoiceFilter(choices=VersionFormat.choices)

    class Meta:
        model = DatasetVersion
        fields = ["dataset", "format"]


class PipelineRunFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    dataset = django_filters.NumberFilter(field_name="input_version__dataset_id",
                                          label="Dataset id")

    class Meta:
        model = PipelineRun
        fields = ["tenant", "dataset"]


class TrainingRunFilterSet(FilterSet):
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Search")
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    kind = django_filters.MultipleChoiceFilter(choices=TrainingKind.choices)
    succeeded = django_filters.BooleanFilter(label="Finished with a result")

    class Meta:
        model = TrainingRun
        fields = ["q", "tenant", "kind", "succeeded"]
