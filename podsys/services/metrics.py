"""Node metrics: the recent history OGAI keeps itself where no Prometheus server does.

Every `OGAI_METRICS_INTERVAL_S` the `podsys.collect_metrics` task reads each node of each active
cluster, as Prometheus exposition text: by scraping the URLs of the cluster's `metrics_url`
option (a template such as "http://{address}:9400/metrics", or a list of them: DCGM exporter
and node exporter), else from the driver itself (`ClusterDriver.node_metrics`: the local driver
runs OGAI's exporter in process, the fake one simulates). One `NodeMetricSnapshot` per node
and read keeps the series of `podsys.metric_names`; `metrics_prune` drops what is older than
`OGAI_METRICS_HISTORY_H`. With `OGAI_PROMETHEUS_URL` set, Prometheus keeps the history and
collection does nothing.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from podsys.choices import NodeHealth
from podsys.drivers.base import DriverError
from podsys.metric_names import METRICS_BY_NAME, NodeMetric
from podsys.models import Cluster, Node, NodeMetricSnapshot
from podsys.runtime import driver_for

logger = logging.getLogger("podsys.metrics")

SCRAPE_TIMEOUT_S = 5.0
SCRAPE_THREADS = 16

Values = dict[str, dict[str, float]]


def _known(sample_name: str) -> NodeMetric | None:
    """The metric a sample belongs to. prometheus_client's parser adds `_total` to the samples
    of a counter whose name lacks it (DCGM's `..._VOL_TOTAL`, `..._REMAPPED_ROWS`)."""
    metric = METRICS_BY_NAME.get(sample_name)
    if metric is None and sample_name.endswith("_total"):
        metric = METRICS_BY_NAME.get(sample_name[: -len("_total")])
        if metric is not None and metric.kind != "counter":
            return None
    return metric


def snapshot_values(text: str) -> Values:
    """{metric name: {series key: value}} of the known series in exposition `text`: the key is
    the GPU index for GPU metrics, the `mode` of CPU time, the `device` of network bytes, ""
    otherwise; samples that differ only in other labels (the CPU) are summed. Raises ValueError
    on text that is not the Prometheus format."""
    values: Values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            metric = _known(sample.name)
            value = float(sample.value)
            if metric is None or not math.isfinite(value):
                continue
            key = sample.labels.get(metric.key, "") if metric.key else ""
            series = values.setdefault(metric.name, {})
            if metric.key_label:
                series[key] = series.get(key, 0.0) + value
            else:
                series[key] = value
    return values


def _metrics_urls(cluster: Cluster) -> list[str]:
    raw = cluster.options.get("metrics_url") or []
    templates = [raw] if isinstance(raw, str) else raw
    if not isinstance(templates, list) or not all(isinstance(t, str) for t in templates):
        logger.warning("cluster %s: option metrics_url must be a URL template or a list of "
                       "them; reading metrics from the driver instead", cluster.name)
        return []
    return templates


def _url(template: str, node: Node) -> str:
    # Plain replacement, not str.format: an operator's template cannot reach attributes.
    return template.replace("{address}", node.address or node.name).replace("{name}", node.name)


def _scrape(client: httpx.Client, node: Node, templates: list[str]) -> Values | None:
    """The node's values from every URL (later ones win on a clash); None when none answered."""
    merged: Values | None = None
    for template in templates:
        url = _url(template, node)
        try:
            response = client.get(url)
            response.raise_for_status()
            found = snapshot_values(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("metrics of node %s: %s did not answer: %s", node.name, url, exc)
            continue
        merged = merged or {}
        for name, series in found.items():
            merged.setdefault(name, {}).update(series)
    return merged


def _from_driver(cluster: Cluster, nodes: list[Node]) -> dict[int, Values]:
    try:
        driver = driver_for(cluster)
    except DriverError as exc:
        logger.warning("metrics of cluster %s: %s", cluster.name, exc)
        return {}
    found: dict[int, Values] = {}
    for node in nodes:
        try:
            text = driver.node_metrics(node.name)
            if text is not None:
                found[node.pk] = snapshot_values(text)
        except (DriverError, ValueError, OSError) as exc:
            logger.warning("metrics of node %s (cluster %s): %s", node.name, cluster.name, exc)
    return found


def metrics_collect(*, cluster: Cluster) -> int:
    """Read every node of the cluster once and keep what it reported; returns the number of
    snapshots written. A node that does not answer is logged and skipped, never failing the
    rest. Does nothing (0) when a Prometheus server keeps the history."""
    if settings.OGAI_PROMETHEUS_URL:
        return 0
    # A lost node answers nothing: no waiting on its timeouts.
    nodes = list(cluster.nodes.exclude(health=NodeHealth.LOST))
    if not nodes:
        return 0
    templates = _metrics_urls(cluster)
    if templates:
        # Many nodes, each with a timeout: in parallel, so a few dead ones cost one timeout.
        with httpx.Client(timeout=SCRAPE_TIMEOUT_S, headers={"Accept": "text/plain"}) as client, \
                ThreadPoolExecutor(max_workers=min(SCRAPE_THREADS, len(nodes))) as pool:
            answers = pool.map(lambda node: _scrape(client, node, templates), nodes)
            found = {node.pk: values for node, values in zip(nodes, answers, strict=True)
                     if values is not None}
    else:
        found = _from_driver(cluster, nodes)
    now = timezone.now()
    rows = [NodeMetricSnapshot(node=node, at=now, values=found[node.pk])
            for node in nodes if found.get(node.pk)]
    with transaction.atomic():
        NodeMetricSnapshot.objects.bulk_create(rows)
    return len(rows)


def metrics_prune(*, now: datetime | None = None) -> int:
    """Delete snapshots older than OGAI_METRICS_HISTORY_H hours; returns how many."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.OGAI_METRICS_HISTORY_H)
    deleted, _ = NodeMetricSnapshot.objects.filter(at__lt=cutoff).delete()
    return deleted
