"""OGAI's own Prometheus metrics, served at `/metrics`.

Series (see the README for the whole list):
- `ogai_http_requests_total{method,status}` and the histogram
  `ogai_http_request_duration_seconds{method}`: every request Django answers, counted by this
  module's middleware (labels bounded: known methods, status codes, never paths);
- `ogai_celery_queue_length{queue}` for every queue in `ogai.celery.QUEUES`, and
  `ogai_celery_broker_up`: read from the broker (filesystem transport or Redis) at scrape time;
- whatever the layers register with `register_collector` from their AppConfig.ready() (jobs by
  state and scheduler cycles from aistation, nodes by state from podsys): this module, at the
  bottom of the layers, imports none of them.

Request figures live in each process's memory. Where several web processes serve (uvicorn
--workers), set PROMETHEUS_MULTIPROC_DIR to an empty folder shared by them, and every scrape
adds up all processes (prometheus_client's multiprocess mode).

`/metrics` answers anyone unless OGAI_METRICS_TOKEN is set; then it wants
`Authorization: Bearer <that token>`.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ogai.request_context import client_ip, in_networks

logger = logging.getLogger("ogai.metrics")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BROKER_TIMEOUT_S = 2.0


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


# Requests ----------------------------------------------------------------------------------

_requests_registry = CollectorRegistry()
HTTP_REQUESTS = Counter(
    "ogai_http_requests", "HTTP requests answered, by method and status code.",
    ["method", "status"], registry=_requests_registry)
HTTP_DURATION = Histogram(
    "ogai_http_request_duration_seconds", "Time to answer an HTTP request, by method.",
    ["method"], registry=_requests_registry,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))


class MetricsMiddleware:
    """Counts and times every request; first in MIDDLEWARE so it sees all of it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        method = request.method if request.method in METHODS else "other"
        status = 500
        try:
            response = self.get_response(request)
            status = response.status_code
            return response
        finally:
            HTTP_REQUESTS.labels(method=method, status=str(status)).inc()
            HTTP_DURATION.labels(method=method).observe(time.perf_counter() - started)


# Celery queues -----------------------------------------------------------------------------


def queue_lengths(connection: Any, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each queue, through an open kombu connection. A queue the broker
    does not know yet (Redis drops an empty list) holds none."""
    lengths = {}
    for queue in queues:
        # A channel per queue: a refused passive declare closes its channel (AMQP).
        with connection.channel() as channel:
            try:
                lengths[queue] = int(channel.queue_declare(queue=queue, passive=True)
                                     .message_count)
            except connection.channel_errors:
                lengths[queue] = 0
    return lengths


def _broker_connection() -> Any:
    from ogai.celery import app

    timeout = BROKER_TIMEOUT_S
    return app.connection_for_read(connect_timeout=timeout, transport_options={
        "socket_timeout": timeout, "socket_connect_timeout": timeout, "max_retries": 0})


def _read_queue_lengths() -> dict[str, int] | None:
    """None when the broker did not answer within BROKER_TIMEOUT_S: a scrape never hangs on a
    dead broker (the reading thread is left to its own socket timeouts)."""
    from ogai.celery import QUEUES

    answer: dict[str, Any] = {}

    def read() -> None:
        try:
            with _broker_connection() as connection:
                answer["lengths"] = queue_lengths(connection, QUEUES)
        except Exception as exc:  # any transport's error: the broker is down, say so
            answer["error"] = exc

    worker = threading.Thread(target=read, daemon=True, name="metrics-queue-lengths")
    worker.start()
    worker.join(BROKER_TIMEOUT_S + 0.5)
    if "lengths" not in answer:
        logger.warning("queue lengths unavailable: %s",
                       answer.get("error", f"no answer within {BROKER_TIMEOUT_S:g} s"))
        return None
    return answer["lengths"]


class CeleryQueueCollector:
    def collect(self) -> Iterator[Metric]:
        lengths = _read_queue_lengths()
        up = GaugeMetricFamily("ogai_celery_broker_up",
                               "1 when the Celery broker answered the last scrape, else 0.")
        up.add_metric([], 0 if lengths is None else 1)
        yield up
        if lengths is not None:
            family = GaugeMetricFamily("ogai_celery_queue_length",
                                       "Celery messages waiting in each queue.", labels=["queue"])
            for queue, length in lengths.items():
                family.add_metric([queue], length)
            yield family


# The registry ------------------------------------------------------------------------------

_collectors: list[Collector] = [CeleryQueueCollector()]
_collectors_lock = threading.Lock()


def register_collector(collector: Collector) -> None:
    """Add a collector of scrape-time figures (an object with `collect()` yielding
    prometheus_client metric families). One of each class: a second is ignored."""
    with _collectors_lock:
        if not any(type(known) is type(collector) for known in _collectors):
            _collectors.append(collector)


class _Exposition:
    """Everything /metrics shows. A collector that fails is logged and left out: one broken
    figure never takes the others down."""

    def collect(self) -> Iterator[Metric]:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            requests = CollectorRegistry()
            multiprocess.MultiProcessCollector(requests)
            yield from requests.collect()
        else:
            yield from _requests_registry.collect()
        with _collectors_lock:
            collectors = list(_collectors)
        for collector in collectors:
            try:
                families = list(collector.collect())
            except Exception:
                logger.exception("metrics collector %s failed", type(collector).__name__)
                continue
            yield from families


def exposition() -> bytes:
    return generate_latest(_Exposition())  # type: ignore[arg-type]


@never_cache
@require_GET
def metrics_view(request):
    token = settings.OGAI_METRICS_TOKEN
    if not token and not in_networks(client_ip(request), settings.OGAI_METRICS_NETWORKS):
        return HttpResponse("Metrics are served to OGAI_METRICS_NETWORKS only; set "
                            "OGAI_METRICS_TOKEN to scrape from elsewhere.\n", status=403,
                            content_type="text/plain; charset=utf-8")
    if token:
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(),
                                                                  token.encode()):
            response = HttpResponse("Metrics need Authorization: Bearer <OGAI_METRICS_TOKEN>.\n",
                                    status=401, content_type="text/plain; charset=utf-8")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
