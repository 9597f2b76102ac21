"""Provisioning (platform admins only): profiles, and batches that install an image on many
servers at once. A batch's page draws a tile per server, coloured by its run's state, and polls
while the batch runs."""

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from frontend.forms import add_service_errors
from frontend.forms_servers import BatchCreateForm, ProfileForm
from frontend.lists import list_response
from frontend.responses import wants_partial
from frontend.tables_servers import BatchTable, ProfileTable
from infra_os.access import require_platform_admin
from infra_os.choices import (
    ACTIVE_RUN_STATES,
    LIVE_LEASE_STATES,
    BatchState,
    RunState,
    ServerAllocation,
    ServerState,
)
from infra_os.filtersets import ProvisioningBatchFilterSet
from infra_os.models import ProvisioningRun, ProvisioningStep
from infra_os.selectors import (
    provisioning_batch_list,
    provisioning_profile_list,
    provisioning_run_list,
    server_list,
)
from infra_os.services.provisioning import (
    batch_cancel,
    batch_create,
    batch_retry_failed,
    profile_create,
    profile_delete,
    profile_update,
)

# How often the batch page asks for its grid while the batch runs.
POLL_S = 2


# Batches

@login_required
def batches(request):
    require_platform_admin(request.user)
    return list_response(
        request,
        template="frontend/provisioning/batches.html",
        table_class=BatchTable,
        queryset=provisioning_batch_list(user=request.user),
        filterset_class=ProvisioningBatchFilterSet,
    )


def _installable(request):
    """Servers a batch can take now (the service checks again, under lock)."""
    return (server_list(user=request.user).select_related(None).select_related("rack")
            .filter(bmc__isnull=False, allocation=ServerAllocation.FREE)
            .exclude(state=ServerState.RETIRED)
            .exclude(leases__state__in=LIVE_LEASE_STATES)
            .exclude(provisioning_runs__state__in=ACTIVE_RUN_STATES))


def _batch_form(request, data=None) -> BatchCreateForm:
    initial = {"servers": request.GET.getlist("servers")} if data is None else {}
    return BatchCreateForm(
        data, initial=initial,
        profiles=provisioning_profile_list(user=request.user),
        servers=server_list(user=request.user).select_related(None).select_related("rack"),
        installable=list(_installable(request)),
    )


@login_required
def batch_create_view(request):
    require_platform_admin(request.user)
    form = _batch_form(request, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            batch = batch_create(actor=request.user, **form.service_kwargs())
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            count = len(form.cleaned_data["servers"])
            messages.success(request, f"Batch {batch.name} started: {count} server"
                             f"{'s' if count != 1 else ''}, {batch.concurrency} at a time.")
            return redirect("frontend:batch", pk=batch.pk)
    return render(request, "frontend/provisioning/batch_form.html", {
        "form": form, "has_profiles": form.fields["profile"].queryset.exists(),
    }, status=400 if form.errors else 200)


@dataclass(frozen=True)
class RunTile:
    """One server of a batch: its run, the steps so far, and whether its history is shown."""

    run: ProvisioningRun
    steps: list[ProvisioningStep]
    open: bool

    @property
    def last_step(self) -> ProvisioningStep | None:
        return self.steps[-1] if self.steps else None


def _open_tiles(request) -> set[int]:
    """The tiles whose history the reader has open (the poller sends them, so a refresh keeps
    them open)."""
    return {int(part) for part in request.GET.get("open", "").split(",") if part.isdigit()}


@login_required
def batch_detail(request, pk: int):
    """The batch's servers as tiles. An htmx request (the page's poller, every 2 s while the
    batch runs) gets the grid area alone; a finished batch's grid stops asking."""
    batch = get_object_or_404(provisioning_batch_list(user=request.user), pk=pk)
    require_platform_admin(request.user)
    runs = (provisioning_run_list(user=request.user).filter(batch_id=batch.pk)
            .prefetch_related("steps").order_by("server__name"))
    opened = _open_tiles(request)
    tiles = [RunTile(run, list(run.steps.all()), run.pk in opened) for run in runs]
    running = batch.state == BatchState.RUNNING
    counts = [(state, label, getattr(batch, f"runs_{state}", 0))
              for state, label in RunState.choices]
    wall_s = (timezone.now() - batch.created_at).total_seconds() if running \
        else batch.summary.get("wall_s")
    context = {
        "batch": batch,
        "tiles": tiles,
        "counts": counts,
        "running": running,
        "poll_s": POLL_S,
        "wall_s": wall_s,
        "summary": batch.summary if not running else {},
        "failed_runs": [tile.run for tile in tiles if tile.run.state == RunState.FAILED],
    }
    template = "frontend/provisioning/batch_grid.html" if wants_partial(request) \
        else "frontend/provisioning/batch_detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def batch_cancel_view(request, pk: int):
    batch = get_object_or_404(provisioning_batch_list(user=request.user), pk=pk)
    require_platform_admin(request.user)
    try:
        batch = batch_cancel(actor=request.user, batch=batch)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        cancelled = batch.summary.get("cancelled", 0)
        messages.success(request, f"Batch {batch.name} cancelled: {cancelled} server"
                         f"{'s' if cancelled != 1 else ''} not finished were let go.")
    return redirect("frontend:batch", pk=batch.pk)


@login_required
@require_POST
def batch_retry_view(request, pk: int):
    batch = get_object_or_404(provisioning_batch_list(user=request.user), pk=pk)
    require_platform_admin(request.user)
    try:
        retry = batch_retry_failed(actor=request.user, batch=batch)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:batch", pk=batch.pk)
    messages.success(request, f"Batch {retry.name} started with the servers that failed in "
                     f"{batch.name}.")
    return redirect("frontend:batch", pk=retry.pk)


# Profiles

@login_required
def profiles(request):
    require_platform_admin(request.user)
    return list_response(
        request,
        template="frontend/provisioning/profiles.html",
        table_class=ProfileTable,
        queryset=provisioning_profile_list(user=request.user),
    )


@login_required
def profile_create_view(request):
    require_platform_admin(request.user)
    form = ProfileForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            profile = profile_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Profile {profile.name} added.")
            return redirect("frontend:profiles")
    return render(request, "frontend/provisioning/profile_form.html", {
        "form": form, "heading": "New provisioning profile", "submit_label": "Add profile",
    })


@login_required
def profile_edit_view(request, name: str):
    profile = get_object_or_404(provisioning_profile_list(user=request.user), name=name)
    require_platform_admin(request.user)
    form = ProfileForm(request.POST or None, initial=ProfileForm.initial_from(profile),
                       editing=True)
    if request.method == "POST" and form.is_valid():
        fields = {key: value for key, value in form.cleaned_data.items() if key != "name"}
        try:
            profile_update(actor=request.user, profile=profile, **fields)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Profile {profile.name} saved.")
            return redirect("frontend:profiles")
    return render(request, "frontend/provisioning/profile_form.html", {
        "form": form, "profile": profile, "heading": f"Profile {profile.name}",
        "submit_label": "Save",
    })


@login_required
@require_POST
def profile_delete_view(request, name: str):
    profile = get_object_or_404(provisioning_profile_list(user=request.user), name=name)
    require_platform_admin(request.user)
    try:
        profile_delete(actor=request.user, profile=profile)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Profile {name} deleted.")
    return redirect("frontend:profiles")
