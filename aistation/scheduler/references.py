"""Reference policies for the trace replay: textbook rules every comparison puts beside the
platform's, never offered to a queue.

The replay runs a reference through the core as a ``backfill`` queue whose jobs' priorities the
reference sets at every cycle (higher first, and a higher priority preempts at once), and whose
order within a priority is the reference's ``since`` (earliest first).

- ``las``: least attained service as Tiresias describes it (NSDI'19, discretised 2D-LAS): a job's
  level drops at each of 3,600 / 36,000 / 360,000 GPU-seconds of attained service (GPUs x
  seconds held, all attempts); a job of a higher level preempts a lower one at once; within a
  level, first come first served by the time the job entered that level; no promotion.
- ``srtf-oracle``: shortest remaining time first, preemptive, with the trace's own durations.
  Deployable by no one: the lower reference.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

from .replay import ReplayJob, remaining_s

LAS = "las"
ORACLE = "srtf-oracle"
TIRESIAS_LEVELS_GPU_S = (3600.0, 36000.0, 360000.0)


def attained_gpu_s(job: ReplayJob, now: float) -> float:
    """GPU-seconds the job has held, its running attempt (restart overhead included) too."""
    held = job.attained_gpu_s
    if job.started_at is not None:
        held += job.gpus_per_replica * job.replicas * (now - job.started_at)
    return held


class LeastAttained:
    """Tiresias' discretised LAS. Keeps, per job, the level it was last seen in and when it
    entered it; a running job's crossing time is exact (from its attempt's start), so a cycle
    that sees a job late still orders it by when it really changed level."""

    def __init__(self, levels_gpu_s: Sequence[float] = TIRESIAS_LEVELS_GPU_S) -> None:
        self.thresholds = sorted(float(level) for level in levels_gpu_s)
        self.entered: dict[int, tuple[int, float]] = {}

    def _level(self, job: ReplayJob, now: float) -> tuple[int, float]:
        level = bisect_right(self.thresholds, attained_gpu_s(job, now))
        seen = self.entered.get(job.trace.id)
        if seen is None:
            seen = (level, job.trace.submitted_at)
        elif level > seen[0]:
            threshold = self.thresholds[level - 1]
            assert job.started_at is not None, "attained service grows only while running"
            gpus = job.gpus_per_replica * job.replicas
            # Crossed during this attempt: a preemption is a cycle, so earlier crossings were
            # seen then.
            seen = (level, job.started_at + max(0.0, threshold - job.attained_gpu_s) / gpus)
        self.entered[job.trace.id] = seen
        return seen

    def rank(self, job: ReplayJob, now: float) -> int:
        return len(self.thresholds) - self._level(job, now)[0]

    def since(self, job: ReplayJob, now: float) -> float:
        return self._level(job, now)[1]

    def changes_at(self, job: ReplayJob, now: float) -> float:
        """When the running job next drops a level: its rank changes then."""
        held = attained_gpu_s(job, now)
        for threshold in self.thresholds:
            if threshold > held:
                return now + (threshold - held) / (job.gpus_per_replica * job.replicas)
        return math.inf


class ShortestRemaining:
    """The oracle: priority is minus the seconds left (restart overhead included), so the core's
    priority preemption makes it SRTF. A waiting job's remaining time does not change, and a
    running job's only rises in priority, so time alone never changes a decision."""

    def __init__(self, restart_overhead_s: float) -> None:
        self.overhead = restart_overhead_s

    def rank(self, job: ReplayJob, now: float) -> int:
        return -int(remaining_s(job, now, self.overhead))

    def since(self, job: ReplayJob, now: float) -> float:
        return job.queued_at

    def changes_at(self, job: ReplayJob, now: float) -> float:
        return math.inf
