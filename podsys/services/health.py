"""Node health checks: started as workloads on the nodes through the cluster driver, judged
from the one line their probe prints, and acted on.

The rule. A FATAL check that fails OGAI_HEALTH_CORDON_AFTER runs in a row (2) takes the node out
of service. A first failure is re-run at once to confirm it instead of waiting for the check's
interval, so a flaky check that fails once and then passes never cordons. Out of service means:
cordoned (`schedulable=False`, `cordon_source=HEALTH_CHECK`, `health_reason="failed health
check <name>: <summary>"`), the node label `ogai.io/health-<name>=failed`, an audit event (by
the system), and `podsys.signals.node_out_of_service` sent after the commit, upon which
aistation moves the node's jobs off it (queued again; the cordon keeps them elsewhere); each
tick sends it again for a node the checks cordoned that still holds work, should a move have
been lost (a receiver that failed is logged; moving is idempotent). A node the checks cordoned
returns to service once every fatal check that failed there has passed OGAI_HEALTH_RETURN_AFTER
runs in a row (1) since. A cordon by an operator, or by the cluster itself, is never lifted by
the checks (a fatal failure there still labels the node and moves its work). WARNING checks
never cordon: they set the label while they fail and clear it when they pass. A run that ERRORs
(refused by the driver, no result printed, past its timeout, the cluster not answering for it
past its timeout and a grace, a probe that could not measure) counts neither for nor against the
node. Only a run of FAILED runs cordons: a failure judged after a later run already passed
changes nothing.

The fleet guard: the checks never hold more than OGAI_HEALTH_MAX_CORDONED_FRACTION (0.25) of a
cluster's nodes out of service (`cordon_source=HEALTH_CHECK`; operators' cordons do not count),
and may always take one node out. A confirmed fatal failure beyond that leaves the node in
service, labelled; the run's summary and an audit event (`node.cordon_held`, by the system) say
"not cordoned: 3 of 8 nodes are already out of service after health checks; check the checks or
the fleet", and a warning is logged. Its next failing run cordons it once there is room.

Checks needing the node's GPUs to themselves (`exclusive`) start only while nothing holds GPUs
there; until then their run waits, PENDING, its summary saying why. While one runs, the node is
held out of the scheduler's hands (`cordon_source=CHECK_RUNNING`, `health_reason="held while
health check <name> runs"`), taken under the same lock a scheduling cycle takes and in the
transaction that marks the check RUNNING, so no job is placed on GPUs the check holds; it
returns when the check ends (a launch that fails ends it), unless the check took it out of
service or an operator cordoned it meanwhile (their cordon wins; a held node cannot be
uncordoned). A node already cordoned is not held, but one the checks return to service (or an
operator uncordons) while an exclusive check runs there is held until that check ends. Each
tick first gives back any node still held with no exclusive check running there, whatever
ended it, even when the cluster's driver then fails. A multi-node check runs as one gang
workload over the nodes it is due on, at least two.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, F, Max, Q, TextField, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.services.audit import audit_record
from podsys.allocations import gpu_allocations
from podsys.choices import (
    CheckSeverity,
    CheckState,
    CheckTrigger,
    CordonSource,
    DeploymentKind,
    DeploymentState,
    NodeHealth,
)
from podsys.drivers.base import (
    FEATURE_IMAGES,
    FEATURE_MULTI_NODE,
    ClusterDriver,
    DriverError,
    Phase,
    Resources,
    Workload,
    WorkloadStatus,
)
from podsys.health import (
    CHECK_LABEL,
    EXPECTED_DRIVER_LABEL,
    EXPECTED_GPUS_LABEL,
    NODE_LABEL_PREFIX,
)
from podsys.health.checks import GpuPresence, HealthCheck, Verdict
from podsys.health.registry import health_checks
from podsys.health.result import parse_result
from podsys.models import Cluster, DeploymentRun, HealthCheckRun, Node
from podsys.runtime import driver_for, local_clusters
from podsys.signals import node_out_of_service

logger = logging.getLogger(__name__)

LIVE_STATES = (CheckState.PENDING, CheckState.RUNNING)
JUDGED_STATES = (CheckState.PASSED, CheckState.FAILED)
# Drivers that place workloads in a tenant's namespace put the checks under this name.
HEALTH_TENANT = "ogai-health"
# What a check that only observes (NVML sees every GPU without holding one) asks for.
OBSERVE = Resources(gpus=0, cpu_cores=0.5, memory_mib=512)
LOG_TAIL = 200
# Other nodes a node's network check tries (the next ones by name, like a ring): enough to
# notice a node cut off, without N^2 connections on a large cluster.
PEERS = 8
# A workload the driver does not know yet right after its run started may still be launching.
LAUNCH_GRACE_S = 60
# A run past its timeout ends even while the cluster cannot be asked about it, this much later
# (it may answer again, with the result): its node is never held for good.
UNANSWERED_GRACE_S = 120
HELD_PREFIX = "held while health check "


def _new_totals() -> Counter:
    return Counter(dict.fromkeys(("scheduled", "started", "deferred", "finished", "errors",
                                  "timed_out", "confirming", "cordoned", "held", "returned",
                                  "released", "resent"), 0))


# What the checks are told about a node ------------------------------------------------------


def expected_gpus(node: Node, cluster: Cluster) -> int:
    """The GPUs the node must have: its `ogai.io/expected-gpus` label; else the most it was seen
    with (as reported, or found by a passing gpu-presence check), so a GPU that falls off the
    bus is missed even after the cluster stops reporting it. The local driver's `gpus` option
    invents GPU slots: there the hardware NVML sees is what counts."""
    label = str(node.labels.get(EXPECTED_GPUS_LABEL, "")).strip()
    if label.isdigit():
        return int(label)
    if cluster.driver == "local" and "gpus" in cluster.options:
        from podsys.drivers.local import read_gpus

        return read_gpus().devices
    seen = (HealthCheckRun.objects.filter(node=node, check_name=GpuPresence.name,
                                          state=CheckState.PASSED)
            .values_list("details", flat=True).first()) or {}
    found = seen.get("found") if isinstance(seen, dict) else None
    return max(node.gpus, found if isinstance(found, int) else 0)


def expected_driver(node: Node, cluster: Cluster) -> str:
    """The driver version the node must run: its `ogai.io/expected-driver` label, else the one
    the newest stack deployment (not a check-mode rehearsal) that finished cleanly on this node
    deployed, as that run's own variables say (its profile may have been edited since; the run
    may have failed on other nodes); "" when nothing says."""
    label = str(node.labels.get(EXPECTED_DRIVER_LABEL, "")).strip()
    if label:
        return label
    runs = (DeploymentRun.objects.filter(cluster=cluster, kind=DeploymentKind.STACK,
                                         state__in=(DeploymentState.SUCCEEDED,
                                                    DeploymentState.FAILED), check_mode=False)
            .order_by("-finished_at", "-id").values_list("hosts", "stats", "extra_vars"))
    names = {node.name, node.address} - {""}
    for hosts, stats, extra_vars in runs[:100]:
        version = (extra_vars or {}).get("stack_driver_version")
        for host in names & set(hosts or ()):
            recap = (stats or {}).get(host)
            if version and isinstance(recap, dict) and not recap.get("failures") \
                    and not recap.get("unreachable"):
                return str(version)
    return ""


def node_facts(node: Node, *, cluster: Cluster, driver: ClusterDriver,
               peers: list[str] | None = None) -> dict[str, Any]:
    """The plain facts a check's command and judgement need (see `podsys.health.checks`)."""
    return {
        # Without images the driver runs the platform's own environment, interpreter included.
        "python": "python" if driver.supports(FEATURE_IMAGES) else sys.executable,
        "node": node.name,
        "driver": cluster.driver,
        "gpus": expected_gpus(node, cluster),
        "expected_driver": expected_driver(node, cluster),
        "internal_url": settings.OGAI_INTERNAL_URL,
        "peers": list(peers or ()),
    }


