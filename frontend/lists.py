"""The list pages' machinery: filter with the shared FilterSet, sort and paginate with
django-tables2, and answer htmx requests with the table area alone."""

from django import forms
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django_tables2 import RequestConfig

from frontend.responses import wants_partial

PER_PAGE = 25
TABLE_AREA_TEMPLATE = "frontend/includes/table_area.html"


def list_response(
    request,
    *,
    template: str,
    table_class,
    queryset,
    filterset_class=None,
    hidden_filters: tuple[str, ...] = (),
    filter_labels: dict[str, str] | None = None,
    table_kwargs: dict | None = None,
    context: dict | None = None,
    status: int = 200,
):
    """Render `template` (or, for htmx, only the table area) for `queryset`.

    `hidden_filters` are FilterSet fields the page fixes itself, such as the tenant, which the
    switcher chooses: they are dropped from the form, so they neither show nor filter.
    """
    filter_form = None
    if filterset_class is not None:
        filterset = filterset_class(request.GET or None, queryset=queryset, request=request)
        for name in hidden_filters:
            filterset.form.fields.pop(name, None)
        queryset = filterset.qs
        filter_form = _for_people(filterset.form, filter_labels or {})
    table = table_class(queryset, **(table_kwargs or {}))
    RequestConfig(request, paginate={"per_page": PER_PAGE}).configure(table)
    page_context = {"table": table, "filter_form": filter_form, **(context or {})}
    chosen = TABLE_AREA_TEMPLATE if wants_partial(request) else template
    response = render(request, chosen, page_context, status=status)
    # The same URL answers with a page or a fragment: caches must tell them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


def _for_people(form, labels: dict[str, str]):
    """Word the shared FilterSet's form for the console: the API's filters are named for
    machines ("Created at is greater than or equal to", "Unknown", "---------")."""
    for name, field in form.fields.items():
        field.label = labels.get(name, field.label)
        if isinstance(field.widget, forms.NullBooleanSelect):
            field.widget.choices = (("unknown", "Any"), ("true", "Yes"), ("false", "No"))
        elif isinstance(field, forms.ChoiceField):
            options = [(value, label) for value, label in field.choices if value != ""]
            field.widget.choices = [("", "Any"), *options]
        if name == "q":
            field.widget.input_type = "search"
        elif isinstance(field, forms.DateTimeField):
            field.widget.input_type = "datetime-local"
    return form
