"""Provisioning batches: install an OS on many servers at once through their BMCs.

Each server's run goes PREPARING (one-time boot from PXE, or the image as virtual media) →
REBOOTING (power cycle, polled until the BMC says On) → AWAITING_CALLBACK (the installer's
first-boot agent calls back with the run's one-time token) → PROVISIONED. A failure is retried
from the start (a fresh token) up to the batch's `max_attempts`, then the run FAILS with the
BMC's own words; the other servers carry on. At most `concurrency` runs of a batch are busy.

`run_advance` does one step and says when it wants to be called again; the `provision` queue's
task calls it, and a periodic sweep re-enqueues any run whose task was lost. BMC calls happen
outside database transactions; `claimed_until` keeps two workers off one run.
"""

import hashlib
import logging
import secrets
import time
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, F, ProtectedError, Q, Sum
from django.http import Http404
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.choices import (
    ACTIVE_RUN_STATES,
    BUSY_RUN_STATES,
    LIVE_LEASE_STATES,
    BatchState,
    BootMethod,
    RunState,
    ServerAllocation,
    ServerState,
)
from infra_os.drivers import BmcDriver, BmcError
from infra_os.drivers.base import BootDevice
from infra_os.models import (
    Bmc,
    ProvisioningBatch,
    ProvisioningProfile,
    ProvisioningRun,
    ProvisioningStep,
    Server,
)
from infra_os.services.audit import audit_record
from infra_os.services.servers import bmc_driver, normalise_mac
from ogai.crypto import decrypt, encrypt
from ogai.models import assign_changes
from ogai.request_context import in_networks

logger = logging.getLogger(__name__)

# How long one worker may hold a run before another may take it over: longer than the task's
# time limit (a step of slow BMC calls), so only a crashed worker's run is taken over.
CLAIM = timedelta(seconds=330)
# A task arriving this much before its run's next check still does it (clocks, countdowns).
DUE_TOLERANCE = timedelta(seconds=1)
# A busy run whose next check is this late has lost its task: the sweep enqueues it again.
SWEEP_GRACE = timedelta(seconds=10)
# Waits longer than this are left to the sweep instead of a delayed task held by a worker.
LONGEST_COUNTDOWN_S = 60.0
CALLBACK_FACTS = ("hostname", "ip", "os", "kernel")

Step = ProvisioningStep.Outcome


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _step(run: ProvisioningRun, name: str, message: str, outcome: str = Step.OK) -> None:
    ProvisioningStep.objects.create(run=run, attempt=run.attempt, name=name, outcome=outcome,
                                    message=message[:2000])


# Profiles

PROFILE_FIELDS = ("description", "boot_method", "user_data")


@transaction.atomic
def profile_create(*, actor, name: str, boot_method: str = BootMethod.PXE, user_data: str = "",
                   description: str = "") -> ProvisioningProfile:
    require_platform_admin(actor)
    profile = ProvisioningProfile(name=name, boot_method=boot_method, user_data=user_data,
                                  description=description)
    profile.full_clean()
    profile.save()
    audit_record(actor=actor, action="provisioning.profile_create", obj=profile,
                 changes={"boot_method": boot_method})
    return profile


@transaction.atomic
def profile_update(*, actor, profile: ProvisioningProfile, **fields) -> ProvisioningProfile:
    require_platform_admin(actor)
    changes = assign_changes(profile, fields, allowed=PROFILE_FIELDS)
    profile.full_clean()
    profile.save()
    if changes:
        audit_record(actor=actor, action="provisioning.profile_update", obj=profile,
                     changes={"fields": sorted(changes)})
    return profile


@transaction.atomic
def profile_delete(*, actor, profile: ProvisioningProfile) -> None:
    require_platform_admin(actor)
    audit_record(actor=actor, action="provisioning.profile_delete", obj=profile)
    try:
        with transaction.atomic():
            profile.delete()
    except ProtectedError:
        raise ValidationError("Batches used this profile: it is kept for their record.") from None


# Batches