def _peers(node: Node, nodes: list[Node]) -> list[str]:
    ordered = sorted(nodes, key=lambda n: n.name)
    at = next((i for i, n in enumerate(ordered) if n.pk == node.pk), 0)
    ring = ordered[at + 1:] + ordered[:at]
    return [n.address or n.name for n in ring[:PEERS]]


# Streaks and the rule ------------------------------------------------------------------------


@dataclass(frozen=True)
class Streak:
    """The latest judged runs of a check on a node that agree: PASSED or FAILED (None: never
    judged), how many, and whether they are all it ever had."""

    state: str | None
    count: int
    whole_history: bool


def check_streak(node_id: int, check_name: str, *, limit: int = 50) -> Streak:
    states = list(HealthCheckRun.objects.filter(node_id=node_id, check_name=check_name,
                                                state__in=JUDGED_STATES)
                  .order_by("-created_at", "-id").values_list("state", flat=True)[:limit + 1])
    if not states:
        return Streak(None, 0, True)
    count = 0
    for state in states:
        if state != states[0]:
            break
        count += 1
    return Streak(states[0], count, count == len(states) and len(states) <= limit)


def _limit() -> int:
    return max(1, settings.OGAI_HEALTH_CORDON_AFTER, settings.OGAI_HEALTH_RETURN_AFTER)


def _fatal_check_clear(node_id: int, check_name: str) -> bool:
    """Has this fatal check passed OGAI_HEALTH_RETURN_AFTER times in a row since it last
    failed (or never failed)?"""
    streak = check_streak(node_id, check_name, limit=_limit())
    if streak.state is None:
        return True
    return streak.state == CheckState.PASSED and (
        streak.count >= settings.OGAI_HEALTH_RETURN_AFTER or streak.whole_history)


