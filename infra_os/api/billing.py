"""Billing API: pricing plans and their rates, reservations, invoices (rate, close, CSV and PDF)
and a usage summary. Decimal values are strings ("12.500000"), never floats."""

import json
from datetime import timedelta

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from infra_os import selectors_billing as selectors
from infra_os.api.serializers import CallerTenantField
from infra_os.api.viewsets import ScopedViewSet
from infra_os.choices import RatedResource
from infra_os.filtersets import InvoiceFilterSet, ReservationFilterSet
from infra_os.invoice_export import invoice_csv, invoice_filename, invoice_pdf
from infra_os.models import Invoice, InvoiceLine, PricingPlan, PricingRate, Reservation
from infra_os.services.billing import (
    current_month,
    invoice_close,
    invoice_note,
    invoice_rate,
    parse_month,
    pricing_plan_create,
    pricing_plan_delete,
    pricing_plan_update,
    pricing_rate_delete,
    pricing_rate_set,
    reservation_create,
    reservation_delete,
    tenant_set_pricing_plan,
)
from infra_os.services.rating import next_month

MONEY = {"max_digits": 16, "decimal_places": 2}
QUANTITY = {"max_digits": 20, "decimal_places": 6}
PRICE = {"max_digits": 14, "decimal_places": 6}


# Serializers ----------------------------------------------------------------------------------


@extend_schema_field(OpenApiTypes.STR)
class MonthField(serializers.Field):
    """A month as "YYYY-MM" (stored as its first day)."""

    def to_representation(self, value):
        return f"{value:%Y-%m}"

    def to_internal_value(self, data):
        try:
            return parse_month(str(data))
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["month"]) from None


class PricingRateSerializer(serializers.ModelSerializer):
    class Meta:
        model = PricingRate
        fields = ["id", "resource", "match", "unit_price"]


class PricingPlanSerializer(serializers.ModelSerializer):
    rates = PricingRateSerializer(many=True, read_only=True)

    class Meta:
        model = PricingPlan
        fields = ["id", "name", "description", "currency", "is_default", "rates", "created_at",
                  "updated_at"]


class PricingPlanCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                        default="")
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", default="USD",
                                      help_text="An ISO 4217 code, e.g. USD.")
    is_default = serializers.BooleanField(
        default=False, help_text="Bill tenants without a plan of their own on this one (it "
        "stops being the default of any other plan).")


class PricingPlanUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", required=False)
    is_default = serializers.BooleanField(required=False)


class PricingRateSetSerializer(serializers.Serializer):
    resource = serializers.ChoiceField(choices=RatedResource.choices)
    match = serializers.CharField(
        max_length=64, required=False, allow_blank=True, default="",
        help_text="A GPU model (a model name for tokens); empty: any other.")
    unit_price = serializers.DecimalField(min_value=0, help_text="Per unit: GPU-hour, "
                                          "server-hour, million tokens or GPU-month.", **PRICE)


class PlanAssignSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    plan = serializers.SlugRelatedField(
        slug_field="name", queryset=PricingPlan.objects.all(), allow_null=True,
        help_text="The plan's name; null: bill the tenant on the default plan.")


class ReservationSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Reservation
        fields = ["id", "tenant", "gpu_model", "gpus", "starts_on", "ends_on", "created_at"]


class ReservationCreateSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    gpu_model = serializers.CharField(max_length=64)
    gpus = serializers.IntegerField(min_value=1)
    starts_on = serializers.DateField()
    ends_on = serializers.DateField(required=False, allow_null=True, default=None,
                                    help_text="The last day included; null: until deleted.")


class InvoiceLineSerializer(serializers.ModelSerializer):
    quantity = serializers.DecimalField(**QUANTITY)
    unit_price = serializers.DecimalField(**PRICE)
    amount = serializers.DecimalField(**MONEY)

    class Meta:
        model = InvoiceLine
        fields = ["position", "resource", "match", "description", "quantity", "unit",
                  "unit_price", "amount"]


class InvoiceSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    month = MonthField(read_only=True)
    total = serializers.DecimalField(read_only=True, **MONEY)
    line_count = serializers.IntegerField(read_only=True)
    closed_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    note = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = ["id", "tenant", "month", "time_zone", "period_start", "period_end",
                  "plan_name", "currency", "state", "total", "line_count", "rated_at",
                  "closed_at", "closed_by", "note"]

    def get_note(self, invoice) -> str:
        return invoice_note(invoice)


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = InvoiceLineSerializer(many=True, read_only=True)

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines"]


class RateKeySerializer(serializers.Serializer):
    resource = serializers.ChoiceField(choices=RatedResource.choices)
    match = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")


class InvoiceRateSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    month = MonthField(help_text='The month to bill, "YYYY-MM", in the billing time zone.')


