"""Reads of stack profiles and deployment runs (re-exported by `podsys.selectors`).

Profiles are read by everyone signed in (they say what the nodes run); deployment runs are
an operator's concern: platform admins see them, everyone else none.
"""

from django.db.models import Case, Count, F, Q, QuerySet, TextField, Value, When

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


# The grid shows a task's output where it failed or was unreachable; the others' stays in the
# database (the grid is read every 2 s by every viewer of a running run).
_FAILING = (TaskStatus.FAILED, TaskStatus.UNREACHABLE)
# Begins the output of a task that failed under `ignore_errors`: stored failed, as it did, but
# the node went on (`podsys.services.deployments._Recorder` writes it).
IGNORED_NOTE = "Failed, ignored (ignore_errors)."


def _stops(cell: dict | None) -> bool:
    """A failure that stops a node: failed or unreachable, and not ignored."""
    return bool(cell and cell["status"] in _FAILING
                and not cell["output"].startswith(IGNORED_NOTE))


def _host_state(run: DeploymentRun, host: str, cells: list) -> str:
    """By the node's play recap once it has one: a failure rescued (block/rescue) or ignored
    (ignore_errors, ignore_unreachable) does not count there. Before it (live, or a run that
    never got to its recap), by the node's cells: it stopped if the last task it reached did."""
    recap = (run.stats or {}).get(host)
    if recap is not None:
        if recap.get("unreachable"):
            return "unreachable"
        return "failed" if recap.get("failures") else "ok"
    reached = [cell for cell in cells if cell]
    if reached and _stops(reached[-1]):
        return "unreachable" if reached[-1]["status"] == TaskStatus.UNREACHABLE else "failed"
    if run.state in DEPLOYMENT_FINAL_STATES:
        return "failed" if run.state == DeploymentState.FAILED and reached else "pending"
    return "running" if reached else "pending"


def deployment_grid(*, run: DeploymentRun) -> dict:
    """The run as the console's grid: one column per task (in the order they first started),
    one row per node with a cell per task (None where that node has not reached it), each
    node's state, and the task it stopped at with that task's output. A cell's `output` is
    there only where the task failed or was unreachable (empty for the others). One query."""
    rows = list(run.results.order_by("position", "host").values(
        "position", "task", "role", "host", "status", "changed", "duration_s",
        shown_output=Case(When(status__in=_FAILING, then=F("output")), default=Value(""),
                          output_field=TextField())))
    columns: dict[int, dict] = {}
    by_host: dict[str, dict[int, dict]] = {}
    for row in rows:
        columns.setdefault(row["position"], {"position": row["position"], "task": row["task"],
                                             "role": row["role"]})
        by_host.setdefault(row["host"], {})[row["position"]] = {
            "status": row["status"], "changed": row["changed"], "output": row["shown_output"],
            "duration_s": row["duration_s"]}
    tasks = [columns[position] for position in sorted(columns)]
    hosts = []
    for host in list(run.hosts) + sorted(set(by_host) - set(run.hosts)):
        cells = [by_host.get(host, {}).get(task["position"]) for task in tasks]
        state = _host_state(run, host, cells)
        # The last failure that was not ignored: one before it was rescued.
        stopped = next(((task, cell) for task, cell in zip(reversed(tasks), reversed(cells),
                                                           strict=True) if _stops(cell)),
                       None) if state in ("failed", "unreachable") else None
        hosts.append({
            "host": host,
            "state": state,
            "cells": cells,
            "failed_task": stopped[0]["task"] if stopped else "",
            "output": stopped[1]["output"] if stopped else "",
        })
    return {"tasks": tasks, "hosts": hosts}
