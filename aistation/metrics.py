"""AIStation's figures on OGAI's /metrics: jobs by state, each cluster's scheduling cycles
(counted by `schedule_cluster` on the Cluster row, so every web process reports the same), and
the log store's."""

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from aistation.choices import LIVE_ATTEMPT_STATES, JobState
from aistation.models import Attempt, Job
from podsys.models import Cluster


class JobsCollector:
    def collect(self) -> Iterator[Metric]:
        counts = dict(Job.objects.order_by().values_list("state").annotate(n=Count("pk")))
        jobs = GaugeMetricFamily("ogai_jobs", "Jobs in each state (every state, 0 included).",
                                 labels=["state"])
        for state in JobState.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs

        cycles = CounterMetricFamily("ogai_scheduler_cycles", "Scheduling cycles run (skipped "
                                     "ones not counted).", labels=["cluster"])
        seconds = CounterMetricFamily("ogai_scheduler_cycle_seconds", "Time spent in "
                                      "scheduling cycles.", labels=["cluster"])
        last = GaugeMetricFamily("ogai_scheduler_cycle_last_seconds", "How long the latest "
                                 "scheduling cycle took.", labels=["cluster"])
        rows = Cluster.objects.filter(is_active=True).order_by("name").values_list(
            "name", "cycles_total", "cycle_seconds_total", "cycle_seconds_last")
        for name, total, spent, latest in rows:
            cycles.add_metric([name], total)
            seconds.add_metric([name], spent)
            if latest is not None:
                last.add_metric([name], latest)
        yield cycles
        yield seconds
        yield last


class LogStoreCollector:
    """The log store's health: platform lines dropped (every process, as the store counts
    them, plus this process's not yet counted there), lines waiting in this process's buffer,
    and ended attempts whose output is not all in the store yet."""

    def collect(self) -> Iterator[Metric]:
        from aistation.logstore.base import StoreDown
        from aistation.logstore.config import get_store
        from aistation.logstore.handler import platform_buffer

        buffer = platform_buffer()
        up = GaugeMetricFamily("ogai_logs_store_up", "Whether the log store answered.")
        dropped = CounterMetricFamily(
            "ogai_logs_dropped_lines", "Platform log lines dropped because a process's buffer "
            "was full (the store slow or down).", labels=["source"])
        try:
            counted = get_store().dropped()
            up.add_metric([], 1)
        except StoreDown:
            counted = {}
            up.add_metric([], 0)
        counted[buffer.source] = counted.get(buffer.source, 0) + buffer.unreported
        for source, count in sorted(counted.items()):
            dropped.add_metric([source], count)
        yield up
        yield dropped
        yield GaugeMetricFamily("ogai_logs_buffered_lines", "Platform log lines waiting in "
                                "this process's buffer for the store.", value=len(buffer))
        waiting = Attempt.objects.filter(launched=True, logs_shipped=False) \
            .exclude(state__in=LIVE_ATTEMPT_STATES).count()
        yield GaugeMetricFamily("ogai_logs_unshipped_attempts", "Ended attempts whose output "
                                "is not all in the log store yet.", value=waiting)
