"""The log search page: every job's output and, for platform admins, the platform's own lines,
searched inside what the user may see. Reads go through aistation.selectors_logs, which scope
every read to the caller (members: their tenants' jobs; platform admins: everything).

One view serves the page and its parts: an htmx search answers with the results area alone,
`?part=context` with the lines around one hit, `?part=tail` with the lines after the newest one
shown (the live tail polls it).
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from aistation.logstore.base import StoredLine, StoreDown
from aistation.logstore.query import Phrase, highlight_spans
from aistation.selectors_logs import log_around, log_histogram, log_search, visible_job
from frontend.access import current_tenant
from frontend.charts_logs import log_histogram_svg
from frontend.forms_logs import CUSTOM_RANGE, RANGES, LogContextForm, LogSearchForm, LogTailForm
from frontend.responses import wants_partial
from infra_os.access import is_platform_admin
from infra_os.models import Tenant

PAGE_TEMPLATE = "frontend/logs/page.html"
RESULTS_TEMPLATE = "frontend/logs/results.html"
CONTEXT_TEMPLATE = "frontend/logs/context.html"
TAIL_TEMPLATE = "frontend/logs/tail_lines.html"
HITS_SHOWN = 100
# The most lines one poll of the tail brings; more come with the next poll.
TAIL_BATCH = 200
TAIL_POLL_S = 2
CONTEXT_LINES = 20
BUCKETS = 60
STORE_DOWN = ("The log store cannot be reached, so nothing can be searched right now. Job "
              "output is kept and ingested when it returns: try again shortly.")


def highlighted(message: str, phrases: tuple[Phrase, ...]) -> SafeString:
    """The line, HTML-escaped, with the words searched for in <mark>."""
    pieces, at = [], 0
    for start, end in highlight_spans(message, phrases):
        pieces.append(escape(message[at:start]))
        pieces.append(format_html("<mark>{}</mark>", message[start:end]))
        at = end
    pieces.append(escape(message[at:]))
    return mark_safe("".join(pieces))  # noqa: S308 - every piece is escaped above


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Hit:
    line: StoredLine
    html: SafeString
    # The job's tenant when it is not the one the console shows (its job page is there).
    tenant: str
    job_url: str
    context_url: str

    @property
    def level_tone(self) -> str:
        return {"critical": "danger", "error": "danger", "warning": "warning",
                "debug": "muted"}.get(self.line.level, "info")


def _hits(request, lines: list[StoredLine], phrases: tuple[Phrase, ...], q: str) -> list[Hit]:
    tenant = current_tenant(request)
    others = {line.tenant_id for line in lines} - {None, tenant.pk if tenant else None}
    names = dict(Tenant.objects.filter(pk__in=others).values_list("pk", "name")) \
        if others else {}
    hits = []
    for line in lines:
        job_url = context_url = ""
        if line.job_id is not None and line.tenant_id is not None:
            if line.tenant_id not in names:
                # The job page shows the current tenant's jobs: link only those.
                job_url = reverse("frontend:job", args=[line.job_id]) + "?" + urlencode(
                    {"attempt": line.attempt or "", "replica": line.replica or 0})
            if line.attempt is not None and line.line_no is not None:
                context_url = request.path + "?" + urlencode({
                    "part": "context", "job": line.job_id, "attempt": line.attempt,
                    "replica": line.replica or 0, "line": line.line_no, "q": q})
        hits.append(Hit(line=line, html=highlighted(line.message, phrases),
                        tenant=names.get(line.tenant_id, ""), job_url=job_url,
                        context_url=context_url))
    return hits


def _search_params(form: LogSearchForm) -> dict:
    """The search's own parameters (not its time), for the links the page builds."""
    data = form.cleaned_data
    params = {"q": data.get("q", ""), "job": data.get("job") or "",
              "level": data.get("level", ""), "source": data.get("source", ""),
              "request_id": data.get("request_id", "")}
    return {key: value for key, value in params.items() if value}


def _tail_url(request, form: LogSearchForm, since: datetime, after: int) -> str:
    params = {"part": "tail", **_search_params(form), "since": _iso(since), "after": after}
    return request.path + "?" + urlencode(params)