def _set_label(node: Node, check_name: str, failed: bool) -> bool:
    """Set or clear `ogai.io/health-<check>=failed`; True when it was not set before."""
    key = NODE_LABEL_PREFIX + check_name
    was = node.labels.get(key) == "failed"
    if failed != was:
        labels = dict(node.labels)
        if failed:
            labels[key] = "failed"
        else:
            labels.pop(key, None)
        node.labels = labels
        node.save(update_fields=["labels", "updated_at"])
    return failed and not was


def _apply_rule(run: HealthCheckRun, totals: Counter) -> None:
    """What a judged run means for its node. Called in the transaction that saved it."""
    if run.state not in JUDGED_STATES:
        return
    # A node the checks cordoned may return: whether an exclusive check runs there is seen
    # under the lock `_reserve` holds while one is marked RUNNING.
    may_return = run.state == CheckState.PASSED and Node.objects.filter(
        pk=run.node_id, cordon_source=CordonSource.HEALTH_CHECK).exists()
    if may_return or (run.state == CheckState.FAILED and run.severity == CheckSeverity.FATAL):
        # The fleet guard counts the cluster's cordoned nodes: one such judgement at a time per
        # cluster (locked before the node, in the order a scheduling cycle and `_reserve` use).
        Cluster.objects.select_for_update(no_key=True).filter(
            pk=Node.objects.filter(pk=run.node_id).values("cluster_id")[:1]).first()
    node = Node.objects.select_for_update().get(pk=run.node_id)
    fatal = run.severity == CheckSeverity.FATAL
    if run.state == CheckState.FAILED:
        if not fatal:
            _set_label(node, run.check_name, True)
            return
        streak = check_streak(node.pk, run.check_name, limit=_limit())
        if streak.state != CheckState.FAILED:
            return  # a later run of the check has passed since: this failure is stale
        if streak.count < settings.OGAI_HEALTH_CORDON_AFTER:
            if HealthCheckRun.objects.filter(node=node, check_name=run.check_name,
                                             state__in=LIVE_STATES).exists():
                return  # a run already waiting (an operator's) confirms it
            HealthCheckRun.objects.create(
                node=node, check_name=run.check_name, severity=run.severity, trigger=run.trigger,
                summary=f"to confirm the failure of run {run.pk}")
            totals["confirming"] += 1
            return
        newly = _set_label(node, run.check_name, True)
        if _take_out_of_service(node, run, newly, totals):
            totals["cordoned"] += 1
        return
    if not fatal or _fatal_check_clear(node.pk, run.check_name):
        _set_label(node, run.check_name, False)
    if may_return and node.cordon_source == CordonSource.HEALTH_CHECK and all(
            _fatal_check_clear(node.pk, check.name) for check in health_checks().values()
            if check.severity == CheckSeverity.FATAL):
        _return_to_service(node, run)
        totals["returned"] += 1


def _guard_holds(node: Node) -> str:
    """Why the fleet guard keeps this node in service ("" when it may be cordoned): the checks
    already took OGAI_HEALTH_MAX_CORDONED_FRACTION of its cluster's nodes out (at least one
    node may go). Operators' cordons do not count."""
    nodes = Node.objects.filter(cluster_id=node.cluster_id)
    total = nodes.count()
    out = nodes.filter(cordon_source=CordonSource.HEALTH_CHECK).exclude(pk=node.pk).count()
    allowed = max(1, math.floor(settings.OGAI_HEALTH_MAX_CORDONED_FRACTION * total + 1e-9))
    if out < allowed:
        return ""
    return (f"not cordoned: {out} of {total} nodes are already out of service after health "
            "checks; check the checks or the fleet")


def _take_out_of_service(node: Node, run: HealthCheckRun, newly: bool, totals: Counter
                         ) -> bool:
    """Cordon the node for a confirmed fatal failure and have its work moved; True when this
    run cordoned it. The fleet guard may keep it in service instead (labelled, and said)."""
    reason = f"failed health check {run.check_name}: {run.summary}"
    phrase = _out_of_service_phrase(run)
    # A node held for an exclusive check is in service as far as its cordon goes.
    cordoned = node.schedulable or node.cordon_source == CordonSource.CHECK_RUNNING
    held = _guard_holds(node) if cordoned else ""
    if held:
        totals["held"] += 1
        run.summary = f"{run.summary} ({held})"
        HealthCheckRun.objects.filter(pk=run.pk).update(summary=run.summary)
        if newly:
            audit_record(actor=None, action="node.cordon_held", obj=node,
                         changes={"reason": f"{reason}; {held}", "check": run.check_name,
                                  "run": run.pk})
            logger.warning("Node %s failed health check %s but was %s", node.name,
                           run.check_name, held)
        return False
    if cordoned:
        node.schedulable = False
        node.cordon_source = CordonSource.HEALTH_CHECK
        node.health_reason = reason
        node.save(update_fields=["schedulable", "cordon_source", "health_reason", "updated_at"])
        # The cluster's own cordon (Slurm's drain) follows at the node sync this asks for.
        transaction.on_commit(lambda: _enqueue_sync(node.cluster_id))
        audit_record(actor=None, action="node.cordon", obj=node,
                     changes={"reason": reason, "source": CordonSource.HEALTH_CHECK,
                              "check": run.check_name, "run": run.pk})
    elif newly and node.cordon_source != CordonSource.HEALTH_CHECK:
        # Cordoned by someone else, who keeps the cordon; its work must move all the same.
        audit_record(actor=None, action="node.health_failed", obj=node,
                     changes={"reason": reason, "check": run.check_name, "run": run.pk})
    else:
        return False
    node_id = node.pk
    transaction.on_commit(lambda: _send_out_of_service(node_id, phrase))
    return cordoned