def _refuse_busy(servers: list[Server]) -> None:
    """Every server must be installable now: a BMC, not retired, not leased, not a node."""
    problems = []
    has_bmc = set(Bmc.objects.filter(server__in=servers).values_list("server_id", flat=True))
    leased = set(Server.objects.filter(pk__in=[s.pk for s in servers],
                                       leases__state__in=LIVE_LEASE_STATES)
                 .values_list("pk", flat=True))
    running = set(ProvisioningRun.objects.filter(server__in=servers, state__in=ACTIVE_RUN_STATES)
                  .values_list("server_id", flat=True))
    for server in servers:
        if server.pk not in has_bmc:
            problems.append(f"{server.name}: it has no BMC to drive.")
        elif server.state == ServerState.RETIRED:
            problems.append(f"{server.name}: it is retired.")
        elif server.pk in leased:
            problems.append(f"{server.name}: it is leased; installing would wipe the tenant's "
                            "server.")
        elif server.allocation == ServerAllocation.CLUSTER:
            problems.append(f"{server.name}: it is a node of {server.allocated_to}.")
        elif server.pk in running:
            problems.append(f"{server.name}: another batch is provisioning it.")
    macs = [server.boot_mac for server in servers if server.boot_mac]
    for mac in sorted({mac for mac in macs if macs.count(mac) > 1}):
        names = ", ".join(s.name for s in servers if s.boot_mac == mac)
        problems.append(f"{names}: they share the boot MAC {mac}; correct it first.")
    if problems:
        raise ValidationError({"servers": problems})


@transaction.atomic
def batch_create(*, actor, name: str, profile: ProvisioningProfile, servers: list[Server],
                 image_url: str, boot_method: str = "", concurrency: int = 20,
                 max_attempts: int = 3, power_timeout_s: int = 300,
                 callback_timeout_s: int = 3600) -> ProvisioningBatch:
    """Start installing `image_url` on the servers with the profile; returns at once."""
    require_platform_admin(actor)
    if not servers:
        raise ValidationError({"servers": "Choose at least one server."})
    if not image_url.lower().startswith(("http://", "https://")):
        raise ValidationError({"image_url": "Give an http:// or https:// URL: BMCs fetch "
                               "images over HTTP."})
    servers = list(Server.objects.select_for_update().filter(pk__in={s.pk for s in servers})
                   .order_by("pk"))
    _refuse_busy(servers)
    batch = ProvisioningBatch(
        name=name, profile=profile, image_url=image_url,
        boot_method=boot_method or profile.boot_method, concurrency=concurrency,
        max_attempts=max_attempts, power_timeout_s=power_timeout_s,
        callback_timeout_s=callback_timeout_s, created_by=actor)
    batch.full_clean()
    batch.save()
    ProvisioningRun.objects.bulk_create(
        ProvisioningRun(batch=batch, server=server) for server in servers)
    audit_record(actor=actor, action="provisioning.batch_create", obj=batch,
                 changes={"servers": len(servers), "profile": profile.name,
                          "image_url": image_url, "boot_method": batch.boot_method,
                          "concurrency": concurrency})
    transaction.on_commit(lambda: batch_fill_slots(batch_id=batch.pk))
    return batch


@transaction.atomic
def batch_retry_failed(*, actor, batch: ProvisioningBatch) -> ProvisioningBatch:
    """A new batch, same settings, of the servers that failed in this one."""
    failed = list(Server.objects.filter(provisioning_runs__batch=batch,
                                        provisioning_runs__state=RunState.FAILED))
    if not failed:
        raise ValidationError("No server failed in this batch.")
    return batch_create(
        actor=actor, name=f"{batch.name} (retry)", profile=batch.profile, servers=failed,
        image_url=batch.image_url, boot_method=batch.boot_method,
        concurrency=batch.concurrency, max_attempts=batch.max_attempts,
        power_timeout_s=batch.power_timeout_s, callback_timeout_s=batch.callback_timeout_s)


@transaction.atomic
def batch_cancel(*, actor, batch: ProvisioningBatch) -> ProvisioningBatch:
    """Stop driving the batch's unfinished servers. What a server was doing (booting an
    installer) is not undone: it returns to `registered`."""
    require_platform_admin(actor)
    batch = ProvisioningBatch.objects.select_for_update().get(pk=batch.pk)
    if batch.state != BatchState.RUNNING:
        raise ValidationError(f"This batch is already {batch.get_state_display().lower()}.")
    now = timezone.now()
    open_runs = list(ProvisioningRun.objects.select_for_update()
                     .filter(batch=batch, state__in=ACTIVE_RUN_STATES).order_by("pk")
                     .values_list("pk", "server_id", "state"))
    # Servers whose install was under way are in an unknown state; those still waiting their
    # turn were never touched and keep theirs.
    Server.objects.filter(pk__in=[server for _, server, state in open_runs
                                  if state != RunState.WAITING]) \
        .update(state=ServerState.REGISTERED, updated_at=now)
    ProvisioningRun.objects.filter(pk__in=[pk for pk, _, _ in open_runs]).update(
        state=RunState.CANCELLED, finished_at=now, token_digest="", token_encrypted="",
        next_check_at=None, error="cancelled")
    _finish(batch, now, state=BatchState.CANCELLED)
    audit_record(actor=actor, action="provisioning.batch_cancel", obj=batch,
                 changes={"summary": {k: v for k, v in batch.summary.items() if k != "failures"}})
    return batch


