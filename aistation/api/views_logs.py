"""Searching the log store: `/api/v1/aistation/logs/` and its histogram and around actions."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from aistation.api import serializers_logs as s
from aistation.logstore.base import LogQuery, Scope, StoreDown
from aistation.selectors_logs import log_around, log_histogram, log_search, visible_job
from ogai.api.schema import OneObjectListSchema


class LogStoreUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "log_store_unavailable"
    default_detail = "The log store cannot be reached; job output is kept and ingested when " \
                     "it returns. Try again shortly."


def _query(params: s.LogSearchParamsSerializer) -> LogQuery:
    data = params.validated_data
    return LogQuery(scope=Scope(tenant_ids=frozenset()), phrases=params.phrases,
                    job_id=data.get("job"), attempt=data.get("attempt"),
                    replica=data.get("replica"), level=data.get("level", ""),
                    source=data.get("source", ""), request_id=data.get("request_id", ""),
                    since=data.get("since"), until=data.get("until"), after_id=data.get("after"),
                    limit=data["limit"])


def _params(serializer_class, request):
    params = serializer_class(data=request.query_params)
    params.is_valid(raise_exception=True)
    return params


class LogViewSet(viewsets.ViewSet):
    """Every job's output and the platform's own lines, searched inside what the caller may
    see: a tenant's members its jobs' lines, platform admins everything."""

    schema = OneObjectListSchema()

    @extend_schema(parameters=[s.LogSearchParamsSerializer],
                   responses=s.LogSearchSerializer)
    def list(self, request):
        """Lines with every word and phrase of `q`, newest first (with `after`: the lines
        after that id, oldest first, for a live tail)."""
        params = _params(s.LogSearchParamsSerializer, request)
        query = _query(params)
        try:
            found = log_search(request.user, query)
        except StoreDown:
            raise LogStoreUnavailable() from None
        lines = s.LogLineSerializer(found, many=True, context={"phrases": params.phrases})
        return Response({"results": lines.data, "limit": query.limit,
                         "more": len(found) >= query.limit})

    @extend_schema(parameters=[s.LogHistogramParamsSerializer],
                   responses=s.LogHistogramSerializer)
    @action(detail=False, methods=["get"])
    def histogram(self, request):
        """How many lines match, per time bucket between since (default 24h ago) and until
        (default now)."""
        params = _params(s.LogHistogramParamsSerializer, request)
        query = _query(params)
        until = query.until or timezone.now()
        since = query.since or until - timedelta(days=1)
        buckets = params.validated_data["buckets"]
        try:
            found = log_histogram(request.user, query, since, until, buckets)
        except StoreDown:
            raise LogStoreUnavailable() from None
        return Response(s.LogHistogramSerializer({
            "since": since, "until": until,
            "bucket_seconds": (until - since).total_seconds() / buckets,
            "buckets": found, "total": sum(bucket.count for bucket in found)}).data)

    @extend_schema(parameters=[s.LogAroundParamsSerializer], responses=s.LogAroundSerializer)
    @action(detail=False, methods=["get"])
    def around(self, request):
        """The lines before and after one line of a job's replica log."""
        params = _params(s.LogAroundParamsSerializer, request)
        data = params.validated_data
        job = visible_job(request.user, data["job"])
        attempt = data.get("attempt") or (
            job.attempts.order_by("-number").values_list("number", flat=True).first())
        lines = []
        if attempt is not None:
            try:
                lines = log_around(request.user, job_id=job.pk, attempt=attempt,
                                   replica=data["replica"], line_no=data["line"],
                                   before=data["context"], after=data["context"])
            except StoreDown:
                raise LogStoreUnavailable() from None
        phrases = params.phrases
        return Response({
            "job": job.pk, "attempt": attempt, "replica": data["replica"], "line": data["line"],
            "lines": s.LogLineSerializer(lines, many=True, context={"phrases": phrases}).data})
