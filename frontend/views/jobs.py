"""Jobs of the current tenant: the list, submitting, one job with its live logs, cancel and
rerun. Writes go through aistation's services, reads through its selectors."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from aistation.choices import ACTIVE_STATES, FINAL_STATES, AttemptState, JobState
from aistation.selectors import job_list, queue_list, workdir_list
from aistation.services.jobs import job_cancel, job_rerun, job_submit
from aistation.services.manifests import job_manifests
from aistation.services.workdirs import check_workdir_size, workdir_upload
from frontend.access import console_access, current_tenant
from frontend.filters import ConsoleJobFilterSet
from frontend.forms import JOB_SUBMIT_FIELD_MAP, JobSubmitForm, add_service_errors
from frontend.lists import list_response
from frontend.tables_jobs import JobTable
from podsys.drivers.base import DriverError
from podsys.runtime import driver_for

LOG_TAIL_LINES = 500
# The job page lists this many of its working folder's files.
WORKDIR_FILES_SHOWN = 200
PARTS = {
    "logs": "frontend/jobs/logs.html",
    "status": "frontend/jobs/status.html",
    "manifests": "frontend/jobs/manifests.html",
}


def _current_jobs(request):
    tenant = current_tenant(request)
    queryset = job_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _current_queues(request):
    tenant = current_tenant(request)
    queryset = queue_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


@login_required
def jobs(request):
    return list_response(
        request,
        template="frontend/jobs/list.html",
        table_class=JobTable,
        queryset=_current_jobs(request),
        filterset_class=ConsoleJobFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"q": "Search", "state": "State", "queue": "Queue", "owner": "Owner"},
    )


@login_required
def job_submit_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:jobs")
    if request.method != "POST" and not console_access(request).can_write:
        raise PermissionDenied("Viewers cannot submit jobs.")
    queues = _current_queues(request).filter(is_active=True)
    initial, source = {}, None
    copy_of = request.GET.get("from", "")
    if request.method != "POST" and copy_of.isdigit():
        source = get_object_or_404(_current_jobs(request), pk=int(copy_of))
        initial = JobSubmitForm.initial_from(source)
    elif request.GET.get("queue", "").isdigit():
        initial = {"queue": int(request.GET["queue"])}
    form = JobSubmitForm(request.POST or None, request.FILES or None, initial=initial,
                         queues=queues, workdirs=workdir_list(user=request.user).filter(
                             tenant_id=tenant.pk))
    if request.method == "POST" and form.is_valid():
        try:
            job = _submit(request, tenant, form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc, field_map=JOB_SUBMIT_FIELD_MAP)
        else:
            messages.success(request, f"Job {job.pk} ({job.name}) submitted to queue "
                             f"{job.queue.name}.")
            return redirect("frontend:job", pk=job.pk)
    return render(request, "frontend/jobs/submit.html", {
        "form": form, "has_queues": queues.exists(),
        "copy_of": copy_of if initial and copy_of.isdigit() else "",
        "kept_workdir": source.workdir if source else None,
    })


def _submit(request, tenant, data: dict):
    """Upload the form's archive (when one came) as the job's working folder, then submit."""
    data = dict(data)
    archive = data.pop("workdir_archive")
    if archive is not None:
        # Refused by the size the browser declared, with the same words as the API.
        length = request.META.get("CONTENT_LENGTH", "")
        check_workdir_size(int(length) if length.isdigit() else None)
        data["workdir"], _ = workdir_upload(actor=request.user, tenant=tenant, archive=archive)
    return job_submit(actor=request.user, tenant=tenant, **data)


def _choice(raw: str | None, allowed) -> int | None:
    """The whole number `raw` if it is one of `allowed`, else None."""
    if raw is None or not raw.isdigit():
        return None
    value = int(raw)
    return value if value in allowed else None


def _log_context(request, job) -> dict:
    """The log view of one attempt and replica of `job`: the newest attempt and replica 0
    unless the request names others. It follows the job (polls) while the job may still write
    to the attempt shown."""
    attempts = sorted(job.attempts.all(), key=lambda attempt: attempt.number)
    by_number = {attempt.number: attempt for attempt in attempts}
    chosen = _choice(request.GET.get("attempt"), by_number)
    attempt = by_number[chosen] if chosen is not None else (attempts[-1] if attempts else None)
    replica = _choice(request.GET.get("replica"), range(job.replicas)) or 0
    if attempt is None:
        text = ""
        note = "No attempt yet: the log starts when the job does."
    elif not attempt.launched:
        text = ""
        note = "The attempt is starting; its log appears once it runs."
    else:
        try:
            text = driver_for(job.cluster).logs(attempt.workload_id, tail=LOG_TAIL_LINES,
                                                replica=replica)
        except DriverError as exc:
            text = ""
            note = f"The log is unavailable: {exc}"
        else:
            note = "" if text else "The attempt has written nothing yet."
    newest = attempts[-1].number if attempts else None
    return {
        "job": job,
        "log_attempts": attempts,
        "log_attempt": attempt,
        "log_chosen": chosen,
        "log_replica": replica,
        "log_replicas": range(job.replicas),
        "log_text": text,
        "log_note": note,
        "log_newest": newest,
        "log_tail": LOG_TAIL_LINES,
        "log_live": job.state not in FINAL_STATES and chosen in (None, newest),
    }


def _status_context(job) -> dict:
    now = timezone.now()
    started, finished = job.started_at, job.finished_at
    # Run time only while it holds GPUs or once it ended: a job queued again after a restart
    # is not running.
    running = started and (finished or job.state in ACTIVE_STATES)
    attempts = sorted(job.attempts.all(), key=lambda attempt: attempt.number)
    # GPU time held so far: ended attempts, and the one running now (the fair policy's measure).
    service_s = job.attained_gpu_s + sum(
        job.gpus * (now - attempt.started_at).total_seconds()
        for attempt in attempts if attempt.state == AttemptState.RUNNING and attempt.started_at)
    return {
        "job": job,
        "live": job.state not in FINAL_STATES,
        "waiting": job.state == JobState.QUEUED,
        "attempts": attempts,
        "service_gpu_h": service_s / 3600,
        "events": list(job.events.all()),
        "ran_s": ((finished or now) - started).total_seconds() if running else None,
        "waited_s": job.waited_s + ((now - job.queued_at).total_seconds()
                                    if job.state == JobState.QUEUED and job.queued_at else 0),
    }


def _manifests_context(job) -> dict:
    """What the job's attempt runs (or would run) on its cluster, or why it cannot
    be rendered."""
    try:
        return {"job": job, "manifests": job_manifests(job=job), "manifests_error": ""}
    except ValidationError as exc:
        return {"job": job, "manifests": "", "manifests_error": " ".join(exc.messages)}


def _workdir_context(job) -> dict:
    files = job.workdir.files if job.workdir_id else []
    return {"workdir_files": files[:WORKDIR_FILES_SHOWN],
            "workdir_more": max(0, len(files) - WORKDIR_FILES_SHOWN)}


@login_required
def job_detail_view(request, pk: int):
    """The job's page; `?part=logs` is its log view, `?part=status` its state, attempts and
    events, which the page polls while the job runs, and `?part=manifests` the Kubernetes
    objects it is made of."""
    job = get_object_or_404(
        _current_jobs(request).prefetch_related("attempts", "events"), pk=pk
    )
    part = request.GET.get("part", "")
    context: dict = {}
    if part == "logs":
        context |= _log_context(request, job)
    elif part == "status":
        context |= _status_context(job)
    elif part == "manifests":
        context |= _manifests_context(job)
    else:
        context |= _status_context(job) | _log_context(request, job) | _workdir_context(job)
    response = render(request, PARTS.get(part, "frontend/jobs/detail.html"), context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def job_cancel_view(request, pk: int):
    job = get_object_or_404(_current_jobs(request), pk=pk)
    try:
        job_cancel(actor=request.user, job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Job {job.pk} ({job.name}) cancelled; its processes are "
                         "being stopped.")
    return redirect("frontend:job", pk=job.pk)


@login_required
@require_POST
def job_rerun_view(request, pk: int):
    job = get_object_or_404(_current_jobs(request), pk=pk)
    try:
        rerun = job_rerun(actor=request.user, job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:job", pk=job.pk)
    messages.success(request, f"Job {rerun.pk} submitted: a rerun of job {job.pk}.")
    return redirect("frontend:job", pk=rerun.pk)