class UsageQuerySerializer(serializers.Serializer):
    tenant = CallerTenantField()
    to = serializers.DateField(required=False, help_text="The last day (inclusive); default: "
                               "the last day of the month of `from`.")

    def get_fields(self):
        fields = super().get_fields()
        # `from` is a Python keyword: it cannot be a class attribute.
        return {"tenant": fields["tenant"],
                "from": serializers.DateField(required=False, help_text="The first day; "
                                              "default: the first day of this month."),
                "to": fields["to"]}

    def validate(self, attrs):
        start = attrs.get("from") or current_month()
        end = attrs.get("to") or next_month(start.replace(day=1)) - timedelta(days=1)
        if end < start:
            raise serializers.ValidationError({"to": "The last day is before the first."})
        if (end - start).days + 1 > selectors.MAX_USAGE_DAYS:
            raise serializers.ValidationError(
                {"to": f"Ask for at most {selectors.MAX_USAGE_DAYS} days at once."})
        attrs["from"], attrs["to"] = start, end
        return attrs


class UsageDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    gpu_hours = serializers.DecimalField(**QUANTITY)
    server_hours = serializers.DecimalField(**QUANTITY)
    tokens = serializers.DecimalField(max_digits=24, decimal_places=0)


class UsageResourceSerializer(serializers.Serializer):
    resource = serializers.ChoiceField(choices=selectors.USAGE_RESOURCE_CHOICES)
    label = serializers.CharField()
    unit = serializers.CharField()
    total = serializers.DecimalField(max_digits=24, decimal_places=6)
    by_key = serializers.DictField(
        child=serializers.DecimalField(max_digits=24, decimal_places=6),
        help_text="Per GPU model (model name for tokens); an empty key: not recorded.")


class UsageSummarySerializer(serializers.Serializer):
    tenant = serializers.CharField()
    time_zone = serializers.CharField()
    start = serializers.DateField(help_text="The first day.")
    end = serializers.DateField(help_text="The last day (inclusive).")
    days = UsageDaySerializer(many=True)
    resources = UsageResourceSerializer(many=True)


# Renderers of the downloads -------------------------------------------------------------------


class _DownloadRenderer(BaseRenderer):
    """Lets a client ask for the file's media type; errors still come as the JSON envelope."""

    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, bytes | str):
            return data
        return json.dumps(data).encode()


class CsvRenderer(_DownloadRenderer):
    media_type = "text/csv"
    format = "csv"


class PdfRenderer(_DownloadRenderer):
    media_type = "application/pdf"
    format = "pdf"


