"""Notebooks (JupyterLab environments) of the current tenant: the list, starting one, one
notebook's page, stop, resume and delete, and the tenant's idle limit. The console's pages live
under /environments/: /notebooks/<id>/ is the notebook server itself, behind the proxy.
Writes go through aistation's notebook services, reads through its selectors."""

from datetime import datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from aistation.models import Notebook
from aistation.selectors import notebook_list, queue_list
from aistation.services.notebooks import (
    idle_timeout_s,
    notebook_delete,
    notebook_gpu_hours,
    notebook_policy_set,
    notebook_resume,
    notebook_start,
    notebook_state,
    notebook_stop,
    notebooks_gpu_hours,
)
from frontend.access import console_access, current_tenant
from frontend.forms import (
    NOTEBOOK_START_FIELD_MAP,
    NotebookPolicyForm,
    NotebookStartForm,
    add_service_errors,
)
from frontend.responses import wants_partial

# States in which a notebook may still change by itself: its pages follow it.
LIVE_STATES = ("waiting", "starting", "running")


def _current_notebooks(request):
    tenant = current_tenant(request)
    queryset = notebook_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _current_queues(request):
    tenant = current_tenant(request)
    queryset = queue_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _describe(notebook: Notebook, timeout_s: int, now: datetime, gpu_hours: float) -> dict:
    """What a page shows of one notebook: its state, why it waits, the idle timer."""
    state = notebook_state(notebook)
    idle_left_min = None
    if state == "running":
        since = notebook.last_activity_at or (notebook.job.started_at if notebook.job else None)
        if since is not None:
            left = since + timedelta(seconds=timeout_s) - now
            idle_left_min = max(0, int(left.total_seconds() // 60))
    return {
        "notebook": notebook,
        "state": state,
        "reason": notebook.job.reason if notebook.job is not None and state == "waiting" else "",
        "live": state in LIVE_STATES,
        "gpu_hours": gpu_hours,
        "idle_left_min": idle_left_min,
        "idle_timeout_min": timeout_s // 60,
    }


@login_required
def notebooks(request):
    """The list; an htmx request (the table's own poller) gets the table alone."""
    tenant = current_tenant(request)
    now = timezone.now()
    rows: list[dict] = []
    timeout_s = None
    if tenant is not None:
        found = list(_current_notebooks(request))
        timeout_s = idle_timeout_s(tenant)
        hours = notebooks_gpu_hours(found, now) if found else {}
        rows = [_describe(notebook, timeout_s, now, hours.get(notebook.pk, 0.0))
                for notebook in found]
    context = {
        "rows": rows,
        "live": any(row["live"] for row in rows),
        "idle_timeout_min": timeout_s // 60 if timeout_s is not None else None,
    }
    if tenant is not None and not wants_partial(request) and console_access(request).can_admin:
        context["policy_form"] = NotebookPolicyForm(initial={"idle_minutes": timeout_s // 60})
    template = "frontend/notebooks/table.html" if wants_partial(request) \
        else "frontend/notebooks/list.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
def notebook_start_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:notebooks")
    if not console_access(request).can_write:
        raise PermissionDenied("Viewers cannot start notebooks.")
    queues = _current_queues(request).filter(is_active=True)
    initial = {"queue": int(request.GET["queue"])} if request.GET.get("queue", "").isdigit() \
        else {}
    form = NotebookStartForm(request.POST or None, initial=initial, queues=queues)
    status = 200
    if request.method == "POST" and form.is_valid():
        try:
            notebook = notebook_start(actor=request.user, tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc, field_map=NOTEBOOK_START_FIELD_MAP)
        except PermissionDenied as exc:
            form.add_error(None, str(exc) or "You may not start notebooks in this tenant.")
            status = 403
        else:
            messages.success(request, f"Notebook {notebook.pk} ({notebook.name}) started: it "
                             f"waits in queue {notebook.queue.name} until it can run.")
            return redirect("frontend:notebook", pk=notebook.pk)
    return render(request, "frontend/notebooks/start.html",
                  {"form": form, "has_queues": queues.exists()}, status=status)


def _detail_context(notebook: Notebook) -> dict:
    now = timezone.now()
    context = _describe(notebook, idle_timeout_s(notebook.tenant), now,
                        notebook_gpu_hours(notebook, now))
    context["events"] = list(notebook.events.select_related("job"))
    return context


@login_required
def notebook_detail_view(request, pk: int):
    """The notebook's page; `?part=status` is what changes while it lives (state, actions,
    facts and events), which the page polls."""
    notebook = get_object_or_404(_current_notebooks(request), pk=pk)
    template = "frontend/notebooks/status.html" if request.GET.get("part") == "status" \
        else "frontend/notebooks/detail.html"
    response = render(request, template, _detail_context(notebook))
    patch_vary_headers(response, ("HX-Request",))
    return response


def _back(request, notebook: Notebook):
    """Back where the button was: the list, or the notebook's page."""
    if request.POST.get("next") == "list" or notebook.deleted:
        return redirect("frontend:notebooks")
    return redirect("frontend:notebook", pk=notebook.pk)


def _act(request, pk: int, action, done: str):
    notebook = get_object_or_404(_current_notebooks(request), pk=pk)
    try:
        action(actor=request.user, notebook=notebook)
    except (ValidationError, PermissionDenied) as exc:
        text = " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, text)
        return _back(request, notebook)
    notebook.refresh_from_db()
    messages.success(request, f"Notebook {notebook.pk} ({notebook.name}) {done}")
    return _back(request, notebook)


@login_required
@require_POST
def notebook_stop_view(request, pk: int):
    return _act(request, pk, notebook_stop,
                "stopped: its GPUs are freed, its home folder stays.")


@login_required
@require_POST
def notebook_resume_view(request, pk: int):
    return _act(request, pk, notebook_resume,
                "resumed: it waits in its queue until it can run.")


@login_required
@require_POST
def notebook_delete_view(request, pk: int):
    return _act(request, pk, notebook_delete, "deleted.")


@login_required
@require_POST
def notebook_policy_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:notebooks")
    form = NotebookPolicyForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(m for errors in form.errors.values() for m in errors))
        return redirect("frontend:notebooks")
    minutes = form.cleaned_data["idle_minutes"]
    try:
        notebook_policy_set(actor=request.user, tenant=tenant, idle_timeout_s=minutes * 60)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{tenant}'s notebooks now stop after {minutes} min idle.")
    return redirect("frontend:notebooks")