def _out_of_service_phrase(run: HealthCheckRun) -> str:
    return f"it failed health check {run.check_name} ({run.summary})"


def _send_out_of_service(node_id: int, phrase: str) -> None:
    """Have the node's work moved. A receiver that fails is logged, not raised: the next tick
    sends again while the node still holds work (`_resend_moves`)."""
    for receiver, result in node_out_of_service.send_robust(sender=Node, node_id=node_id,
                                                            reason=phrase):
        if isinstance(result, Exception):
            logger.error("Moving the work off node %s failed in %r: %s", node_id, receiver,
                         result, exc_info=result)


def _resend_moves(cluster: Cluster, totals: Counter) -> None:
    """Send `node_out_of_service` again for each node the checks cordoned that still holds
    work (a job with or without GPUs placed there): the first was lost (a receiver failed, the
    worker died after the commit). Moving work is idempotent."""
    out = list(Node.objects.filter(cluster=cluster, cordon_source=CordonSource.HEALTH_CHECK))
    if not out:
        return
    held = gpu_allocations([cluster.pk])
    for node in out:
        if (cluster.pk, node.name) not in held:
            continue
        run = (HealthCheckRun.objects.filter(node=node, state=CheckState.FAILED,
                                             severity=CheckSeverity.FATAL)
               .order_by("-created_at", "-id").first())
        phrase = (_out_of_service_phrase(run) if run
                  else f"it was taken out of service ({node.health_reason})")
        logger.warning("Node %s is out of service after a health check but still holds work: "
                       "moving it off again", node.name)
        _send_out_of_service(node.pk, phrase)
        totals["resent"] += 1


def _return_to_service(node: Node, run: HealthCheckRun) -> None:
    """Back in service; held instead while an exclusive check runs there (`_reserve` leaves a
    cordoned node as it is, so one may), and given back when that check ends."""
    reason = node.health_reason
    running = exclusive_check_running(node.pk)
    node.schedulable = not running
    node.cordon_source = CordonSource.CHECK_RUNNING if running else CordonSource.NONE
    node.health_reason = held_reason(running) if running else ""
    node.save(update_fields=["schedulable", "cordon_source", "health_reason", "updated_at"])
    transaction.on_commit(lambda: _enqueue_sync(node.cluster_id))
    audit_record(actor=None, action="node.uncordon", obj=node,
                 changes={"reason": f"passed its health checks again (was: {reason})",
                          "source": CordonSource.HEALTH_CHECK, "run": run.pk,
                          **({"held_for": running} if running else {})})


def held_reason(check_name: str) -> str:
    """The reason of a node held for an exclusive check."""
    return f"{HELD_PREFIX}{check_name} runs"


def exclusive_check_running(node_id: int) -> str:
    """The name of an exclusive check running on the node ("" when none): its GPUs are the
    check's until it ends."""
    exclusive = [name for name, check in health_checks().items() if check.exclusive]
    return HealthCheckRun.objects.filter(
        node_id=node_id, state=CheckState.RUNNING, check_name__in=exclusive,
    ).order_by("started_at", "id").values_list("check_name", flat=True).first() or ""


# Finishing runs ------------------------------------------------------------------------------


def _finish(run: HealthCheckRun, verdict: Verdict, now: datetime, totals: Counter) -> None:
    with transaction.atomic():
        locked = HealthCheckRun.objects.select_for_update().filter(pk=run.pk).first()
        if locked is None or locked.state not in LIVE_STATES:
            return  # another tick finished it
        locked.state = (CheckState.ERROR if verdict.error else
                        CheckState.PASSED if verdict.passed else CheckState.FAILED)
        locked.finished_at = now
        locked.summary = verdict.summary
        locked.details = verdict.details
        locked.save(update_fields=["state", "finished_at", "summary", "details"])
        totals["finished"] += 1
        if verdict.error:
            totals["errors"] += 1
        _apply_rule(locked, totals)
        _release(locked.node_id)


def _check_of(name: str, checks: dict[str, HealthCheck]) -> HealthCheck:
    # A check dropped from the settings while it ran is still judged the plain way.
    return checks.get(name) or HealthCheck(name)


