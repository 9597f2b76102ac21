"""Reads of node health checks: the runs a caller may see, a node's checks at a glance, and one
check's history on a node."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from podsys.allocations import gpu_allocations
from podsys.choices import CheckState
from podsys.health import NODE_LABEL_PREFIX
from podsys.health.registry import health_checks
from podsys.models import HealthCheckRun, Node


def health_check_run_list(*, user) -> QuerySet[HealthCheckRun]:
    """Runs on the nodes the caller sees (those of shared clusters and of their tenants')."""
    from podsys.selectors import node_list

    return HealthCheckRun.objects.select_related("node", "node__cluster").filter(
        node__in=node_list(user=user).values("pk"))


def health_check_history(*, node: Node, check_name: str | None = None,
                         limit: int = 50) -> QuerySet[HealthCheckRun]:
    """The node's runs, newest first (of one check, or all)."""
    runs = HealthCheckRun.objects.filter(node=node)
    if check_name:
        runs = runs.filter(check_name=check_name)
    return runs.order_by("-created_at", "-id")[:limit]


def _consecutive_failures(states: list[str]) -> int:
    count = 0
    for state in states:
        if state not in (CheckState.PASSED, CheckState.FAILED):
            continue  # not judged (yet): says nothing of the node
        if state != CheckState.FAILED:
            break
        count += 1
    return count


def node_health_summary(*, node: Node, recent: int = 20) -> list[dict[str, Any]]:
    """One entry per configured check: name, label, severity, interval_s, exclusive,
    multi_node, `latest` (its newest HealthCheckRun or None), `consecutive_failures` (judged
    runs failed in a row, newest first; errors and runs not ended skipped), `failing` (its
    node label is set) and `deferred` (why its pending run has not started: "" when it has
    nothing waiting)."""
    checks = health_checks()
    busy = gpu_allocations([node.cluster_id]).get((node.cluster_id, node.name), 0) \
        or node.gpus_in_use or 0
    summary = []
    for name, check in checks.items():
        # One query per check, on the (node, check, -created_at) index: a daily check's last
        # run is far behind a five-minute one's.
        runs = list(HealthCheckRun.objects.filter(node=node, check_name=name)
                    .order_by("-created_at", "-id")[:recent])
        latest = runs[0] if runs else None
        pending = next((r for r in runs if r.state == CheckState.PENDING), None)
        deferred = pending.summary if pending and pending.summary.startswith("deferred") else ""
        if pending and not deferred and check.exclusive and busy:
            deferred = f"deferred: node busy ({busy} GPUs in use)"
        summary.append({
            "name": name,
            "label": check.label,
            "severity": check.severity,
            "interval_s": check.interval_s,
            "exclusive": check.exclusive,
            "multi_node": check.multi_node,
            "latest": latest,
            "consecutive_failures": _consecutive_failures([r.state for r in runs]),
            "failing": node.labels.get(NODE_LABEL_PREFIX + name) == "failed",
            "deferred": deferred,
        })
    return summary