def _search(request) -> dict:
    operator = is_platform_admin(request.user)
    form = LogSearchForm.with_defaults(request.GET, operator=operator)
    context = {"form": form, "operator": operator, "ranges": RANGES, "hits": [],
               "chart": None, "store_down": "", "searched": False,
               "tail_poll_s": TAIL_POLL_S, "context_lines": CONTEXT_LINES}
    if not form.is_valid():
        return context
    job = None
    if form.cleaned_data.get("job"):
        try:
            job = visible_job(request.user, form.cleaned_data["job"])
        except Http404:
            # A job the user may not see reads like one that does not exist.
            form.add_error("job", f"No job {form.cleaned_data['job']}.")
            return context
    window = form.window(now=timezone.now(), job=job)
    query = form.query(since=window.since, until=window.until, limit=HITS_SHOWN)
    try:
        lines = log_search(request.user, query)
        buckets = log_histogram(request.user, query, window.since, window.end, BUCKETS)
    except StoreDown:
        context["store_down"] = STORE_DOWN
        return context
    base = _search_params(form)

    def zoom_url(start: datetime, end: datetime) -> str:
        return request.path + "?" + urlencode(
            {**base, "range": CUSTOM_RANGE, "since": _iso(start), "until": _iso(end)})

    total = sum(bucket.count for bucket in buckets)
    live = form.cleaned_data["live"] and window.until is None
    context |= {
        "searched": True,
        "job": job,
        "window": window,
        "custom": window.key == CUSTOM_RANGE,
        "hits": _hits(request, lines, form.phrases, form.cleaned_data["q"]),
        "total": total,
        "more": len(lines) >= HITS_SHOWN,
        "chart": log_histogram_svg(buckets=buckets, since=window.since, until=window.end,
                                   title=f"Matching lines, {total} in all",
                                   zoom_url=zoom_url),
        "live": live,
        "tail_url": _tail_url(request, form, window.since,
                              max((line.id for line in lines), default=0)) if live else "",
    }
    return context


def _context_response(request):
    """`?part=context`: the lines around one line of a replica's log, that line emphasised."""
    form = LogContextForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest("Name the job, attempt, replica and line.")
    data = form.cleaned_data
    context = {"line_no": data["line"], "lines": [], "store_down": ""}
    try:
        lines = log_around(request.user, job_id=data["job"], attempt=data["attempt"],
                           replica=data["replica"], line_no=data["line"],
                           before=CONTEXT_LINES, after=CONTEXT_LINES)
    except StoreDown:
        context["store_down"] = STORE_DOWN
    else:
        context["lines"] = [(line, highlighted(line.message, data["q"])) for line in lines]
    return render(request, CONTEXT_TEMPLATE, context)


def _tail_response(request):
    """`?part=tail`: the lines after `after` that match the search, newest first, and the
    poller again, now after the newest of them."""
    operator = is_platform_admin(request.user)
    form = LogSearchForm.with_defaults(request.GET, operator=operator)
    position = LogTailForm(request.GET)
    if not (form.is_valid() and position.is_valid()):
        return HttpResponseBadRequest("Not a search the tail can follow.")
    after = position.cleaned_data["after"]
    since = form.cleaned_data.get("since")
    if since is None:
        return HttpResponseBadRequest("The tail needs the time its search began.")
    query = form.query(since=since, until=None, limit=TAIL_BATCH, after_id=after)
    note = ""
    try:
        lines = log_search(request.user, query)  # a job not visible is a 404, as anywhere
    except StoreDown:
        lines, note = [], "The log store cannot be reached; trying again."
    newest = max((line.id for line in lines), default=after)
    hits = _hits(request, list(reversed(lines)), form.phrases, form.cleaned_data["q"])
    return render(request, TAIL_TEMPLATE, {
        "hits": hits, "operator": operator, "tail_url": _tail_url(request, form, since, newest),
        "tail_note": note, "tail_poll_s": TAIL_POLL_S, "context_lines": CONTEXT_LINES,
        "oob": True})


@login_required
def logs(request):
    """The page; for htmx, the results area alone. `?part=context` and `?part=tail` are its
    parts (see the module's docstring)."""
    part = request.GET.get("part", "")
    if part == "context":
        response = _context_response(request)
    elif part == "tail":
        response = _tail_response(request)
    else:
        template = RESULTS_TEMPLATE if wants_partial(request) else PAGE_TEMPLATE
        response = render(request, template, _search(request))
    # The same URL answers with a page or a part: caches must tell them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response