def _judge_finished(run: HealthCheckRun, status: WorkloadStatus, driver: ClusterDriver,
                    check: HealthCheck) -> Verdict:
    replica = int(run.details.get("replica", 0)) if isinstance(run.details, dict) else 0
    exit_code = status.exit_code
    for found in status.replicas:
        if found.index == replica:
            exit_code = found.exit_code
    try:
        log = driver.logs(run.workload_id, tail=LOG_TAIL, replica=replica)
    except DriverError as exc:
        return Verdict.could_not_run(f"its log could not be read: {exc}")
    facts = run.details.get("facts", {}) if isinstance(run.details, dict) else {}
    return check.judge(exit_code, parse_result(log), facts)


def _running(cluster: Cluster) -> dict[str, list[HealthCheckRun]]:
    """The cluster's RUNNING runs by workload."""
    groups: dict[str, list[HealthCheckRun]] = defaultdict(list)
    for run in HealthCheckRun.objects.filter(node__cluster=cluster, state=CheckState.RUNNING):
        groups[run.workload_id].append(run)
    return groups


def _end_unanswered(cluster: Cluster, driver: ClusterDriver | None,
                    groups: dict[str, list[HealthCheckRun]], checks: dict[str, HealthCheck],
                    now: datetime, totals: Counter, error: str) -> None:
    """The cluster cannot be asked (`error`): end the runs past their timeout and a grace as
    errors all the same, so their nodes are given back; stop their workloads if it can."""
    for workload_id, runs in groups.items():
        check = _check_of(runs[0].check_name, checks)
        started = min((r.started_at for r in runs if r.started_at), default=now)
        if (now - started).total_seconds() <= check.timeout_s + UNANSWERED_GRACE_S:
            continue
        if driver is not None:
            with contextlib.suppress(DriverError):
                driver.cancel(workload_id)
        for run in runs:
            _finish(run, Verdict.could_not_run(
                f"could not ask the cluster: {error} (past its {check.timeout_s:g} s timeout)"),
                now, totals)
            totals["timed_out"] += 1


def _collect(cluster: Cluster, driver: ClusterDriver, checks: dict[str, HealthCheck],
             now: datetime, totals: Counter) -> None:
    """Judge the runs whose workload ended; end those past their timeout."""
    groups = _running(cluster)
    if not groups:
        return
    try:
        statuses = driver.status(list(groups))
    except DriverError as exc:
        logger.warning("Cluster %s: health check status failed: %s", cluster.name, exc)
        _end_unanswered(cluster, driver, groups, checks, now, totals, str(exc))
        return
    for workload_id, runs in groups.items():
        status = statuses.get(workload_id)
        check = _check_of(runs[0].check_name, checks)
        started = min((r.started_at for r in runs if r.started_at), default=now)
        age = (now - started).total_seconds()
        if status is not None and status.phase in (Phase.SUCCEEDED, Phase.FAILED):
            for run in runs:
                _finish(run, _judge_finished(run, status, driver, check), now, totals)
        elif status is None or status.phase == Phase.MISSING:
            if age > LAUNCH_GRACE_S:
                for run in runs:
                    _finish(run, Verdict.could_not_run("the cluster no longer knows its "
                                                       "workload"), now, totals)
        elif age > check.timeout_s:
            try:
                driver.cancel(workload_id)
            except DriverError as exc:
                logger.warning("Cluster %s: could not stop %s: %s", cluster.name, workload_id,
                               exc)
            for run in runs:
                _finish(run, Verdict.could_not_run(f"timed out after {check.timeout_s:g} s"),
                        now, totals)
                totals["timed_out"] += 1


def health_checks_stop_local(*, reason: str) -> int:
    """The platform stops: end the checks running on its local clusters as could not run
    (`reason`; an error, which says nothing about the node) and stop their workloads, which
    would otherwise outlive it. Returns the runs ended."""
    now, totals = timezone.now(), Counter[str]()
    for cluster in local_clusters():
        driver = driver_for(cluster)
        for workload_id, runs in _running(cluster).items():
            with contextlib.suppress(DriverError):
                driver.cancel(workload_id)
            for run in runs:
                _finish(run, Verdict.could_not_run(reason), now, totals)
    return totals["finished"]


# Scheduling and starting runs ---------------------------------------------------------------


def _runnable(check: HealthCheck, driver: ClusterDriver, node_count: int) -> bool:
    if check.multi_node:
        return driver.supports(FEATURE_MULTI_NODE) and node_count >= 2
    return True


