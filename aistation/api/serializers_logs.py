"""The log search API's input (query parameters) and output."""

import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from aistation.logstore.base import MAX_LIMIT
from aistation.logstore.query import QueryError, highlight_spans, parse

RELATIVE = re.compile(r"^(\d{1,6})([smhdw])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
LEVELS = ("debug", "info", "warning", "error", "critical")
SOURCES = ("job", "web", "worker", "beat")


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """`7d`, `24h`, `30m`, `90s`, `2w` (that long ago) or an ISO 8601 time (UTC unless it
    says otherwise)."""
    now = now or timezone.now()
    found = RELATIVE.match(text.strip())
    if found:
        return now - timedelta(seconds=int(found[1]) * UNIT_SECONDS[found[2]])
    try:
        moment = parse_datetime(text.strip())
    except ValueError:
        moment = None
    if moment is None:
        raise serializers.ValidationError(
            "Give a time as 7d, 24h, 30m or 90s ago, or as ISO 8601 (2026-12-01T08:00:00Z).")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class MomentField(serializers.CharField):
    def to_internal_value(self, data):
        return parse_moment(super().to_internal_value(data))


class QueryTextMixin:
    """`q`, parsed once: its phrases are kept on the serializer as `phrases`."""

    phrases: tuple = ()

    def validate_q(self, value):
        try:
            self.phrases = parse(value)
        except QueryError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class LogSearchParamsSerializer(QueryTextMixin, serializers.Serializer):
    q = serializers.CharField(required=False, allow_blank=True, max_length=1000,
                              help_text='Words and "quoted phrases"; a line has every one.')
    job = serializers.IntegerField(required=False, min_value=1)
    attempt = serializers.IntegerField(required=False, min_value=1)
    replica = serializers.IntegerField(required=False, min_value=0)
    level = serializers.ChoiceField(LEVELS, required=False)
    source = serializers.ChoiceField(SOURCES, required=False,
                                     help_text="job: jobs' output; web, worker, beat: the "
                                     "platform's own lines (platform admins).")
    request_id = serializers.CharField(required=False, max_length=64)
    since = MomentField(required=False, help_text="7d, 24h, 30m, 90s ago, or ISO 8601.")
    until = MomentField(required=False, help_text="Like since; lines before it.")
    after = serializers.IntegerField(required=False, min_value=0,
                                     help_text="Live tail: lines after this id, oldest first.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT,
                                     default=100)

    def validate(self, attrs):
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and since >= until:
            raise serializers.ValidationError({"until": "Give an until after since."})
        if ("attempt" in attrs or "replica" in attrs) and "job" not in attrs:
            raise serializers.ValidationError({"job": "Name the job of the attempt or replica."})
        return attrs


class LogHistogramParamsSerializer(LogSearchParamsSerializer):
    buckets = serializers.IntegerField(required=False, min_value=1, max_value=500, default=60)


class LogAroundParamsSerializer(QueryTextMixin, serializers.Serializer):
    job = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(required=False, min_value=1,
                                       help_text="Default: the newest attempt.")
    replica = serializers.IntegerField(required=False, min_value=0, default=0)
    line = serializers.IntegerField(min_value=1)
    context = serializers.IntegerField(required=False, min_value=0, max_value=1000, default=100,
                                       help_text="Lines before and after (default 100).")
    q = serializers.CharField(required=False, allow_blank=True, max_length=1000,
                              help_text="Words to highlight.")


class LogLineSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    ts = serializers.DateTimeField()
    tenant = serializers.IntegerField(source="tenant_id", allow_null=True)
    job = serializers.IntegerField(source="job_id", allow_null=True)
    attempt = serializers.IntegerField(allow_null=True)
    replica = serializers.IntegerField(allow_null=True)
    line = serializers.IntegerField(source="line_no", allow_null=True)
    stream = serializers.CharField()
    level = serializers.CharField()
    source = serializers.CharField()
    request_id = serializers.CharField(allow_blank=True)
    context = serializers.CharField(allow_blank=True,
                                    help_text="A platform line's context, as JSON.")
    message = serializers.CharField(allow_blank=True)
    highlights = serializers.SerializerMethodField(
        help_text="[start, end) character spans of the words searched for.")

    def get_highlights(self, line) -> list[list[int]]:
        phrases = self.context.get("phrases") or ()
        return [list(span) for span in highlight_spans(line.message, phrases)]


class LogSearchSerializer(serializers.Serializer):
    results = LogLineSerializer(many=True)
    limit = serializers.IntegerField()
    more = serializers.BooleanField(help_text="There may be more: narrow the time or page "
                                    "with until.")


class LogBucketSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    count = serializers.IntegerField()


class LogHistogramSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    bucket_seconds = serializers.FloatField()
    buckets = LogBucketSerializer(many=True)
    total = serializers.IntegerField()


class LogAroundSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    attempt = serializers.IntegerField(allow_null=True)
    replica = serializers.IntegerField()
    line = serializers.IntegerField()
    lines = LogLineSerializer(many=True)
