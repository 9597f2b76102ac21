"""A node's metrics over time, for charts: from Prometheus when OGAI_PROMETHEUS_URL is set,
else from the history OGAI keeps (`NodeMetricSnapshot`).

Both give the same shape, {metric: {series key: [(unix time, value), ...]}}, the key being the
GPU index for GPU metrics, the `mode` of CPU time, the `device` of network bytes, "" for the
rest; values as reported (counters as counts, not rates); at most MAX_POINTS points a series.

Prometheus is asked with `query_range`. The node is matched, in GPU series, by the label named
in the cluster's option `prometheus_node_label` (default "Hostname", which dcgm-exporter sets)
equal to the node's name; in node-exporter series, by `instance` being the node's address (or
name) with any port.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from podsys.metric_names import METRICS_BY_NAME, NodeMetric
from podsys.models import Node, NodeMetricSnapshot

MAX_POINTS = 300
PROMETHEUS_TIMEOUT_S = 10.0
DEFAULT_NODE_LABEL = "Hostname"

Series = dict[str, dict[str, list[tuple[float, float]]]]


class MetricsUnavailable(Exception):
    """The metrics source failed (Prometheus down or refusing the query); the message says so
    in a person's words."""


def node_metric_series(*, node: Node, names: list[str], since: datetime) -> Series:
    """Every name asked for is in the answer, with {} when nothing was recorded. Raises
    ValidationError for a name not in `podsys.metric_names`, MetricsUnavailable when
    Prometheus fails."""
    unknown = [name for name in names if name not in METRICS_BY_NAME]
    if unknown:
        raise ValidationError({"names": f"Unknown metric {unknown[0]!r}; use names from "
                                        "podsys.metric_names.NODE_METRICS."})
    now = timezone.now()
    if settings.OGAI_PROMETHEUS_URL:
        return _from_prometheus(node, names, since, now)
    return _from_history(node, names, since, now)


# The history -------------------------------------------------------------------------------


def _from_history(node: Node, names: list[str], since: datetime, now: datetime) -> Series:
    raw: Series = {name: {} for name in names}
    rows = (NodeMetricSnapshot.objects.filter(node=node, at__gte=since, at__lte=now)
            .order_by("at").values_list("at", "values"))
    for at, values in rows.iterator(chunk_size=500):
        when = at.timestamp()
        for name in names:
            for key, value in (values.get(name) or {}).items():
                raw[name].setdefault(key, []).append((when, float(value)))
    start, end = since.timestamp(), now.timestamp()
    return {name: {key: downsample(points, start, end, counter=METRICS_BY_NAME[name].kind ==
                                   "counter") for key, points in sorted(series.items())}
            for name, series in raw.items()}


def downsample(points: list[tuple[float, float]], start: float, end: float, *,
               counter: bool = False, limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most `limit` points: the range cut into `limit` equal buckets, each holding the mean
    of its points (a counter: its last point) at the time of its last point."""
    if len(points) <= limit or end <= start:
        return points[-limit:] if end <= start else points
    width = (end - start) / limit
    buckets: dict[int, list[tuple[float, float]]] = {}
    for when, value in points:
        index = min(limit - 1, max(0, int((when - start) / width)))
        buckets.setdefault(index, []).append((when, value))
    result = []
    for index in sorted(buckets):
        bucket = buckets[index]
        value = bucket[-1][1] if counter else sum(v for _, v in bucket) / len(bucket)
        result.append((bucket[-1][0], value))
    return result


# Prometheus --------------------------------------------------------------------------------


def _quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def promql(node: Node, metric: NodeMetric) -> str:
    """The query of one metric of one node, one result series per key (see module doc)."""
    if metric.per_gpu:
        label = str(node.cluster.options.get("prometheus_node_label") or DEFAULT_NODE_LABEL)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
            raise MetricsUnavailable(f"The cluster option prometheus_node_label={label!r} is "
                                     "not a Prometheus label name.")
        selector = f"{metric.name}{{{label}={_quote(node.name)}}}"
        # max: one value per GPU even where two exporters (or pod relabelling) report it.
        return f"max by (gpu) ({selector})"
    hosts = "|".join(re.escape(host) for host in dict.fromkeys([node.address or node.name,
                                                                 node.name]))
    selector = f"{metric.name}{{instance=~{_quote(f'({hosts})(:[0-9]+)?')}}}"
    if metric.key_label:
        return f"sum by ({metric.key_label}) ({selector})"
    return f"max({selector})"


def _from_prometheus(node: Node, names: list[str], since: datetime, now: datetime) -> Series:
    base = settings.OGAI_PROMETHEUS_URL.rstrip("/")
    start, end = since.timestamp(), now.timestamp()
    step = max(1, math.ceil((end - start) / (MAX_POINTS - 1)))
    queries = {name: promql(node, METRICS_BY_NAME[name]) for name in names}
    # In parallel, under one deadline: a page of ~20 charts must not wait 20 timeouts in a row.
    pool = ThreadPoolExecutor(max_workers=min(8, len(queries) or 1))
    try:
        with httpx.Client(timeout=PROMETHEUS_TIMEOUT_S) as client:
            futures = {name: pool.submit(_query_range, client, base, query, start, end, step)
                       for name, query in queries.items()}
            _, late = wait(futures.values(), timeout=PROMETHEUS_TIMEOUT_S)
            if late:
                raise MetricsUnavailable(f"Prometheus at {base} did not answer "
                                         f"{len(late)} queries within "
                                         f"{PROMETHEUS_TIMEOUT_S:g} s")
            matrices = {name: future.result() for name, future in futures.items()}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    result: Series = {}
    for name, matrix in matrices.items():
        metric = METRICS_BY_NAME[name]
        series: dict[str, list[tuple[float, float]]] = {}
        for item in matrix:
            key = str(item.get("metric", {}).get(metric.key, "")) if metric.key else ""
            points = [(float(t), float(v)) for t, v in item.get("values", [])
                      if math.isfinite(float(v))]
            series[key] = downsample(points, start, end, counter=metric.kind == "counter")
        result[name] = dict(sorted(series.items()))
    return result


def _query_range(client: httpx.Client, base: str, query: str, start: float, end: float,
                 step: int) -> list[dict]:
    try:
        response = client.get(f"{base}/api/v1/query_range",
                              params={"query": query, "start": f"{start:.3f}",
                                      "end": f"{end:.3f}", "step": str(step)})
    except httpx.HTTPError as exc:
        raise MetricsUnavailable(f"Prometheus at {base} did not answer: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or body.get("status") != "success":
        reason = body.get("error") or f"HTTP {response.status_code}"
        raise MetricsUnavailable(f"Prometheus at {base} refused the query {query}: {reason}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise MetricsUnavailable(f"Prometheus at {base} answered {data.get('resultType')!r} "
                                 f"to a range query, not a matrix")
    return list(data.get("result") or [])
