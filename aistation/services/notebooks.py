"""Notebooks: JupyterLab environments that run as service jobs and are reached only through the
platform (`aistation.proxy`). Each start is a new job in the notebook's queue (quota, queue, a
reason while it waits); stopping cancels it and frees its GPUs; the home folder stays.

Who may do what: the owner and the tenant's admins stop, resume and delete a notebook; only its
owner opens it (its session acts as the owner); nobody else reaches it (404)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from aistation.choices import ACTIVE_STATES, FINAL_STATES, JobState
from aistation.labels import OWNER_LABEL
from aistation.logstore.base import StoreDown
from aistation.models import Job, Notebook, NotebookEvent, NotebookPolicy, Queue
from aistation.models.notebooks import DEFAULT_IDLE_TIMEOUT_S
from aistation.selectors_logs import tenant_log_bytes
from aistation.services.jobs import job_cancel, job_submit
from infra_os.access import role_in
from infra_os.choices import ADMIN_ROLES, WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from infra_os.services.tokens import api_token_create, api_token_revoke
from ogai.crypto import decrypt, encrypt
from podsys.drivers import driver_class
from podsys.drivers.base import SERVICE_PORT_ARG, DataMount, DriverError
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)
JUPYTER_PORT = 8888  # inside a pod; the local driver takes a free port of this machine
SDK_TOKEN_LIFETIME = timedelta(days=7)


@dataclass(frozen=True)
class ProxyTarget:
    upstream: str  # "http://127.0.0.1:PORT"; the Jupyter server's base_url is /notebooks/<id>/
    token: str  # the Jupyter server's token, sent in a header, never in a URL


class NotebookNotFound(Exception):
    """No such notebook, or the user may not reach it."""


class NotebookNotRunning(Exception):
    """The notebook exists but no server answers for it now; the message says why."""


# -- who may -------------------------------------------------------------------------------------


def _may_manage(user, notebook: Notebook) -> bool:
    """Manage it (stop, resume, delete): its owner, and the tenant's admins."""
    if not getattr(user, "is_authenticated", False) or notebook.deleted:
        return False
    if notebook.owner_id == user.pk:
        return role_in(user, notebook.tenant_id) in WRITE_ROLES
    return role_in(user, notebook.tenant_id) in ADMIN_ROLES


def _may_open(user, notebook: Notebook) -> bool:
    """Open it: its owner only. The session holds the owner's SDK token, and code the owner
    wrote runs in the page: nobody else's browser goes there."""
    return _may_manage(user, notebook) and notebook.owner_id == user.pk


def _require_manage(user, notebook: Notebook) -> None:
    if not _may_manage(user, notebook):
        raise PermissionDenied("Only the notebook's owner and the tenant's admins may do this.")


def notebook_home(notebook: Notebook) -> Path:
    """Kept across sessions. Named by id and creation time: a database started afresh beside
    an old data directory never hands a new notebook an old one's files."""
    folder = f"{notebook.pk}-{notebook.created_at:%Y%m%dT%H%M%S%f}"
    return Path(settings.DATA_DIR) / "notebooks" / folder / "home"


def notebook_state(notebook: Notebook) -> str:
    """stopped, waiting (queued), starting (admitted), running, or failed (its last session)."""
    job = notebook.job
    if job is None:
        return "stopped"
    if job.state in (JobState.QUEUED, JobState.RESTARTING, JobState.PREEMPTED):
        return "waiting"
    if job.state == JobState.ADMITTED:
        return "starting"
    if job.state == JobState.RUNNING:
        return "running"
    if job.state == JobState.FAILED:
        return "failed"
    return "stopped"


def idle_timeout_s(tenant: Tenant) -> int:
    policy = NotebookPolicy.objects.filter(tenant=tenant).first()
    return policy.idle_timeout_s if policy else DEFAULT_IDLE_TIMEOUT_S