def batch_fill_slots(*, batch_id: int) -> list[int]:
    """Start waiting runs while the batch has free slots; ends the batch when all are done."""
    runs = ProvisioningRun.objects.filter(batch_id=batch_id)
    if not runs.filter(state=RunState.WAITING).exists() and \
            runs.filter(state__in=BUSY_RUN_STATES).exists():
        return []  # nothing to start, nothing to finish: no need to lock the batch
    now = timezone.now()
    with transaction.atomic():
        batch = ProvisioningBatch.objects.select_for_update().get(pk=batch_id)
        if batch.state != BatchState.RUNNING:
            return []
        busy = batch.runs.filter(state__in=BUSY_RUN_STATES).count()
        picked = list(batch.runs.filter(state=RunState.WAITING).order_by("server__name")
                      .values_list("pk", flat=True)[:max(0, batch.concurrency - busy)])
        if picked:
            ProvisioningRun.objects.filter(pk__in=picked).update(
                state=RunState.PREPARING, attempt=1, started_at=now, next_check_at=now)
            Server.objects.filter(provisioning_runs__pk__in=picked) \
                .update(state=ServerState.PROVISIONING, updated_at=now)
            transaction.on_commit(lambda: enqueue_advance(picked))
        elif busy == 0 and not batch.runs.filter(state=RunState.WAITING).exists():
            _finish(batch, now)
    return picked


def _finish(batch: ProvisioningBatch, now, *, state: str | None = None) -> None:
    """Close the batch (locked by the caller) with its summary."""
    counts = dict(batch.runs.order_by().values_list("state").annotate(n=Count("pk")))
    totals = batch.runs.aggregate(ogai=Sum("ogai_seconds"), bmc=Sum("bmc_seconds"))
    provisioned = counts.get(RunState.PROVISIONED, 0)
    failed = counts.get(RunState.FAILED, 0)
    if state is None:
        state = (BatchState.SUCCEEDED if not failed else
                 BatchState.FAILED if not provisioned else BatchState.PARTIAL)
    batch.state = state
    batch.finished_at = now
    batch.summary = {
        "servers": sum(counts.values()),
        "provisioned": provisioned,
        "failed": failed,
        "cancelled": counts.get(RunState.CANCELLED, 0),
        "wall_s": round((now - batch.created_at).total_seconds(), 3),
        "ogai_s": round(totals["ogai"] or 0, 3),
        "bmc_s": round(totals["bmc"] or 0, 3),
        "failures": [
            {"server": name, "attempts": attempts, "error": error}
            for name, attempts, error in batch.runs.filter(state=RunState.FAILED)
            .order_by("server__name").values_list("server__name", "attempt", "error")
        ],
    }
    batch.save(update_fields=["state", "finished_at", "summary", "updated_at"])


# One run, one step at a time

def run_advance(*, run_id: int) -> float | None:
    """Take the run's next step; returns seconds until it wants to be called again, or None
    when it needs no call (finished, waiting its turn, or another worker holds it)."""
    now = timezone.now()
    # Only when due: a late duplicate of the task (the sweep re-enqueued a run whose own task
    # was merely slow) finds nothing to do, so a run never grows two chains of tasks.
    claimed = ProvisioningRun.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
        Q(next_check_at__isnull=True) | Q(next_check_at__lte=now + DUE_TOLERANCE),
        pk=run_id, state__in=BUSY_RUN_STATES,
    ).update(claimed_until=now + CLAIM)
    if not claimed:
        return None
    started = time.perf_counter()
    run = ProvisioningRun.objects.select_related("batch", "batch__profile", "server__bmc") \
        .get(pk=run_id)
    driver: BmcDriver | None = None
    delay: float | None = None
    try:
        if run.state == RunState.AWAITING_CALLBACK:
            delay = _check_callback_deadline(run, now)
        else:
            driver = bmc_driver(run.server)
            if run.state == RunState.PREPARING:
                delay = _prepare(run, driver, now)
            else:
                delay = _check_power(run, driver, now)
    except BmcError as exc:
        delay = _fail(run, f"the BMC said: {exc}", step="bmc", retryable=exc.retryable)
    except Exception as exc:  # a bug or a setting must fail the attempt, not stall the run
        logger.exception("Provisioning run %s: step failed", run_id)
        delay = _fail(run, f"OGAI could not take this step: {type(exc).__name__}: {exc}",
                      step="internal", retryable=True)
    finally:
        bmc_s = driver.bmc_seconds if driver else 0.0
        if driver:
            driver.close()
        own_s = max(0.0, time.perf_counter() - started - bmc_s)
        ProvisioningRun.objects.filter(pk=run_id).update(
            claimed_until=None, ogai_seconds=F("ogai_seconds") + own_s,
            bmc_seconds=F("bmc_seconds") + bmc_s)
    return delay


