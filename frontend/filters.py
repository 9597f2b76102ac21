"""Console variants of the shared FilterSets: the same filters, with widgets that fit a
one-line filter bar."""

import django_filters
from django import forms

from aistation.choices import JobState
from aistation.filtersets import JobFilterSet


class OneOfManySelect(forms.Select):
    """A drop-down for a multiple-choice filter: it picks one value (or none, "Any"), while the
    API keeps taking several (`?state=queued&state=running`), and a URL with several still
    filters by all of them."""

    def value_from_datadict(self, data, files, name):
        values = data.getlist(name) if hasattr(data, "getlist") else [data.get(name)]
        return [value for value in values if value]


class ConsoleJobFilterSet(JobFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, widget=OneOfManySelect)
