"""Queues of the current tenant: the list, one queue's backlog and running jobs, and (for
tenant admins) creating and changing queues."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django_tables2 import RequestConfig

from aistation.choices import ACTIVE_STATES, JobState
from aistation.filtersets import QueueFilterSet
from aistation.selectors import job_list, queue_list
from aistation.services.queues import QUEUE_FIELDS, queue_create, queue_update
from frontend.access import console_access, current_tenant
from frontend.forms import QueueCreateForm, QueueUpdateForm, add_service_errors
from frontend.lists import PER_PAGE, list_response
from frontend.responses import wants_partial
from frontend.tables_jobs import BacklogTable, QueueTable, RunningJobsTable
from podsys.selectors import cluster_list


def _current_queues(request):
    tenant = current_tenant(request)
    queryset = queue_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


@login_required
def queues(request):
    return list_response(
        request,
        template="frontend/queues/list.html",
        table_class=QueueTable,
        queryset=_current_queues(request),
        filterset_class=QueueFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"cluster": "Cluster", "policy": "Policy", "is_active": "Active"},
        table_kwargs={"exclude": () if console_access(request).can_admin else ("actions",)},
    )


@login_required
def queue_detail(request, pk: int):
    """A queue's backlog, in the order the scheduler considers it, with each job's reason to
    wait, and its running jobs. An htmx request (the page's poller) gets the jobs area alone."""
    queue = get_object_or_404(_current_queues(request), pk=pk)
    jobs = job_list(user=request.user).filter(queue_id=queue.pk)
    backlog = BacklogTable(
        jobs.filter(state=JobState.QUEUED).order_by(
            F("position").asc(nulls_last=True), "-priority", "queued_at", "pk"),
        prefix="waiting-",
    )
    running = RunningJobsTable(
        jobs.filter(state__in=ACTIVE_STATES).order_by("started_at", "pk"), prefix="running-",
    )
    config = RequestConfig(request, paginate={"per_page": PER_PAGE})
    config.configure(backlog)
    config.configure(running)
    context = {"queue": queue, "backlog": backlog, "running": running,
               "live": queue.pending > 0 or queue.running > 0}
    template = "frontend/queues/jobs.html" if wants_partial(request) \
        else "frontend/queues/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _queue_clusters(request, tenant):
    """Clusters a queue of `tenant` may use: shared ones and the tenant's own."""
    return cluster_list(user=request.user).filter(
        Q(tenant__isnull=True) | Q(tenant_id=tenant.pk), is_active=True)


@login_required
def queue_create_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:queues")
    if request.method != "POST" and not console_access(request).can_admin:
        raise PermissionDenied("Only a tenant admin can create queues.")
    form = QueueCreateForm(request.POST or None, clusters=_queue_clusters(request, tenant))
    if request.method == "POST" and form.is_valid():
        try:
            queue = queue_create(actor=request.user, tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Queue {queue.name} created on cluster "
                             f"{queue.cluster.name}.")
            return redirect("frontend:queue", pk=queue.pk)
    return render(request, "frontend/queues/form.html", {
        "form": form, "heading": f"New queue in {tenant}", "submit_label": "Create queue",
    })


@login_required
def queue_edit_view(request, pk: int):
    queue = get_object_or_404(_current_queues(request), pk=pk)
    if request.method != "POST" and not console_access(request).can_admin:
        raise PermissionDenied("Only a tenant admin can change queues.")
    initial = {field: getattr(queue, field) for field in QUEUE_FIELDS}
    form = QueueUpdateForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            queue_update(actor=request.user, queue=queue, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Queue {queue.name} saved.")
            return redirect("frontend:queue", pk=queue.pk)
    return render(request, "frontend/queues/form.html", {
        "form": form, "queue": queue, "heading": f"Edit queue {queue.name}",
        "submit_label": "Save queue",
    })