def _schedule_due(cluster: Cluster, driver: ClusterDriver, checks: dict[str, HealthCheck],
                  now: datetime, totals: Counter) -> None:
    """A PENDING run for each check whose interval has passed on each node the cluster reports
    ready (one not ready or lost can run nothing: that is the cluster's to say, not a check's)."""
    with transaction.atomic():
        # One tick at a time decides for a cluster, so no check is due twice.
        Cluster.objects.select_for_update(no_key=True).filter(pk=cluster.pk).first()
        nodes = list(cluster.nodes.filter(health=NodeHealth.HEALTHY))
        runs = HealthCheckRun.objects.filter(node__cluster=cluster)
        live = set(runs.filter(state__in=LIVE_STATES).values_list("node_id", "check_name"))
        # When each check last started on each node (as this tick's clock tells time).
        last = {(node_id, name): at for node_id, name, at in
                runs.order_by().values("node_id", "check_name")
                .annotate(at=Max(Coalesce("started_at", "created_at")))
                .values_list("node_id", "check_name", "at")}
        new = []
        for check in checks.values():
            if not _runnable(check, driver, len(nodes)):
                continue
            for node in nodes:
                key = (node.pk, check.name)
                at = last.get(key)
                if key in live or (at is not None
                                   and (now - at).total_seconds() < check.interval_s):
                    continue
                new.append(HealthCheckRun(node=node, check_name=check.name,
                                          severity=check.severity,
                                          trigger=CheckTrigger.SCHEDULE))
        HealthCheckRun.objects.bulk_create(new, batch_size=500)
        totals["scheduled"] += len(new)


def _busy(cluster: Cluster, nodes: dict[int, Node]) -> dict[str, int]:
    """GPUs held on each node: jobs' (and, where the cluster reports it, anyone's), and all of
    them under a running exclusive check."""
    held: dict[str, int] = {name: gpus for (_, name), gpus in
                            gpu_allocations([cluster.pk]).items() if gpus}
    for node in nodes.values():
        if node.gpus_in_use:
            held[node.name] = max(held.get(node.name, 0), node.gpus_in_use)
    exclusive = {name for name, check in health_checks().items() if check.exclusive}
    for name, gpus in (HealthCheckRun.objects.filter(
            node__cluster=cluster, state=CheckState.RUNNING, check_name__in=exclusive)
            .values_list("node__name", "node__gpus")):
        held[name] = max(held.get(name, 0), gpus or 1)
    return held


def _defer(run: HealthCheckRun, summary: str, totals: Counter) -> None:
    totals["deferred"] += 1
    if run.summary != summary:
        run.summary = summary
        HealthCheckRun.objects.filter(pk=run.pk, state=CheckState.PENDING).update(summary=summary)


def _start_pending(cluster: Cluster, driver: ClusterDriver, checks: dict[str, HealthCheck],
                   now: datetime, totals: Counter) -> None:
    pending = list(HealthCheckRun.objects.filter(node__cluster=cluster, state=CheckState.PENDING)
                   .select_related("node").order_by("created_at", "id"))
    if not pending:
        return
    nodes = {n.pk: n for n in cluster.nodes.filter(health=NodeHealth.HEALTHY)}
    busy = _busy(cluster, nodes)
    known: dict[int, dict[str, Any]] = {}
    gangs: dict[str, list[HealthCheckRun]] = defaultdict(list)
    for run in pending:
        check = checks.get(run.check_name)
        if run.node_id not in nodes:
            state = run.node.get_health_display().lower()
            _finish(run, Verdict.could_not_run(f"the node is {state}"), now, totals)
        elif check is None:
            _finish(run, Verdict.could_not_run("this check is no longer configured"), now,
                    totals)
        elif check.exclusive and busy.get(run.node.name):
            _defer(run, f"deferred: node busy ({busy[run.node.name]} GPUs in use)", totals)
        elif check.multi_node:
            gangs[check.name].append(run)
        elif not _start(cluster, driver, check, [run], list(nodes.values()), now, totals,
                        known):
            _defer(run, "deferred: node busy (work was just placed there)", totals)
        elif check.exclusive:
            busy[run.node.name] = run.node.gpus or 1
    for name, runs in gangs.items():
        free = [run for run in runs if not busy.get(run.node.name)]
        for run in runs:
            if run not in free:
                _defer(run, f"deferred: node busy ({busy[run.node.name]} GPUs in use)", totals)
        if len(free) < 2:
            for run in free:
                _defer(run, "deferred: waiting for another free node", totals)
            continue
        for gang in _gangs(free, max(2, checks[name].max_nodes)):
            if not _start(cluster, driver, checks[name], gang, list(nodes.values()), now,
                          totals, known):
                for run in gang:
                    _defer(run, "deferred: node busy (work was just placed there)", totals)


def _reserve(cluster: Cluster, nodes: list[Node], check_name: str) -> bool:
    """Take idle nodes out of the scheduler's hands for an exclusive check, or none of them if
    work holds GPUs on any. The cluster row is locked as a scheduling cycle locks it, so no
    cycle places work on them between this look and the check's launch. A node already cordoned
    stays as it is (nothing will be placed there anyway; should the checks return it to service
    meanwhile, it is held then). Called in the transaction that marks the check's runs RUNNING:
    a node is never held without a running exclusive check."""
    with transaction.atomic():
        Cluster.objects.select_for_update(no_key=True).filter(pk=cluster.pk).first()
        held = gpu_allocations([cluster.pk])
        names = [node.name for node in nodes]
        if any(held.get((cluster.pk, name)) for name in names):
            return False
        Node.objects.filter(pk__in=[node.pk for node in nodes if node.gpus], schedulable=True,
                            cordon_source=CordonSource.NONE).update(
            schedulable=False, cordon_source=CordonSource.CHECK_RUNNING,
            health_reason=held_reason(check_name), updated_at=timezone.now())
    return True