# -- sessions ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _command(notebook: Notebook, driver: str) -> tuple[list[str], int]:
    """JupyterLab serving under /notebooks/<id>/, its token from JUPYTER_TOKEN (never argv),
    and the port it answers on (0: the one its node gives it)."""
    home = notebook_home(notebook)
    common = [f"--ServerApp.base_url=/notebooks/{notebook.pk}/", f"--ServerApp.root_dir={home}",
              "--ServerApp.open_browser=False", "--ServerApp.port_retries=0"]
    remote = ["--ServerApp.ip=0.0.0.0", "--ServerApp.allow_remote_access=True"]
    if driver_class(driver).assigns_ports:
        # A process of a node, as the tenant's account, in the nodes' own environment.
        return ["python", "-m", "jupyterlab", *remote,
                f"--ServerApp.port={SERVICE_PORT_ARG}", *common], 0
    if driver == "local":
        port = _free_port()
        # Local sessions run as the platform's own user, which Jupyter refuses when it is
        # root unless told (kernels run code as that user whatever Jupyter says).
        as_root = ["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []
        return [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}", *as_root, *common], port
    return ["jupyter", "lab", *remote, f"--ServerApp.port={JUPYTER_PORT}", *common], \
        JUPYTER_PORT


def _folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                continue
    return total


def _check_storage(tenant: Tenant) -> None:
    """Notebook homes (their sizes as of their last session's end) and the tenant's lines in
    the log store count against its storage quota: a tenant over it starts no session until
    it frees space (or shortens its log retention)."""
    quota = getattr(tenant, "quota", None)
    if quota is None:
        return
    homes = Notebook.objects.filter(tenant=tenant, deleted=False) \
        .aggregate(total=Sum("home_bytes"))["total"] or 0
    try:
        logs = tenant_log_bytes(tenant.pk)
    except StoreDown:
        logs = 0  # not known now: the homes alone decide
    limit = quota.storage_gib * 2**30
    if homes + logs >= limit:
        raise ValidationError({"storage": (
            f"{tenant.name} holds {(homes + logs) / 2**30:.1f} GiB of its {quota.storage_gib} "
            f"GiB storage quota (notebook homes {homes / 2**30:.1f} GiB, job logs "
            f"{logs / 2**30:.1f} GiB): delete files or notebooks, shorten the log retention, "
            "or ask for more.")})


def _start_session(actor, notebook: Notebook, kind: str, reason: str) -> Notebook:
    """A new job for the notebook, with fresh tokens (the Jupyter server's, and the SDK's API
    token acting as the owner), both only in the job's secret environment."""
    _check_storage(notebook.tenant)
    home = notebook_home(notebook)
    home.mkdir(parents=True, exist_ok=True)
    command, port = _command(notebook, notebook.queue.cluster.driver)
    server_token = secrets.token_urlsafe(32)
    sdk = api_token_create(actor=notebook.owner, name=f"notebook {notebook.pk}",
                           expires_at=timezone.now() + SDK_TOKEN_LIFETIME)
    job = job_submit(
        actor=actor, tenant=notebook.tenant, queue=notebook.queue,
        name=f"notebook-{notebook.pk}", command=command, image=notebook.image,
        gpus_per_replica=notebook.gpus, gpu_model=notebook.gpu_model,
        cpu_per_replica=notebook.cpu, memory_mib_per_replica=notebook.memory_mib,
        max_restarts=3, service=True, ports=[port],
        env={"HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
             "OGAI_URL": settings.OGAI_INTERNAL_URL, "OGAI_NOTEBOOK_ID": str(notebook.pk)},
        secret_env={"JUPYTER_TOKEN": server_token, "OGAI_TOKEN": sdk.secret},
        mounts=[DataMount(str(home), read_only=False)],
        labels={OWNER_LABEL: f"the notebook {notebook.name}"},
    )
    notebook.job = job
    notebook.server_token = encrypt(server_token)
    notebook.sdk_token = sdk.token
    notebook.last_activity_at = timezone.now()
    notebook.save(update_fields=["job", "server_token", "sdk_token", "last_activity_at",
                                 "updated_at"])
    NotebookEvent.objects.create(notebook=notebook, kind=kind, reason=reason, job=job)
    audit_record(actor=actor, action=f"notebook.{kind}", obj=notebook, tenant=notebook.tenant,
                 changes={"job": job.pk})
    return notebook


@transaction.atomic
def notebook_start(*, actor, tenant: Tenant, queue: Queue, name: str, image: str = "",
                   gpus: int = 0, gpu_model: str = "", cpu: float = 1.0,
                   memory_mib: int = 4096) -> Notebook:
    """Create a notebook and start its first session."""
    if role_in(actor, tenant) not in WRITE_ROLES:
        raise PermissionDenied("Viewers cannot start notebooks.")
    if queue.tenant_id != tenant.pk:
        raise ValidationError({"queue": f"No queue {queue.name!r} in {tenant.name}."})
    if not name.strip():
        raise ValidationError({"name": "Give the notebook a name."})
    notebook = Notebook.objects.create(
        tenant=tenant, owner=actor, queue=queue, name=name.strip(), image=image, gpus=gpus,
        gpu_model=gpu_model, cpu=cpu, memory_mib=memory_mib)
    return _start_session(actor, notebook, "started", f"started by {actor.get_username()}")


def _end_session(actor, notebook: Notebook, kind: str, reason: str) -> None:
    """Cancel the session's job (as `actor`, or, when the platform itself ends it, as the
    owner) and revoke the session's SDK token."""
    job = notebook.job
    if job is not None and job.state not in FINAL_STATES:
        job_cancel(actor=actor or notebook.owner, job=job)
    if notebook.sdk_token is not None:
        api_token_revoke(actor=notebook.owner, token=notebook.sdk_token)
    notebook.home_bytes = _folder_bytes(notebook_home(notebook))
    notebook.save(update_fields=["home_bytes", "updated_at"])
    NotebookEvent.objects.create(notebook=notebook, kind=kind, reason=reason)
    audit_record(actor=actor, action=f"notebook.{kind}", obj=notebook, tenant=notebook.tenant,
                 changes={"reason": reason})


def _locked(notebook: Notebook, *related: str) -> Notebook:
    """The notebook's row, locked (only it: its job may be NULL, which PostgreSQL cannot lock
    through an outer join), with `related` read alongside."""
    return Notebook.objects.select_for_update(of=("self",)).select_related(*related) \
        .get(pk=notebook.pk)


@transaction.atomic
def notebook_stop(*, actor, notebook: Notebook, reason: str = "") -> Notebook:
    """Stop the session: its GPUs are freed, its home folder stays."""
    _require_manage(actor, notebook)
    notebook = _locked(notebook, "job")
    if notebook_state(notebook) in ("stopped", "failed"):
        raise ValidationError({"state": f"Notebook {notebook.pk} is not running."})
    _end_session(actor, notebook, "stopped", reason or f"stopped by {actor.get_username()}")
    return notebook


@transaction.atomic
def notebook_resume(*, actor, notebook: Notebook) -> Notebook:
    """Start a stopped notebook again, with its home folder as it was."""
    _require_manage(actor, notebook)
    notebook = _locked(notebook, "job", "queue__cluster")
    if notebook_state(notebook) not in ("stopped", "failed"):
        raise ValidationError({"state": f"Notebook {notebook.pk} is already "
                               f"{notebook_state(notebook)}."})
    return _start_session(actor, notebook, "resumed", f"resumed by {actor.get_username()}")


@transaction.atomic
def notebook_delete(*, actor, notebook: Notebook) -> None:
    """Stop it if it runs and hide it; its home folder is removed from the quota's count by
    the storage sweep, not here (a delete must not wait on a large folder)."""
    _require_manage(actor, notebook)
    notebook = _locked(notebook, "job")
    if notebook_state(notebook) not in ("stopped", "failed"):
        _end_session(actor, notebook, "stopped", "stopped before deletion")
    notebook.deleted = True
    notebook.save(update_fields=["deleted", "updated_at"])
    NotebookEvent.objects.create(notebook=notebook, kind="deleted",
                                 reason=f"deleted by {actor.get_username()}")
    audit_record(actor=actor, action="notebook.delete", obj=notebook, tenant=notebook.tenant)


@transaction.atomic
def notebook_policy_set(*, actor, tenant: Tenant, idle_timeout_s: int) -> NotebookPolicy:
    """A tenant admin sets how long the tenant's notebooks may sit idle (5 minutes to a week)."""
    if role_in(actor, tenant) not in ADMIN_ROLES:
        raise PermissionDenied("Only the tenant's admins set its notebook policy.")
    if not 300 <= idle_timeout_s <= 7 * 24 * 3600:
        raise ValidationError({"idle_timeout_s": "Use 5 minutes (300 s) to a week."})
    policy, _ = NotebookPolicy.objects.update_or_create(
        tenant=tenant, defaults={"idle_timeout_s": idle_timeout_s})
    audit_record(actor=actor, action="notebook_policy.set", obj=policy, tenant=tenant,
                 changes={"idle_timeout_s": idle_timeout_s})
    return policy


# -- the proxy's questions ---------------------------------------------------------------------


# Where each running session answers, by notebook: (job id, upstream, valid until). Asking a
# cluster costs a call to its API; a proxied page makes dozens of requests a second.
_upstreams: dict[int, tuple[int, str, float]] = {}
UPSTREAM_CACHE_S = 30.0


def _target(notebook: Notebook) -> ProxyTarget:
    """The running session's address and token, whoever asks (callers check access)."""
    state = notebook_state(notebook)
    job = notebook.job
    if state != "running" or job is None:
        why = f": {job.reason}" if job is not None and state == "waiting" else ""
        hint = "; start it from the console" if state in ("stopped", "failed") else ""
        raise NotebookNotRunning(f"notebook {notebook.pk} is {state}{why}{hint}")
    cached = _upstreams.get(notebook.pk)
    if cached is not None and cached[0] == job.pk and cached[2] > time.monotonic():
        upstream: str | None = cached[1]
    else:
        attempt = job.attempts.order_by("-number").first()
        try:
            upstream = driver_for(notebook.queue.cluster).endpoint(attempt.workload_id) \
                if attempt is not None else None
        except DriverError as exc:
            logger.warning("Notebook %s: no endpoint: %s", notebook.pk, exc)
            raise NotebookNotRunning(f"notebook {notebook.pk}: its cluster does not say where "
                                     "it answers yet; try again in a moment") from None
        if upstream:
            _upstreams[notebook.pk] = (job.pk, upstream, time.monotonic() + UPSTREAM_CACHE_S)
    if not upstream:
        raise NotebookNotRunning(f"notebook {notebook.pk} has no address yet")
    return ProxyTarget(upstream=upstream, token=decrypt(notebook.server_token))


def notebook_proxy_target(*, user, notebook_id: int) -> ProxyTarget:
    notebook = Notebook.objects.select_related("job", "queue__cluster") \
        .filter(pk=notebook_id).first()
    if notebook is None or not _may_open(user, notebook):
        raise NotebookNotFound(notebook_id)
    return _target(notebook)


def notebook_touch(*, notebook_id: int) -> None:
    """A browser used the notebook now (the proxy says so)."""
    Notebook.objects.filter(pk=notebook_id).update(last_activity_at=timezone.now())


# -- idle culling --------------------------------------------------------------------------------


def _server_activity(target: ProxyTarget, notebook_id: int) -> tuple[datetime | None, bool]:
    """(the server's last activity, whether anything is busy or connected now), from Jupyter's
    own API: /api/status (last_activity, connections) and each kernel's execution state."""
    base = f"{target.upstream}/notebooks/{notebook_id}/api"
    headers = {"Authorization": f"token {target.token}"}
    # no_track_activity: asking must not itself count as activity. No proxies from the
    # environment: the token goes to the server only.
    params = {"no_track_activity": "1"}
    with httpx.Client(timeout=10, headers=headers, params=params, trust_env=False) as client:
        status = client.get(f"{base}/status").raise_for_status().json()
        kernels = client.get(f"{base}/kernels").raise_for_status().json()
    moments = [status.get("last_activity")] + [k.get("last_activity") for k in kernels]
    last = max((datetime.fromisoformat(m.replace("Z", "+00:00")) for m in moments if m),
               default=None)
    busy = bool(status.get("connections")) or any(
        k.get("execution_state") == "busy" or k.get("connections") for k in kernels)
    return last, busy


def notebook_cull(*, now: datetime | None = None) -> list[int]:
    """Stop every running notebook idle longer than its tenant's timeout: no kernel busy, no
    browser connected, and no activity (Jupyter's, or through the proxy) since. Returns the
    ids stopped. A server that cannot be asked is left alone this time; one notebook's trouble
    never stops the others being looked at. Also revokes the SDK tokens of sessions that ended
    some other way (the job cancelled from its page, failed for good)."""
    now = now or timezone.now()
    _revoke_ended_sessions()
    culled = []
    running = Notebook.objects.filter(deleted=False, job__state=JobState.RUNNING) \
        .select_related("job", "tenant", "owner", "queue__cluster")
    for notebook in running:
        try:
            if _cull_one(notebook, now):
                culled.append(notebook.pk)
        except Exception:  # logged; the next notebook and the next run go on
            logger.exception("Notebook %s: idle check failed", notebook.pk)
    return culled


def _cull_one(notebook: Notebook, now: datetime) -> bool:
    try:
        last, busy = _server_activity(_target(notebook), notebook.pk)
    except (NotebookNotRunning, httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
        logger.info("Notebook %s: activity unknown (%s)", notebook.pk, type(exc).__name__)
        return False
    seen = max(filter(None, [last, notebook.last_activity_at]), default=None)
    timeout = idle_timeout_s(notebook.tenant)
    if busy or seen is None or now - seen < timedelta(seconds=timeout):
        return False
    idle_min = int((now - seen).total_seconds() // 60)
    with transaction.atomic():
        notebook = _locked(notebook, "job", "owner", "tenant")
        if notebook.job is None or notebook.job.state != JobState.RUNNING:
            return False  # stopped meanwhile
        _end_session(None, notebook, "culled",
                     f"idle for {idle_min} min (the tenant's limit is {timeout // 60} min); "
                     "its home folder is kept: resume it to go on")
    return True


def _revoke_ended_sessions() -> None:
    ended = Notebook.objects.filter(sdk_token__revoked_at=None, job__state__in=FINAL_STATES) \
        .select_related("sdk_token", "owner")
    for notebook in ended:
        if notebook.sdk_token is not None:
            api_token_revoke(actor=notebook.owner, token=notebook.sdk_token)


def notebooks_gpu_hours(notebooks, now: datetime | None = None) -> dict[int, float]:
    """GPU-hours each notebook's sessions have held so far, the running one included, for a
    whole page of notebooks in two queries."""
    now = now or timezone.now()
    sessions = NotebookEvent.objects.filter(notebook__in=notebooks).exclude(job=None) \
        .values_list("notebook_id", "job_id")
    jobs_of: dict[int, set[int]] = {}
    for notebook_id, job_id in sessions:
        jobs_of.setdefault(notebook_id, set()).add(job_id)
    held: dict[int, float] = {}
    job_ids = set().union(*jobs_of.values()) if jobs_of else set()
    for job in Job.objects.filter(pk__in=job_ids).prefetch_related("attempts"):
        total = 0.0
        for attempt in job.attempts.all():
            if attempt.started_at is None:
                continue
            end = attempt.finished_at or (now if job.state in ACTIVE_STATES else None)
            if end is not None:
                total += job.gpus * (end - attempt.started_at).total_seconds() / 3600
        held[job.pk] = total
    return {notebook.pk: sum(held.get(job_id, 0.0) for job_id in jobs_of.get(notebook.pk, ()))
            for notebook in notebooks}


def notebook_gpu_hours(notebook: Notebook, now: datetime | None = None) -> float:
    return notebooks_gpu_hours([notebook], now)[notebook.pk]


def idle_timeouts(tenant_ids) -> dict[int, int]:
    """Each tenant's idle limit, in one query."""
    limits = dict(NotebookPolicy.objects.filter(tenant_id__in=tenant_ids)
                  .values_list("tenant_id", "idle_timeout_s"))
    return {tenant_id: limits.get(tenant_id, DEFAULT_IDLE_TIMEOUT_S) for tenant_id in tenant_ids}
