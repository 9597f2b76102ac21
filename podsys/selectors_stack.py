"""Reads of stack profiles and deployment runs (re-exported by `podsys.selectors`).

Profiles are read by everyone signed in (they say what the nodes run); deployment runs are
an operator's concern: platform admins see them, everyone else none.
"""

from django.db.models import Count, Q, QuerySet

from infra_os.access import is_platform_admin
from podsys.choices import DEPLOYMENT_FINAL_STATES, DeploymentState, TaskStatus
from podsys.models import Cluster, DeploymentRun, StackProfile

# A node's state in a deployment run's grid.
HOST_STATE_CHOICES = [("pending", "Pending"), ("running", "Running"), ("ok", "OK"),
                      ("failed", "Failed"), ("unreachable", "Unreachable")]


def stack_profile_list(*, user) -> QuerySet[StackProfile]:
    """Operators' catalogue: what tenants' nodes run shows on the nodes themselves."""
    if not is_platform_admin(user):
        return StackProfile.objects.none()
    return StackProfile.objects.annotate(deployment_count=Count("deployments"))


def deployment_run_list(*, user, cluster: Cluster | None = None) -> QuerySet[DeploymentRun]:
    if not is_platform_admin(user):
        return DeploymentRun.objects.none()
    queryset = DeploymentRun.objects.select_related("cluster", "profile", "created_by").annotate(
        failed_tasks=Count("results", filter=Q(results__status__in=[
            TaskStatus.FAILED, TaskStatus.UNREACHABLE])),
    )
    return queryset.filter(cluster=cluster) if cluster is not None else queryset


def _host_state(run: DeploymentRun, host: str, cells: list) -> str:
    statuses = {cell["status"] for cell in cells if cell}
    if TaskStatus.UNREACHABLE in statuses:
        return "unreachable"
    if TaskStatus.FAILED in statuses:
        return "failed"
    recap = (run.stats or {}).get(host)
    if run.state in DEPLOYMENT_FINAL_STATES:
        if recap is not None and not recap.get("failures") and not recap.get("unreachable"):
            return "ok"
        return "failed" if run.state == DeploymentState.FAILED and statuses else "pending"
    return "running" if statuses else "pending"


def deployment_grid(*, run: DeploymentRun) -> dict:
    """The run as the console's grid: one column per task (in the order they first started),
    one row per node with a cell per task (None where that node has not reached it), each
    node's state, and the task it failed at with that task's output."""
    rows = list(run.results.order_by("position", "host").values(
        "position", "task", "role", "host", "status", "changed", "output", "duration_s"))
    columns: dict[int, dict] = {}
    by_host: dict[str, dict[int, dict]] = {}
    for row in rows:
        columns.setdefault(row["position"], {"position": row["position"], "task": row["task"],
                                             "role": row["role"]})
        by_host.setdefault(row["host"], {})[row["position"]] = {
            "status": row["status"], "changed": row["changed"], "output": row["output"],
            "duration_s": row["duration_s"]}
    tasks = [columns[position] for position in sorted(columns)]
    hosts = []
    for host in list(run.hosts) + sorted(set(by_host) - set(run.hosts)):
        cells = [by_host.get(host, {}).get(task["position"]) for task in tasks]
        failed = next(((task, cell) for task, cell in zip(tasks, cells, strict=True)
                       if cell and cell["status"] in (TaskStatus.FAILED, TaskStatus.UNREACHABLE)),
                      None)
        hosts.append({
            "host": host,
            "state": _host_state(run, host, cells),
            "cells": cells,
            "failed_task": failed[0]["task"] if failed else "",
            "output": failed[1]["output"] if failed else "",
        })
    return {"tasks": tasks, "hosts": hosts}
