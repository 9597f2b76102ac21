"""The scheduler core: a pure function from a snapshot of the cluster to decisions.

`schedule(snapshot)` takes nodes, running and pending work and quotas (`types`) and returns what to
start where, what to preempt and why every other job waits. No Django, no I/O, no wall clock, so
the same code runs in the scheduling task and in the trace replay under bench/.
"""

from .core import schedule
from .types import (
    Decisions,
    JobSnap,
    NodeSnap,
    Preempt,
    QueueSnap,
    Snapshot,
    Start,
    TenantSnap,
    Wait,
)

__all__ = [
    "Decisions",
    "JobSnap",
    "NodeSnap",
    "Preempt",
    "QueueSnap",
    "Snapshot",
    "Start",
    "TenantSnap",
    "Wait",
    "schedule",
]