def _poll_s() -> float:
    return settings.OGAI_PROVISION_POLL_S


def _prepare(run: ProvisioningRun, driver: BmcDriver, now) -> float | None:
    batch = run.batch
    if batch.boot_method == BootMethod.VIRTUAL_MEDIA:
        driver.insert_media(batch.image_url)
        _step(run, "boot", f"virtual media: inserted {batch.image_url}")
        driver.set_one_time_boot(BootDevice.CD)
        _step(run, "boot", "next boot (once): virtual CD")
    else:
        driver.set_one_time_boot(BootDevice.PXE)
        _step(run, "boot", "next boot (once): network (PXE)")
    token = secrets.token_urlsafe(32)
    moved = ProvisioningRun.objects.filter(pk=run.pk, state=RunState.PREPARING).update(
        state=RunState.REBOOTING, token_digest=_digest(token), token_encrypted=encrypt(token),
        deadline_at=now + timedelta(seconds=batch.power_timeout_s),
        next_check_at=now + timedelta(seconds=_poll_s()))
    if not moved:  # cancelled meanwhile
        return None
    run.state = RunState.REBOOTING
    driver.power("cycle")
    _step(run, "power", "power cycle requested; waiting for the BMC to report On")
    return _poll_s()


def _check_power(run: ProvisioningRun, driver: BmcDriver, now) -> float | None:
    batch = run.batch
    power = driver.power_state()
    if power == "On":
        deadline = now + timedelta(seconds=batch.callback_timeout_s)
        moved = ProvisioningRun.objects.filter(pk=run.pk, state=RunState.REBOOTING).update(
            state=RunState.AWAITING_CALLBACK, deadline_at=deadline, next_check_at=deadline)
        if moved:
            run.state = RunState.AWAITING_CALLBACK
            _step(run, "power", "powered on; waiting for the first-boot agent to call back "
                  f"(at most {batch.callback_timeout_s} s)")
        return float(batch.callback_timeout_s)
    if run.deadline_at and now >= run.deadline_at:
        return _fail(run, f"the server did not power on within {batch.power_timeout_s} s "
                     f"(the BMC reports {power or 'nothing'})", step="power", retryable=True)
    ProvisioningRun.objects.filter(pk=run.pk, state=RunState.REBOOTING) \
        .update(next_check_at=now + timedelta(seconds=_poll_s()))
    return _poll_s()


def _check_callback_deadline(run: ProvisioningRun, now) -> float | None:
    if run.deadline_at and now < run.deadline_at:
        return (run.deadline_at - now).total_seconds()
    return _fail(run, f"no first-boot callback within {run.batch.callback_timeout_s} s of "
                 "power-on", step="callback", retryable=True)


def _fail(run: ProvisioningRun, message: str, *, step: str, retryable: bool) -> float | None:
    """Retry the run from the start, or fail it for good once its attempts are spent."""
    now = timezone.now()
    batch = run.batch
    with transaction.atomic():
        locked = ProvisioningRun.objects.select_for_update().get(pk=run.pk)
        if locked.state not in BUSY_RUN_STATES:
            return None
        _step(locked, step, message, Step.ERROR)
        cleared = {"token_digest": "", "token_encrypted": "", "deadline_at": None,
                   "error": message}
        if retryable and locked.attempt < batch.max_attempts:
            retry_s = settings.OGAI_PROVISION_RETRY_S
            ProvisioningRun.objects.filter(pk=run.pk).update(
                state=RunState.PREPARING, attempt=F("attempt") + 1,
                next_check_at=now + timedelta(seconds=retry_s), **cleared)
            locked.attempt += 1
            _step(locked, "retry", f"attempt {locked.attempt} of {batch.max_attempts} "
                  f"in {retry_s:g} s")
            return retry_s
        ProvisioningRun.objects.filter(pk=run.pk).update(
            state=RunState.FAILED, finished_at=now, next_check_at=None, **cleared)
        Server.objects.filter(pk=run.server_id).update(state=ServerState.FAILED, updated_at=now)
        attempts = f"after {locked.attempt} attempt{'s' if locked.attempt != 1 else ''}"
        _step(locked, "failed", f"gave up {attempts}: {message}", Step.ERROR)
        transaction.on_commit(lambda: batch_fill_slots(batch_id=batch.pk))
    return None