def _attachment(content, *, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# Views ----------------------------------------------------------------------------------------


class PricingPlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Pricing plans and their rates. Platform admins see and change every plan; others see the
    plans their tenants are billed on."""

    selector = selectors.pricing_plan_list
    output_serializer_class = PricingPlanSerializer
    input_serializer_classes = {
        "create": PricingPlanCreateSerializer,
        "update": PricingPlanUpdateSerializer,
        "partial_update": PricingPlanUpdateSerializer,
        "rates": PricingRateSetSerializer,
        "assign": PlanAssignSerializer,
    }
    tenant_field = None
    platform_admin_actions = ("create", "update", "partial_update", "destroy", "rates",
                              "assign")

    @extend_schema(request=PricingPlanCreateSerializer, responses={201: PricingPlanSerializer})
    def create(self, request):
        plan = pricing_plan_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(plan), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=PricingPlanUpdateSerializer, responses=PricingPlanSerializer)
    def update(self, request, pk=None):
        plan = pricing_plan_update(actor=request.user, plan=self.get_object(),
                                   **self.validated_input(partial=True))
        return self.respond(self.reload(plan))

    @extend_schema(request=PricingPlanUpdateSerializer, responses=PricingPlanSerializer)
    def partial_update(self, request, pk=None):
        return self.update(request, pk=pk)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        pricing_plan_delete(actor=request.user, plan=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["POST"], request=PricingRateSetSerializer,
                   responses=PricingPlanSerializer,
                   description="Set the price of a resource (for a GPU model or model name, or "
                   "for any other): creates the rate or changes its price. Answers with the "
                   "whole plan.")
    @extend_schema(methods=["DELETE"], request=None, parameters=[RateKeySerializer],
                   responses=PricingPlanSerializer,
                   description="Delete the rate of `resource` for `match` (empty: the "
                   "catch-all). Answers with the whole plan.")
    @action(detail=True, methods=["post", "delete"])
    def rates(self, request, pk=None):
        plan = self.get_object()
        if request.method == "DELETE":
            key = RateKeySerializer(data=request.query_params)
            key.is_valid(raise_exception=True)
            rate = plan.rates.filter(**key.validated_data).first()
            if rate is None:
                raise NotFound(f"Plan {plan.name} has no rate for "
                               f"{key.validated_data['resource']} "
                               f"{key.validated_data['match'] or '(any other)'}.")
            pricing_rate_delete(actor=request.user, rate=rate)
        else:
            pricing_rate_set(actor=request.user, plan=plan, **self.validated_input())
        return self.respond(self.reload(plan))

    @extend_schema(request=PlanAssignSerializer, responses={204: None})
    @action(detail=False, methods=["post"])
    def assign(self, request):
        """Bill a tenant on a plan (or, with `plan: null`, on the default plan)."""
        data = self.validated_input()
        tenant_set_pricing_plan(actor=request.user, tenant=data["tenant"], plan=data["plan"])
        return Response(status=status.HTTP_204_NO_CONTENT)


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """GPUs of a model reserved for a tenant, billed per month at the plan's reserved price;
    the GPU-hours they cover are not billed again. Platform admins create and delete them."""

    selector = selectors.reservation_list
    output_serializer_class = ReservationSerializer
    input_serializer_classes = {"create": ReservationCreateSerializer}
    filterset_class = ReservationFilterSet
    platform_admin_actions = ("create", "destroy")

    @extend_schema(request=ReservationCreateSerializer, responses={201: ReservationSerializer})
    def create(self, request):
        reservation = reservation_create(actor=request.user, **self.validated_input())
        return self.respond(reservation, http_status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        reservation_delete(actor=request.user, reservation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvoiceViewSet(mixins.ListModelMixin, ScopedViewSet):
    """Monthly invoices of the caller's tenants. A tenant admin (or a platform admin) rates a
    month into a draft (`POST invoices/rate/`), again as often as needed; a platform admin closes
    it once the month is over, and a closed invoice never changes."""

    selector = selectors.invoice_list
    output_serializer_class = InvoiceSerializer
    input_serializer_classes = {"rate": InvoiceRateSerializer}
    filterset_class = InvoiceFilterSet
    platform_admin_actions = ("close",)

    def _detail(self, invoice):
        return selectors.invoice_detail(user=self.request.user, pk=invoice.pk)

    @extend_schema(responses=InvoiceDetailSerializer)
    def retrieve(self, request, pk=None):
        return self.respond(self._detail(self.get_object()), serializer=InvoiceDetailSerializer)

    @extend_schema(request=InvoiceRateSerializer, responses=InvoiceDetailSerializer)
    @action(detail=False, methods=["post"])
    def rate(self, request):
        """Rate a tenant's month into its draft invoice (created if need be; its lines are
        replaced). A closed invoice is answered as it is. Tenant admins and platform admins."""
        data = self.validated_input()
        invoice = invoice_rate(actor=request.user, tenant=data["tenant"], month=data["month"])
        return self.respond(self._detail(invoice), serializer=InvoiceDetailSerializer)

    @extend_schema(request=None, responses=InvoiceDetailSerializer)
    @action(detail=True, methods=["post"])
    def close(self, request, pk=None):
        """Rate the draft a last time and close it; only after its month is over."""
        invoice = invoice_close(actor=request.user, invoice=self.get_object())
        return self.respond(self._detail(invoice), serializer=InvoiceDetailSerializer)

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(
        response=OpenApiTypes.STR, description="A header, one row per line, a total row.")})
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, CsvRenderer])
    def csv(self, request, pk=None):
        invoice = self._detail(self.get_object())
        return _attachment(invoice_csv(invoice), content_type="text/csv; charset=utf-8",
                           filename=invoice_filename(invoice, "csv"))

    @extend_schema(responses={(200, "application/pdf"): OpenApiResponse(
        response=OpenApiTypes.BINARY, description="The invoice as a PDF document.")})
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, PdfRenderer])
    def pdf(self, request, pk=None):
        invoice = self._detail(self.get_object())
        return _attachment(invoice_pdf(invoice), content_type="application/pdf",
                           filename=invoice_filename(invoice, "pdf"))


class UsageView(APIView):
    """A tenant's usage per day in the billing time zone: GPU-hours of jobs, server-hours of
    leases and tokens through the gateway, with totals per resource and per GPU model (or model
    name)."""

    @extend_schema(parameters=[UsageQuerySerializer], responses=UsageSummarySerializer)
    def get(self, request):
        query = UsageQuerySerializer(data=request.query_params, context={"request": request})
        query.is_valid(raise_exception=True)
        start, last = query.validated_data["from"], query.validated_data["to"]
        summary = selectors.usage_by_day(user=request.user,
                                         tenant=query.validated_data["tenant"], start=start,
                                         end=last + timedelta(days=1))
        data = {
            "tenant": summary.tenant.name, "time_zone": summary.time_zone, "start": start,
            "end": last, "days": summary.rows(),
            "resources": [{"resource": series.resource, "label": series.label,
                           "unit": series.unit, "total": series.total,
                           "by_key": series.key_totals()} for series in summary.series],
        }
        return Response(UsageSummarySerializer(data).data)
