import django_filters
from django.db.models import Q

from aistation.choices import JobState, QueuePolicy
from aistation.models import Job, Queue, Workdir
from ogai.filters import FilterSet


class JobFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    queue = django_filters.CharFilter(field_name="queue__name", label="Queue")
    owner = django_filters.CharFilter(field_name="owner__username", label="Owner")

    class Meta:
        model = Job
        fields = ["q", "state", "tenant", "queue", "owner"]

    def search(self, queryset, name, value):
        query = Q(name__icontains=value) | Q(reason__icontains=value)
        if value.isdigit():
            query |= Q(pk=int(value))
        return queryset.filter(query)


class QueueFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    cluster = django_filters.CharFilter(field_name="cluster__name", label="Cluster")
    policy = django_filters.ChoiceFilter(choices=QueuePolicy.choices)

    class Meta:
        model = Queue
        fields = ["tenant", "cluster", "policy", "is_active"]


class WorkdirFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    sha256 = django_filters.CharFilter(method="by_sha256", label="SHA-256")

    class Meta:
        model = Workdir
        fields = ["tenant", "sha256"]

    def by_sha256(self, queryset, name, value):
        # Kept in lowercase hex; exact, so the (tenant, sha256) index answers.
        return queryset.filter(sha256=value.strip().lower())
