"""The watch over running deployments, every few seconds (`mmodel.watch_deployments`): where
each replica answers and whether its health endpoint does; a new job for a replica whose job
ended for good, and for one whose job runs but whose server has not answered /health for
longer than OGAI_REPLICA_UNHEALTHY_GRACE_S (a server alive but broken: AIStation sees a running
process and restarts nothing), or never answered within OGAI_REPLICA_START_TIMEOUT_S of its
start; idle deployments scaled to zero.

Health is asked outside any transaction, all replicas at once; what was learned is written per
deployment under its row lock, and only where the replica still has the job that was asked
(a user may have stopped or scaled it meanwhile). One deployment's trouble never stops the
others being looked at."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from aistation.choices import FINAL_STATES, LIVE_ATTEMPT_STATES, JobState
from aistation.models import Attempt
from infra_os.services.audit import audit_record
from mmodel.models import Deployment, DeploymentReplica, EvaluationRun
from mmodel.services.deployments import (
    MAX_RESUBMITS,
    MERGING,
    NoActor,
    platform_actor,
    replica_stop,
    replica_submit,
    serve_target,
)
from podsys.drivers.base import DriverError
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 2.0
MAX_PROBES_AT_ONCE = 16


@dataclass
class WatchResult:
    probed: int = 0
    ready: int = 0
    resubmitted: int = 0
    restarted: int = 0
    scaled_to_zero: int = 0


@dataclass(frozen=True)
class Probe:
    """What asking one replica's job found: where it answers (for attempt `workload_id`) and
    whether /health said so."""

    job_id: int
    workload_id: str
    upstream: str
    ok: bool
    message: str
    holds: tuple[str, ...] = ()


def probe_health(upstream: str) -> tuple[bool, str, tuple[str, ...]]:
    """(answered 200, why not, the model names a pool's server says it holds). No proxies
    from the environment: the address is internal."""
    try:
        with httpx.Client(timeout=HEALTH_TIMEOUT_S, trust_env=False) as client:
            response = client.get(f"{upstream}/health")
    except httpx.HTTPError as exc:
        return False, f"its server does not answer yet ({type(exc).__name__})", ()
    if response.status_code != 200:
        return False, f"its server's /health answered {response.status_code}", ()
    return True, "", _holds(response)


def _holds(response: httpx.Response) -> tuple[str, ...]:
    """What mmodel.runners.serve_pool's /health lists; () from any other server."""
    try:
        found = response.json().get("holds") or {}
        names = [*found.get("models", []), *found.get("adapters", [])]
    except (ValueError, AttributeError, TypeError):
        return ()
    return tuple(str(name) for name in names if isinstance(name, str))


def _current_attempts(job_ids: list[int]) -> dict[int, str]:
    """The live attempt's workload id of each job."""
    rows = Attempt.objects.filter(job_id__in=job_ids, state__in=LIVE_ATTEMPT_STATES) \
        .order_by("job_id", "number").values_list("job_id", "workload_id")
    return dict(rows)  # the highest number wins


def _probe_all(deployments: list[Deployment]) -> dict[int, Probe]:
    """Probes of every replica whose job runs, by replica id."""
    running = [(deployment, replica, replica.job.pk) for deployment in deployments
               for replica in deployment.replica_set.all()
               if replica.job is not None and replica.job.state == JobState.RUNNING]
    attempts = _current_attempts([job_id for _, _, job_id in running])
    targets: list[tuple[DeploymentReplica, int, str, str]] = []
    found: dict[int, Probe] = {}
    for deployment, replica, job_id in running:
        workload_id = attempts.get(job_id)
        if workload_id is None:
            continue
        upstream = replica.upstream if replica.workload_id == workload_id else ""
        if not upstream:  # asking a cluster where it answers costs a call: once per attempt
            try:
                upstream = driver_for(deployment.queue.cluster).endpoint(workload_id) or ""
            except DriverError as exc:
                found[replica.pk] = Probe(job_id, workload_id, "", False,
                                          f"its cluster does not say where it answers: {exc}")
                continue
        if not upstream:
            found[replica.pk] = Probe(job_id, workload_id, "", False,
                                      "its cluster gives no address for it yet")
            continue
        targets.append((replica, job_id, workload_id, upstream))
    if targets:
        with ThreadPoolExecutor(max_workers=min(MAX_PROBES_AT_ONCE, len(targets))) as pool:
            answers = list(pool.map(lambda target: probe_health(target[3]), targets))
        for (replica, job_id, workload_id, upstream), (ok, message, holds) in zip(
                targets, answers, strict=True):
            found[replica.pk] = Probe(job_id, workload_id, upstream, ok, message, holds)
    return found


def deployments_watch(*, now: datetime | None = None,
                      deployment_ids: list[int] | None = None) -> WatchResult:
    now = now or timezone.now()
    result = WatchResult()
    active = Deployment.objects.filter(active=True).select_related("queue__cluster") \
        .prefetch_related(Prefetch("replica_set",
                                   queryset=DeploymentReplica.objects.select_related("job")))
    if deployment_ids is not None:
        active = active.filter(pk__in=deployment_ids)
    deployments = list(active)
    probes = _probe_all(deployments)
    result.probed = sum(1 for probe in probes.values() if probe.upstream)
    for deployment in deployments:
        try:
            with transaction.atomic():
                _apply(deployment.pk, probes, now, result)
        except Exception:  # logged; the next deployment and the next run go on
            logger.exception("Deployment %s: watch failed", deployment.pk)
    return result


def _apply(deployment_id: int, probes: dict[int, Probe], now: datetime,
           result: WatchResult) -> None:
    deployment = Deployment.objects.select_for_update(of=("self",)).select_related(
        "tenant", "queue__cluster", "version__model", "version__base_version", "created_by",
    ).filter(pk=deployment_id, active=True).first()
    if deployment is None:
        return  # stopped or deleted meanwhile
    replicas = list(deployment.replica_set.select_related("job").order_by("index"))
    for replica in replicas:
        _watch_replica(deployment, replica, probes.get(replica.pk), now, result)
    if _idle(deployment, replicas, now) and _scale_to_zero(deployment, replicas):
        result.scaled_to_zero += 1


def _watch_replica(deployment: Deployment, replica: DeploymentReplica, probe: Probe | None,
                   now: datetime, result: WatchResult) -> None:
    job = replica.job
    if deployment.scaled_to_zero or replica.failed:
        return
    if job is None or job.state in FINAL_STATES:
        _replace(deployment, replica, now, result)
        return
    if job.state != JobState.RUNNING:
        _set(replica, ready=False, ready_since=None, upstream="", workload_id="",
             unhealthy_since=None, checked_at=now,
             message=f"job {job.pk} is {job.state}: {job.reason}")
        return
    if probe is None or probe.job_id != job.pk:
        return  # started after the probes were sent: asked next time
    if probe.ok:
        became = not replica.ready
        _set(replica, ready=True, upstream=probe.upstream, workload_id=probe.workload_id,
             checked_at=now, message="", resubmits=0, unhealthy_since=None, answered=True,
             ready_since=now if became else replica.ready_since, holds=list(probe.holds))
        result.ready += 1
        return
    # Not answering: counted from the first failed probe of this attempt (a new attempt of the
    # job, restarted by AIStation, starts afresh).
    same_attempt = probe.workload_id == replica.workload_id
    answered = replica.answered and same_attempt
    since = replica.unhealthy_since if same_attempt and replica.unhealthy_since else now
    grace = settings.OGAI_REPLICA_UNHEALTHY_GRACE_S if answered \
        else settings.OGAI_REPLICA_START_TIMEOUT_S
    if now - since > timedelta(seconds=grace):
        why = (f"its server failed its health check for over {grace:g} s" if answered else
               f"its server did not answer its health check within {grace:g} s of starting")
        _restart(deployment, replica, now, result, f"{why} ({probe.message})")
        return
    _set(replica, ready=False, ready_since=None, upstream=probe.upstream,
         workload_id=probe.workload_id, checked_at=now, message=probe.message,
         unhealthy_since=since, answered=answered)


def _set(replica: DeploymentReplica, **changes) -> None:
    changed = [name for name, value in changes.items() if getattr(replica, name) != value]
    if changed:
        for name in changed:
            setattr(replica, name, changes[name])
        replica.save(update_fields=changed)


def _restart(deployment: Deployment, replica: DeploymentReplica, now: datetime,
             result: WatchResult, why: str) -> None:
    """Its job runs but its server is broken: cancel the job, and a new one, within limits."""
    job = replica.job
    assert job is not None
    try:
        actor = platform_actor(deployment)
    except NoActor as exc:  # starting the deployment again replaces the job
        _set(replica, ready=False, ready_since=None, failed=True, checked_at=now,
             message=f"{why}; {exc}")
        return
    replica_stop(actor, replica, why)
    audit_record(actor=None, action="deployment.restart_replica", obj=deployment,
                 tenant=deployment.tenant,
                 changes={"replica": replica.index, "job": job.pk, "reason": why})
    result.restarted += 1
    _replace(deployment, replica, now, result, ended=f"job {job.pk} cancelled: {why}")


def _replace(deployment: Deployment, replica: DeploymentReplica, now: datetime,
             result: WatchResult, ended: str | None = None) -> None:
    """The replica's job ended for good (failed past its restarts, cancelled outside the
    deployment or by `_restart`, lost) or it has none yet (an adapter was merging): a new job,
    within limits."""
    job = replica.job
    if ended is None:
        ended = f"job {job.pk} {job.state}" + (f" ({job.reason})" if job.reason else "") \
            if job is not None else ""
    if job is not None and replica.resubmits >= MAX_RESUBMITS:
        _set(replica, ready=False, ready_since=None, upstream="", workload_id="", failed=True,
             checked_at=now, message=f"{ended}; gave up after {MAX_RESUBMITS} new jobs that "
             "never became ready: start the deployment again")
        return
    target, why = serve_target(deployment)
    if target is None and why != MERGING:  # the adapter's merge failed
        _set(replica, ready=False, failed=True, checked_at=now, message=why)
        return
    try:
        actor = platform_actor(deployment)
    except NoActor as exc:
        _set(replica, ready=False, failed=True, checked_at=now,
             message=f"{ended}; {exc}" if ended else str(exc))
        return
    reason = f"{ended}; started again" if ended else "started"
    submitted = replica_submit(actor, deployment, replica, reason)
    if submitted is not None and job is not None:
        replica.resubmits += 1
        replica.save(update_fields=["resubmits"])
        audit_record(actor=None, action="deployment.replace_replica", obj=deployment,
                     tenant=deployment.tenant,
                     changes={"replica": replica.index, "ended": job.pk, "job": submitted.pk})
        result.resubmitted += 1


def _idle(deployment: Deployment, replicas: list[DeploymentReplica], now: datetime) -> bool:
    """Idle past its timeout: no request since the last one, or since its first replica
    became ready if that is later. Never asked and never ready: starting, not idle."""
    if not deployment.idle_timeout_s or deployment.scaled_to_zero:
        return False
    # An evaluation scoring its endpoint calls the replicas directly, not through the gateway.
    if EvaluationRun.objects.filter(deployment=deployment, succeeded=False, job__isnull=False) \
            .exclude(job__state__in=FINAL_STATES).exists():
        return False
    first_ready = min((r.ready_since for r in replicas if r.ready_since), default=None)
    moments = [m for m in (deployment.last_request_at, first_ready) if m is not None]
    return bool(moments) and now - max(moments) > timedelta(seconds=deployment.idle_timeout_s)


def _scale_to_zero(deployment: Deployment, replicas: list[DeploymentReplica]) -> bool:
    try:
        actor = platform_actor(deployment)
    except NoActor as exc:
        logger.info("Deployment %s stays up though idle: %s", deployment.pk, exc)
        return False
    minutes = deployment.idle_timeout_s // 60
    for replica in replicas:
        replica_stop(actor, replica, f"scaled to zero after {minutes} min without requests; "
                     "the next request starts it again")
    deployment.scaled_to_zero = True
    deployment.save(update_fields=["scaled_to_zero", "updated_at"])
    audit_record(actor=None, action="deployment.scale_to_zero", obj=deployment,
                 tenant=deployment.tenant,
                 changes={"idle_timeout_s": deployment.idle_timeout_s,
                          "last_request_at": deployment.last_request_at.isoformat()
                          if deployment.last_request_at else None})
    return True
