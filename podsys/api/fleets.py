"""Fleets, read-only: each with its clusters and elastic pools as the autoscaler sees them, and
the pools' scale decisions. An operator's view: platform admins see every fleet, others an empty
list and 404s."""

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins
from rest_framework.decorators import action

from infra_os.api.viewsets import ScopedViewSet
from podsys.api import serializers_fleets as s
from podsys.selectors_fleets import fleet_list, fleet_summaries, scale_event_list


class FleetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Fleets with their clusters (GPUs held of their total, whether they answer) and pools
    (nodes booting, idle and busy; spend this month against the budget)."""

    selector = fleet_list
    output_serializer_class = s.FleetSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    _summarized: list | tuple = ()  # the fleets being answered: the page, or the one

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        if page is not None and self.action == "list":
            self._summarized = page
        return page

    def get_object(self):
        fleet = super().get_object()
        if self.action == "retrieve":
            self._summarized = [fleet]
        return fleet

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["summaries"] = fleet_summaries(self._summarized, timezone.now()) \
            if self._summarized else {}
        return context

    @extend_schema(
        parameters=[OpenApiParameter("offset", int), OpenApiParameter("limit", int)],
        responses=s.ScaleEventSerializer(many=True),
    )
    @action(detail=True, methods=["get"])
    def events(self, request, name=None):
        """The autoscaler's decisions on the fleet's pools, newest first: nodes asked for,
        given back, failed to boot, or refused by a budget, each with its reason."""
        events = scale_event_list(user=request.user, fleet=self.get_object())
        page = self.paginate_queryset(events)
        return self.get_paginated_response(s.ScaleEventSerializer(page, many=True).data)
