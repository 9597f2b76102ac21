"""AIStation's figures on OGAI's /metrics: jobs by state, and each cluster's scheduling cycles
(counted by `schedule_cluster` on the Cluster row, so every web process reports the same)."""

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from aistation.choices import JobState
from aistation.models import Job
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
