"""A node's page (platform admins only): its facts and the CPU cores and memory jobs hold on it,
whether it takes work (and who cordoned it, why), its health checks with their history, and its
metrics over time as charts (no GPU charts on a node without GPUs). Health checks run through
podsys.services.health; reads go through podsys.selectors."""

from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from frontend.allocations import Held, cpu_usage, memory_usage, node_allocations, rdma_usage
from frontend.charts_podsys import time_lines_svg
from frontend.responses import wants_partial
from infra_os.access import require_platform_admin
from podsys.choices import CheckState
from podsys.metric_names import NODE_METRICS
from podsys.selectors import (
    MetricsUnavailable,
    cluster_list,
    health_check_history,
    node_health_summary,
    node_list,
    node_metric_series,
)
from podsys.services.health import health_check_run_now

# The windows the charts offer, the first the default.
RANGES = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24)}
DEFAULT_RANGE = "1h"
# How often the health area asks for itself while a check is pending or running, and the
# metrics area for new readings.
HEALTH_POLL_S = 3
METRICS_POLL_S = 30
HISTORY_LIMIT = 50
UNSETTLED = {CheckState.PENDING, CheckState.RUNNING}
# Units shown in a handier scale: (factor, unit shown).
UNIT_SCALES = {
    "bytes": (1 / 2**30, "GiB"), "B": (1 / 2**30, "GiB"),
    "MiB": (1 / 1024, "GiB"),
    "bytes/s": (1e-6, "MB/s"), "B/s": (1e-6, "MB/s"),
    # CPU seconds per second, by mode: how many CPUs were busy in it.
    "s/s": (1.0, "CPUs"),
}


def _node(request, name: str, pk: int):
    require_platform_admin(request.user)
    cluster = get_object_or_404(cluster_list(user=request.user), name=name)
    node = get_object_or_404(node_list(user=request.user).filter(cluster_id=cluster.pk), pk=pk)
    return cluster, node


# Health

@dataclass(frozen=True)
class HealthRow:
    name: str
    label: str
    severity: str
    latest: object  # HealthCheckRun | None
    failures_in_row: int
    # Why its pending run waits ("deferred: node busy ..."); "" when nothing waits.
    deferred: str = ""

    @property
    def settling(self) -> bool:
        return self.latest is not None and self.latest.state in UNSETTLED


def health_rows(node) -> list[HealthRow]:
    rows = []
    for item in node_health_summary(node=node):
        rows.append(HealthRow(
            name=item["name"],
            label=item.get("label") or item["name"],
            severity=item.get("severity", ""),
            latest=item.get("latest"),
            failures_in_row=int(item.get("consecutive_failures") or 0),
            deferred=item.get("deferred") or "",
        ))
    return rows


def _health_context(node) -> dict:
    rows = health_rows(node)
    return {"health": rows, "health_live": any(row.settling for row in rows),
            "health_poll_s": HEALTH_POLL_S}


# Metrics

@dataclass(frozen=True)
class MetricChart:
    name: str
    label: str
    unit: str
    per_gpu: bool
    svg: SafeString
    readings: int  # points drawn, every line together


def _rate(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A counter's increase per second between readings; a reset (the value fell) is dropped."""
    rates = []
    for (t0, v0), (t1, v1) in pairwise(points):
        if t1 > t0 and v1 >= v0:
            rates.append((t1, (v1 - v0) / (t1 - t0)))
    return rates


def _series_label(key: str, metric) -> str:
    if key == "":
        return "node" if not metric.per_gpu else "all GPUs"
    return f"GPU {key}" if key.isdigit() else key


def _gpu_order(key: str) -> tuple:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def charted_metrics(node) -> list:
    """The metrics the node's page draws: a node without GPUs has no GPU series to draw."""
    return [metric for metric in NODE_METRICS if node.gpus or not metric.per_gpu]


def metric_charts(node, range_key: str) -> list[MetricChart]:
    """One chart per metric of NODE_METRICS, one line per GPU. Counters named the Prometheus
    way (`…_total`, node exporter's) are drawn as a rate; DCGM's error counters as counts."""
    now = timezone.now()
    since = now - RANGES[range_key]
    metrics = charted_metrics(node)
    data = node_metric_series(node=node, names=[metric.name for metric in metrics], since=since)
    charts = []
    for metric in metrics:
        by_key = data.get(metric.name) or {}
        unit = metric.unit
        as_rate = metric.kind == "counter" and metric.name.endswith("_total")
        if as_rate:
            unit = f"{unit}/s" if unit else "per second"
        factor, unit = UNIT_SCALES.get(unit, (1.0, unit))
        series = []
        for key in sorted(by_key, key=_gpu_order):
            points = sorted((float(t), float(v)) for t, v in by_key[key])
            if as_rate:
                points = _rate(points)
            points = [(t, v * factor) for t, v in points]
            label = _series_label(key, metric)
            series.append((label, points))
        title = f"{node.name}: {metric.label}"
        charts.append(MetricChart(
            name=metric.name, label=metric.label, unit=unit, per_gpu=metric.per_gpu,
            svg=time_lines_svg(series=series, start=since, end=now, unit=unit, title=title),
            readings=sum(len(points) for _, points in series),
        ))
    return charts


def _metrics_context(request, node) -> dict:
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        range_key = DEFAULT_RANGE
    try:
        charts, error = metric_charts(node, range_key), ""
    except MetricsUnavailable as exc:
        charts, error = [], str(exc)
    return {"charts": charts, "metrics_error": error, "range": range_key,
            "ranges": list(RANGES), "metrics_poll_s": METRICS_POLL_S}


# Views

@login_required
def node_detail(request, name: str, pk: int):
    """The node's page. `?part=health` (the checks, polling while one runs), `?part=history`
    (`&check=` one check's runs) and `?part=metrics` (`&range=1h|6h|24h`) answer an htmx request
    with that area alone."""
    cluster, node = _node(request, name, pk)
    part = request.GET.get("part", "") if wants_partial(request) else ""
    held = node_allocations([cluster.pk]).get((cluster.pk, node.name), Held())
    context = {"cluster": cluster, "node": node, "gpus_held": held.gpus,
               "cpu": cpu_usage(node, held), "memory": memory_usage(node, held),
               "rdma": rdma_usage(node, held)}
    if part == "health":
        template = "frontend/podsys/nodes/health.html"
        context |= _health_context(node)
    elif part == "history":
        template = "frontend/podsys/nodes/history.html"
        context |= _history_context(request, node)
    elif part == "metrics":
        template = "frontend/podsys/nodes/metrics.html"
        context |= _metrics_context(request, node)
    else:
        template = "frontend/podsys/nodes/detail.html"
        context |= _health_context(node) | _history_context(request, node) \
            | _metrics_context(request, node)
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _history_context(request, node) -> dict:
    check = request.GET.get("check") or None
    runs = list(health_check_history(node=node, check_name=check, limit=HISTORY_LIMIT))
    return {"history": runs, "history_check": check or ""}


@login_required
@require_POST
def node_check_view(request, name: str, pk: int):
    """Run one check (`check`) or every check on the node now."""
    cluster, node = _node(request, name, pk)
    check = request.POST.get("check") or None
    try:
        runs = health_check_run_now(actor=request.user, node=node, check_name=check)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        what = f"Check {check}" if check else f"{len(runs)} check{'s' if len(runs) != 1 else ''}"
        messages.success(request, f"{what} started on {node.name}: the results show below as "
                         "they come in.")
    return redirect("frontend:node", name=cluster.name, pk=node.pk)
