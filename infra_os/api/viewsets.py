"""The base of every tenant-scoped API viewset, in every layer.

A viewset names its selector (the scoped read), its output serializer and, per action, an input
serializer. Writes go through services; the viewset only validates and answers.
"""

from rest_framework import status, viewsets
from rest_framework.response import Response

from infra_os.api.permissions import TenantRolePermission
from ogai.api.input import refuse_unknown_fields


class ScopedViewSet(viewsets.GenericViewSet):
    permission_classes = [TenantRolePermission]
    selector = None  # a selector function taking user=, returning a scoped queryset
    output_serializer_class = None
    input_serializer_classes: dict = {}

    def get_queryset(self):
        return type(self).selector(user=self.request.user)

    def get_serializer_class(self):
        return self.input_serializer_classes.get(self.action, self.output_serializer_class)

    def validated_input(self, *, partial: bool = False) -> dict:
        serializer = self.get_serializer(data=self.request.data, partial=partial)
        refuse_unknown_fields(self.request.data, serializer.fields)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def respond(self, instance, *, http_status: int = status.HTTP_200_OK, serializer=None):
        serializer_class = serializer or self.output_serializer_class
        data = serializer_class(instance, context=self.get_serializer_context()).data
        return Response(data, status=http_status)

    def reload(self, instance):
        """The instance as the list shows it (with the selector's annotations)."""
        return self.get_queryset().get(pk=instance.pk)
