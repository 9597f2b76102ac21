"""The log search page's forms. They check shapes only: which job a user may see, and which
lines, the selectors of aistation.selectors_logs decide."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django import forms
from django.core.exceptions import ValidationError
from rest_framework.exceptions import ValidationError as ApiValidationError

from aistation.api.serializers_logs import LEVELS, SOURCES, parse_moment
from aistation.logstore.base import LogQuery, Scope
from aistation.logstore.query import Phrase, QueryError, parse

# Ids are 64-bit in the database: a bigger number is no id, not a 500.
MAX_ID = 2**63 - 1
RANGES = {
    "15m": ("Last 15 minutes", timedelta(minutes=15)),
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
    "30d": ("Last 30 days", timedelta(days=30)),
}
DEFAULT_RANGE = "24h"
# With a job named and no range chosen, the page shows the job's whole life.
JOB_RANGE = "job"
CUSTOM_RANGE = "custom"
RANGE_CHOICES = [(key, label) for key, (label, _) in RANGES.items()] + [
    (JOB_RANGE, "Since the job was submitted"), (CUSTOM_RANGE, "Custom (since / until)")]
SOURCE_LABELS = {"job": "Jobs", "web": "Web", "worker": "Worker", "beat": "Beat"}


def _moment(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return parse_moment(text)
    except ApiValidationError as exc:
        raise ValidationError([str(message) for message in exc.detail]) from None


@dataclass(frozen=True)
class Window:
    """The time a search covers: `until` None is open (up to now, and new lines for the tail);
    `end` is where the histogram stops."""

    since: datetime
    until: datetime | None
    end: datetime
    key: str  # the range chosen: a key of RANGES, "job" or "custom"

    @property
    def label(self) -> str:
        if self.key in RANGES:
            return RANGES[self.key][0].lower()
        if self.key == JOB_RANGE:
            return "since the job was submitted"
        return "in the chosen time"


class LogSearchForm(forms.Form):
    q = forms.CharField(
        label="Search", required=False, max_length=1000,
        widget=forms.TextInput(attrs={"type": "search", "placeholder": 'NCCL "out of memory"',
                                      "autocomplete": "off"}),
        help_text='Words and "quoted phrases": a line has every one.')
    range = forms.ChoiceField(label="Time", choices=RANGE_CHOICES, required=False)
    since = forms.CharField(
        required=False, max_length=64,
        widget=forms.TextInput(attrs={"placeholder": "e.g. 2h"}),
        help_text="7d, 24h, 30m, 90s ago, or ISO 8601 (UTC unless it says otherwise).")
    until = forms.CharField(required=False, max_length=64,
                            widget=forms.TextInput(attrs={"placeholder": "empty: now"}))
    job = forms.IntegerField(label="Job", required=False, min_value=1, max_value=MAX_ID)
    level = forms.ChoiceField(choices=[("", "Any"), *((level, level) for level in LEVELS)],
                              required=False)
    # Platform admins only: the platform's own lines and the request they belong to.
    source = forms.ChoiceField(
        choices=[("", "Any"), *((source, SOURCE_LABELS[source]) for source in SOURCES)],
        required=False)
    request_id = forms.CharField(label="Request id", required=False, max_length=64)
    live = forms.BooleanField(label="Live tail", required=False,
                              help_text="Show new lines as they arrive.")

    def __init__(self, *args, operator: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.phrases: tuple[Phrase, ...] = ()
        if not operator:
            del self.fields["source"]
            del self.fields["request_id"]

    @classmethod
    def with_defaults(cls, params, *, operator: bool) -> "LogSearchForm":
        """Bound to the request's parameters, the range set so the page shows the one used:
        custom when a since or until is given, else the one picked, else the job's life with a
        job named, else the last 24 hours."""
        data = params.copy()
        if data.get("since") or data.get("until"):
            data["range"] = CUSTOM_RANGE
        elif not data.get("range"):
            if data.get("job"):
                data["range"] = JOB_RANGE
            else:
                data["range"] = DEFAULT_RANGE
        return cls(data, operator=operator)

    def clean_q(self) -> str:
        text = self.cleaned_data["q"]
        try:
            self.phrases = parse(text)
        except QueryError as exc:
            raise ValidationError(str(exc)) from None
        return text

    def clean_since(self) -> datetime | None:
        return _moment(self.cleaned_data["since"].strip())

    def clean_until(self) -> datetime | None:
        return _moment(self.cleaned_data["until"].strip())

    def clean(self):
        data = super().clean()
        key = data.get("range") or DEFAULT_RANGE
        since, until = data.get("since"), data.get("until")
        if since or until:
            key = CUSTOM_RANGE  # times typed in win over the range picked
        if key == CUSTOM_RANGE and since and until and since >= until:
            self.add_error("until", "Give an until after since.")
        if key == JOB_RANGE and not data.get("job") and "job" not in self.errors:
            self.add_error("range", "Name a job to search since it was submitted.")
        if data.get("live") and key == CUSTOM_RANGE and until:
            self.add_error("live", "A live tail follows new lines: leave until empty.")
        data["range"] = key
        return data

    def window(self, *, now: datetime, job=None) -> Window:
        """The time searched, once the form is valid (`job`: the job named, when one is)."""
        key = self.cleaned_data["range"]
        if key in RANGES:
            return Window(since=now - RANGES[key][1], until=None, end=now, key=key)
        if key == JOB_RANGE and job is not None:
            # From the minute it was submitted: its first lines come after that.
            since = job.created_at.replace(second=0, microsecond=0)
            return Window(since=since, until=None, end=max(now, since + timedelta(minutes=1)),
                          key=key)
        until = self.cleaned_data.get("until")
        since = self.cleaned_data.get("since") or (until or now) - RANGES[DEFAULT_RANGE][1]
        end = until or max(now, since + timedelta(minutes=1))
        return Window(since=since, until=until, end=end, key=CUSTOM_RANGE)

    def query(self, *, since: datetime | None, until: datetime | None, limit: int,
              after_id: int | None = None) -> LogQuery:
        data = self.cleaned_data
        # The selectors put in the caller's scope; this one sees nothing on its own.
        return LogQuery(scope=Scope(tenant_ids=frozenset()), phrases=self.phrases,
                        job_id=data.get("job"), level=data.get("level", ""),
                        source=data.get("source", ""), request_id=data.get("request_id", ""),
                        since=since, until=until, after_id=after_id, limit=limit)


class LogContextForm(forms.Form):
    """Which line of which replica log the context is read around."""

    job = forms.IntegerField(min_value=1, max_value=MAX_ID)
    attempt = forms.IntegerField(min_value=1, max_value=MAX_ID)
    replica = forms.IntegerField(min_value=0, max_value=MAX_ID)
    line = forms.IntegerField(min_value=1, max_value=MAX_ID)
    q = forms.CharField(required=False, max_length=1000)

    def clean_q(self) -> tuple[Phrase, ...]:
        try:
            return parse(self.cleaned_data["q"])
        except QueryError:
            return ()  # the words only mark the line: a query that does not parse marks none


class LogTailForm(forms.Form):
    """Where the tail is: the newest line shown."""

    after = forms.IntegerField(min_value=0, max_value=MAX_ID)
