"""`GET /api/v1/podsys/nodes/{id}/metrics/`: a node's metrics over time, for charts."""

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from podsys.metric_names import NODE_METRICS
from podsys.selectors_metrics import MAX_POINTS, MetricsUnavailable, node_metric_series

DEFAULT_SINCE_S = 3600
MAX_SINCE_S = 30 * 24 * 3600


class MetricsSourceUnavailable(APIException):
    status_code = 503
    default_code = "metrics_unavailable"
    default_detail = "The metrics source did not answer."


metrics_schema = extend_schema(
    parameters=[
        OpenApiParameter("names", str, description=(
            "Comma-separated metric names (DCGM exporter and node exporter names, e.g. "
            "DCGM_FI_DEV_GPU_UTIL,DCGM_FI_DEV_GPU_TEMP); default: every metric OGAI knows.")),
        OpenApiParameter("since", int, description=(
            f"The last this many seconds (60 to {MAX_SINCE_S}; default {DEFAULT_SINCE_S}).")),
    ],
    responses={200: OpenApiTypes.OBJECT},
    examples=[OpenApiExample("GPU utilisation of a 2-GPU node", response_only=True, value={
        "DCGM_FI_DEV_GPU_UTIL": {"0": [[1767225600.0, 97.0], [1767225630.0, 95.0]],
                                 "1": [[1767225600.0, 0.0], [1767225630.0, 0.0]]}})],
)


def _names(raw: str | None) -> list[str]:
    if raw is None or not raw.strip():
        return [metric.name for metric in NODE_METRICS]
    return list(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))


def _since(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_SINCE_S
    if not raw.isdecimal() or not 60 <= int(raw) <= MAX_SINCE_S:
        raise ValidationError({"since": f"Use a whole number of seconds from 60 to "
                                        f"{MAX_SINCE_S}."})
    return int(raw)


def node_metrics_response(request, node) -> Response:
    """{metric: {GPU index (or CPU mode, network device, ""): [[unix time, value], ...]}}, at
    most MAX_POINTS points a series; 503 when Prometheus fails."""
    since = timezone.now() - timedelta(seconds=_since(request.query_params.get("since")))
    try:
        series = node_metric_series(node=node, names=_names(request.query_params.get("names")),
                                    since=since)
    except MetricsUnavailable as exc:
        raise MetricsSourceUnavailable(str(exc)) from exc
    return Response({name: {key: [[when, value] for when, value in points[-MAX_POINTS:]]
                            for key, points in by_key.items()}
                     for name, by_key in series.items()})