def _release(node_id: int) -> None:
    """Back in service after its exclusive checks, unless one of them took it out."""
    _release_idle(Node.objects.filter(pk=node_id))


def _release_idle(nodes) -> int:
    """Give back those of the nodes held for an exclusive check where none runs any more (the
    reason cleared if it is still the hold's)."""
    exclusive = [name for name, check in health_checks().items() if check.exclusive]
    running = HealthCheckRun.objects.filter(state=CheckState.RUNNING, check_name__in=exclusive)
    held = Q(health_reason__startswith=HELD_PREFIX, health_reason__endswith=" runs")
    return nodes.filter(cordon_source=CordonSource.CHECK_RUNNING).exclude(
        pk__in=running.values("node_id")).update(
        schedulable=True, cordon_source=CordonSource.NONE,
        health_reason=Case(When(held, then=Value("")), default=F("health_reason"),
                           output_field=TextField()),
        updated_at=timezone.now())


def _sweep_holds(cluster: Cluster, totals: Counter) -> None:
    """Release nodes held for an exclusive check that no longer runs, however it ended (held
    and RUNNING are set in one transaction, so a check being started is never caught here)."""
    released = _release_idle(Node.objects.filter(cluster=cluster))
    if released:
        logger.warning("Cluster %s: released %d nodes held for health checks that no longer "
                       "run", cluster.name, released)
    totals["released"] += released


def _gangs(runs: list[HealthCheckRun], size: int) -> list[list[HealthCheckRun]]:
    """At most `size` runs a gang, none alone (a last single run joins the gang before)."""
    gangs = [runs[i:i + size] for i in range(0, len(runs), size)]
    if len(gangs) > 1 and len(gangs[-1]) == 1:
        gangs[-2].extend(gangs.pop())
    return gangs


def _start(cluster: Cluster, driver: ClusterDriver, check: HealthCheck,
           runs: list[HealthCheckRun], nodes: list[Node], now: datetime,
           totals: Counter, known: dict[int, dict[str, Any]]) -> bool:
    """Launch one workload for the runs (one replica each, on its node), their nodes held for
    an exclusive check (False, nothing started, when work was just placed on one). `known`
    keeps each node's facts for the rest of the tick: a node starts several checks at once.
    Whatever fails once the runs are RUNNING ends them, so their nodes are given back."""
    for run in runs:
        if run.node_id not in known:
            known[run.node_id] = node_facts(run.node, cluster=cluster, driver=driver,
                                            peers=_peers(run.node, nodes))
    facts = [known[run.node_id] for run in runs]
    workload_id = f"hc-{runs[0].pk}"
    with transaction.atomic():
        ids = [run.pk for run in runs]
        taken = set(HealthCheckRun.objects.select_for_update()
                    .filter(pk__in=ids, state=CheckState.PENDING).values_list("pk", flat=True))
        if taken != set(ids):
            return True  # another tick started them
        if check.exclusive and not _reserve(cluster, [run.node for run in runs], check.name):
            return False
        for index, (run, fact) in enumerate(zip(runs, facts, strict=True)):
            run.state, run.started_at, run.workload_id = CheckState.RUNNING, now, workload_id
            run.summary = ""
            # Kept for judging the result: what the node was expected to have.
            run.details = {"replica": index,
                           "facts": {k: fact[k] for k in ("gpus", "expected_driver")}}
        HealthCheckRun.objects.bulk_update(runs, ["state", "started_at", "workload_id",
                                                  "summary", "details"])
    try:
        driver.launch(_workload(check, runs, facts, workload_id))
    except DriverError as exc:
        for run in runs:
            _finish(run, Verdict.could_not_run(f"could not start: {exc}"), now, totals)
        return True
    except BaseException as exc:  # a bug, or the task's time limit: never hold the nodes on
        with contextlib.suppress(Exception):
            driver.cancel(workload_id)  # in case it started all the same
        with contextlib.suppress(Exception):
            for run in runs:
                _finish(run, Verdict.could_not_run(
                    f"could not start: {type(exc).__name__}: {exc}"), now, totals)
        raise
    totals["started"] += len(runs)
    return True


def _workload(check: HealthCheck, runs: list[HealthCheckRun], facts: list[dict[str, Any]],
              workload_id: str) -> Workload:
    gpus = min(min(run.node.gpus, fact["gpus"]) for run, fact in zip(runs, facts, strict=True))
    resources = Resources(gpus=gpus, cpu_cores=1, memory_mib=2048) if check.exclusive \
        else OBSERVE
    return Workload(
        id=workload_id,
        command=tuple(check.command(facts[0])),
        resources=resources,
        replicas=len(runs),
        placement=tuple(run.node.name for run in runs),
        # Observing checks hold no GPU; NVIDIA's container runtime still shows them all.
        env={"PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
             **({} if check.exclusive else {"NVIDIA_VISIBLE_DEVICES": "all"})},
        image=settings.OGAI_HEALTH_CHECK_IMAGE,
        labels={CHECK_LABEL: check.name, "ogai.tenant": HEALTH_TENANT},
    )