# The installed server answering

def run_callback(*, token: str, facts: dict | None = None) -> ProvisioningRun:
    """The first-boot agent of a freshly installed server calls back with its run's one-time
    token: the server is provisioned. A token works once, and only while its attempt waits."""
    refused = PermissionDenied("This provisioning token is not valid: it is unknown, already "
                               "used, or its attempt is over.")
    if not isinstance(token, str) or not token:
        raise refused
    now = timezone.now()
    with transaction.atomic():
        run = ProvisioningRun.objects.select_for_update().select_related("server").filter(
            token_digest=_digest(token),
            state__in=(RunState.REBOOTING, RunState.AWAITING_CALLBACK)).first()
        if run is None:
            raise refused
        ProvisioningRun.objects.filter(pk=run.pk).update(
            state=RunState.PROVISIONED, finished_at=now, token_digest="", token_encrypted="",
            next_check_at=None, deadline_at=None, error="")
        Server.objects.filter(pk=run.server_id).update(
            state=ServerState.PROVISIONED, power_state="On", updated_at=now)
        said = {key: str(value)[:200] for key, value in (facts or {}).items()
                if key in CALLBACK_FACTS and value}
        detail = ", ".join(f"{key} {value}" for key, value in said.items())
        _step(run, "callback", "the first-boot agent called back" +
              (f" ({detail})" if detail else ""))
        batch_id = run.batch_id
        transaction.on_commit(lambda: batch_fill_slots(batch_id=batch_id))
    run.state = RunState.PROVISIONED
    return run


def from_provisioning_network(address: str | None) -> bool:
    """Whether a request comes from one of `OGAI_PROVISIONING_NETWORKS` (the networks servers
    boot on), where boot configs are served and callbacks accepted."""
    return in_networks(address, settings.OGAI_PROVISIONING_NETWORKS)


def boot_config(*, mac: str, callback_url: str) -> dict:
    """What a server booting its installer needs, found by the MAC it boots from: the image,
    the profile's user data, where to call back and the one-time token. Served once per
    attempt, only while that server's run waits for its first boot (and, by the view, only to
    the provisioning networks)."""
    try:
        mac = normalise_mac(mac)
    except ValidationError:
        raise Http404("No server boots from this MAC.") from None
    with transaction.atomic():
        runs = list(ProvisioningRun.objects.select_for_update(of=("self",))
                    .select_related("server", "batch__profile").filter(
                        server__boot_mac=mac,
                        state__in=(RunState.REBOOTING, RunState.AWAITING_CALLBACK))
                    .exclude(token_encrypted="")[:2])
        if len(runs) != 1:
            raise Http404("No server booting from this MAC is being provisioned (or several "
                          "share it).")
        run = runs[0]
        token = decrypt(run.token_encrypted)
        # Handed out once: the digest still proves the callback, the token is no longer kept.
        ProvisioningRun.objects.filter(pk=run.pk).update(token_encrypted="")
        _step(run, "boot", "the installer fetched its boot config")
    return {
        "server": run.server.name,
        "image_url": run.batch.image_url,
        "boot_method": run.batch.boot_method,
        "user_data": run.batch.profile.user_data,
        "callback_url": callback_url,
        "token": token,
    }


# Keeping it moving

def provisioning_sweep(*, now=None) -> int:
    """Re-enqueue busy runs whose task is overdue (lost, or a long wait left to the sweep) and
    fill or finish running batches. Returns the runs enqueued."""
    now = now or timezone.now()
    due = list(ProvisioningRun.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
        state__in=BUSY_RUN_STATES, next_check_at__lte=now - SWEEP_GRACE,
    ).values_list("pk", flat=True)[:1000])
    for batch_id in ProvisioningBatch.objects.filter(state=BatchState.RUNNING) \
            .values_list("pk", flat=True):
        batch_fill_slots(batch_id=batch_id)
    enqueue_advance(due)
    return len(due)


def enqueue_advance(run_ids: list[int], countdown: float = 0) -> None:
    from infra_os.tasks import advance_run

    for pk in run_ids:
        advance_run.apply_async(kwargs={"run_id": pk}, countdown=countdown)