# The services --------------------------------------------------------------------------------


def health_checks_tick(*, now: datetime | None = None,
                       cluster_id: int | None = None) -> dict[str, int]:
    """One pass over every active cluster (or one): judge the runs that finished, end those past
    their timeout, make the checks that are due PENDING, and start what may start. Returns how
    many runs each step touched."""
    now = now or timezone.now()
    checks = health_checks()
    totals = _new_totals()
    clusters = Cluster.objects.filter(is_active=True).order_by("pk")
    if cluster_id is not None:
        clusters = clusters.filter(pk=cluster_id)
    for cluster in clusters:
        # First what needs no driver, so nothing that fails below keeps a node held or its
        # work on a node out of service.
        _sweep_holds(cluster, totals)
        _resend_moves(cluster, totals)
        try:
            driver = driver_for(cluster)
        except DriverError as exc:
            logger.warning("Cluster %s: no driver for health checks: %s", cluster.name, exc)
            _end_unanswered(cluster, None, _running(cluster), checks, now, totals, str(exc))
            continue
        _collect(cluster, driver, checks, now, totals)
        _schedule_due(cluster, driver, checks, now, totals)
        _start_pending(cluster, driver, checks, now, totals)
    return dict(totals)


def _enqueue_sync(cluster_id: int) -> None:
    from podsys.tasks.nodes import sync_nodes

    sync_nodes.delay(cluster_id=cluster_id)


def _enqueue_tick(cluster_id: int) -> None:
    from podsys.tasks.health import run_health_checks

    run_health_checks.delay(cluster_id=cluster_id)


@transaction.atomic
def health_check_run_now(*, actor, node: Node, check_name: str | None = None
                         ) -> list[HealthCheckRun]:
    """Run one check (or every single-node check) on the node now, whatever their schedule;
    a multi-node check named here pairs the node with another node of its cluster. Returns the
    runs (a check already pending or running there is not started twice); they start at the
    next tick, asked for on commit."""
    require_platform_admin(actor)
    # The cluster row first, as `_schedule_due` takes it: a manual and a scheduled run of a
    # check are never both made on a node.
    Cluster.objects.select_for_update(no_key=True).filter(pk=node.cluster_id).first()
    checks = health_checks()
    if check_name:
        if check_name not in checks:
            known = ", ".join(checks) or "none"
            raise ValidationError(
                {"check": f"Unknown health check {check_name!r}; known checks: {known}."})
        chosen = [checks[check_name]]
    else:
        chosen = [check for check in checks.values() if not check.multi_node]
    cluster = node.cluster
    if not cluster.is_active:
        raise ValidationError({"node": f"Cluster {cluster.name} is not active."})
    if node.health != NodeHealth.HEALTHY:
        raise ValidationError({"node": f"Node {node.name} is {node.get_health_display().lower()}"
                               f" ({node.health_reason or 'as its cluster reports'}): nothing "
                               "can run there."})
    runs = []
    for check in chosen:
        targets = [node]
        if check.multi_node:
            targets.append(_partner(node, check))
        for target in targets:
            live = HealthCheckRun.objects.filter(node=target, check_name=check.name,
                                                 state__in=LIVE_STATES).first()
            runs.append(live or HealthCheckRun.objects.create(
                node=target, check_name=check.name, severity=check.severity,
                trigger=CheckTrigger.MANUAL))
    audit_record(actor=actor, action="node.health_check", obj=node,
                 changes={"checks": [check.name for check in chosen]})
    cluster_id = cluster.pk
    transaction.on_commit(lambda: _enqueue_tick(cluster_id))
    return runs


def _partner(node: Node, check: HealthCheck) -> Node:
    cluster = node.cluster
    try:
        driver = driver_for(cluster)
    except DriverError as exc:
        raise ValidationError({"check": f"{check.name} cannot be run now: the "
                               f"{cluster.driver} driver of cluster {cluster.name} is not "
                               f"available ({exc})."}) from None
    if not driver.supports(FEATURE_MULTI_NODE):
        raise ValidationError({"check": f"{check.name} runs over several nodes, which the "
                               f"{cluster.driver} driver cannot do."})
    others = list(cluster.nodes.exclude(pk=node.pk).filter(health=NodeHealth.HEALTHY)
                  .order_by("name"))
    if not others:
        raise ValidationError({"check": f"{check.name} needs another node in cluster "
                               f"{cluster.name}."})
    held = {name for (_, name), gpus in gpu_allocations([cluster.pk]).items() if gpus}
    return next((other for other in others if other.name not in held), others[0])
