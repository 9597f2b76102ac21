"""Software stacks (platform admins only): profiles checked against the compatibility matrix,
and deployment runs, each with a live grid of its nodes' tasks. Writes go through
podsys.services.stack and .deployments, reads through podsys.selectors."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from frontend.forms import add_service_errors
from frontend.forms_podsys import DeploymentStartForm, StackProfileForm
from frontend.lists import list_response
from frontend.responses import wants_partial
from frontend.tables_podsys import DeploymentRunTable, StackProfileTable, run_duration_s
from infra_os.access import require_platform_admin
from podsys.choices import DeploymentState
from podsys.selectors import (
    cluster_list,
    deployment_grid,
    deployment_run_list,
    node_list,
    stack_profile_list,
)
from podsys.services.deployments import (
    deployment_cancel,
    deployment_rerun_failed,
    deployment_start,
)
from podsys.services.stack import stack_profile_create, stack_profile_delete, stack_profile_update

# How often a running deployment's page asks for its grid.
POLL_S = 2
LIVE_STATES = {DeploymentState.QUEUED, DeploymentState.RUNNING}
# The play recap's columns, as Ansible prints them, and their keys in DeploymentRun.stats.
RECAP_COLUMNS = (("ok", "ok"), ("changed", "changed"), ("unreachable", "unreachable"),
                 ("failed", "failures"), ("skipped", "skipped"), ("rescued", "rescued"),
                 ("ignored", "ignored"))
HOST_STATES = ("pending", "running", "ok", "failed", "unreachable")


# Profiles

def _profiles(request):
    return stack_profile_list(user=request.user)


@login_required
def stack_profiles(request):
    require_platform_admin(request.user)
    return list_response(
        request,
        template="frontend/podsys/stack/profiles.html",
        table_class=StackProfileTable,
        queryset=_profiles(request),
    )


@login_required
def stack_profile_create_view(request):
    require_platform_admin(request.user)
    form = StackProfileForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            profile = stack_profile_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Stack profile {profile.name} added.")
            return redirect("frontend:stack-profiles")
    return render(request, "frontend/podsys/stack/profile_form.html", {
        "form": form, "heading": "New stack profile", "submit_label": "Add profile",
    }, status=400 if form.errors else 200)


@login_required
def stack_profile_edit_view(request, name: str):
    require_platform_admin(request.user)
    profile = get_object_or_404(_profiles(request), name=name)
    form = StackProfileForm(request.POST or None, initial=StackProfileForm.initial_from(profile),
                            editing=True)
    if request.method == "POST" and form.is_valid():
        fields = {key: value for key, value in form.cleaned_data.items() if key != "name"}
        try:
            stack_profile_update(actor=request.user, profile=profile, **fields)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Stack profile {profile.name} saved.")
            return redirect("frontend:stack-profiles")
    return render(request, "frontend/podsys/stack/profile_form.html", {
        "form": form, "profile": profile, "heading": f"Stack profile {profile.name}",
        "submit_label": "Save",
    }, status=400 if form.errors else 200)


@login_required
@require_POST
def stack_profile_delete_view(request, name: str):
    require_platform_admin(request.user)
    profile = get_object_or_404(_profiles(request), name=name)
    try:
        stack_profile_delete(actor=request.user, profile=profile)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Stack profile {name} deleted.")
    return redirect("frontend:stack-profiles")


# Deployment runs

def _runs(request):
    return deployment_run_list(user=request.user)


@login_required
def deployment_runs(request):
    require_platform_admin(request.user)
    return list_response(
        request,
        template="frontend/podsys/runs/list.html",
        table_class=DeploymentRunTable,
        queryset=_runs(request),
    )


def _deploy_form(request, data=None) -> DeploymentStartForm:
    """The form, its node boxes those of the cluster chosen (in the POST, else `?cluster=`)."""
    clusters = cluster_list(user=request.user).filter(is_active=True)
    source = data if data is not None else request.GET
    chosen = clusters.filter(name=source.get("cluster", "")).first()
    nodes = node_list(user=request.user).filter(cluster=chosen).order_by("name") \
        if chosen else []
    initial = {}
    if data is None:
        initial = {key: request.GET[key] for key in ("cluster", "profile") if key in request.GET}
        if request.GET.get("check_mode"):
            initial["check_mode"] = True
    return DeploymentStartForm(data, initial=initial, clusters=clusters,
                               profiles=stack_profile_list(user=request.user),
                               chosen_cluster=chosen, nodes=nodes)


@login_required
def deployment_run_create_view(request):
    """Deploy a profile. An htmx request (the cluster select changed) gets the form again, its
    node boxes those of the new cluster."""
    require_platform_admin(request.user)
    form = _deploy_form(request, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            run = deployment_start(actor=request.user, **form.service_kwargs())
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            count = len(run.hosts)
            messages.success(request, f"Deployment of {form.cleaned_data['profile'].name} to "
                             f"{count} node{'s' if count != 1 else ''} of {run.cluster.name} "
                             f"started{' in check mode' if run.check_mode else ''}.")
            return redirect("frontend:deployment-run", pk=run.pk)
    template = "frontend/podsys/runs/form_nodes.html" if wants_partial(request) \
        else "frontend/podsys/runs/form.html"
    response = render(request, template, {
        "form": form, "has_profiles": form.fields["profile"].queryset.exists(),
    }, status=400 if form.errors else 200)
    patch_vary_headers(response, ("HX-Request",))
    return response


def play_recap(stats: dict, hosts: list[str]) -> list[dict]:
    """The play recap, a row per node, the run's nodes first: `stats` as the run keeps it,
    {host: {"ok": n, "changed": n, "failures": n, "unreachable": n, ...}}."""
    names = [host for host in hosts if host in stats] + \
        sorted(host for host in stats if host not in hosts)
    return [{"host": host, **{column: int((stats[host] or {}).get(key, 0))
                              for column, key in RECAP_COLUMNS}}
            for host in names]


def _role_groups(tasks: list[dict]) -> list[dict]:
    """Consecutive tasks of one role, for the grid's upper header row."""
    groups: list[dict] = []
    for task in tasks:
        role = task.get("role") or ""
        if groups and groups[-1]["role"] == role:
            groups[-1]["span"] += 1
        else:
            groups.append({"role": role, "span": 1})
    return groups


@login_required
def deployment_run_detail(request, pk: int):
    """The run's grid, nodes by tasks. An htmx request (the page's poller, every 2 s while the
    run is queued or running) gets the grid area alone; a finished run's grid stops asking."""
    require_platform_admin(request.user)
    run = get_object_or_404(_runs(request), pk=pk)
    grid = deployment_grid(run=run)
    hosts = grid.get("hosts") or []
    tasks = grid.get("tasks") or []
    live = run.state in LIVE_STATES
    counts = {state: sum(1 for host in hosts if host.get("state") == state)
              for state in HOST_STATES}
    # Each host's cells beside the task they belong to, for the cells' tooltips.
    rows = [{**host, "row": list(zip(tasks, host.get("cells") or [], strict=False))}
            for host in hosts]
    context = {
        "run": run,
        "tasks": tasks,
        "hosts": rows,
        "role_groups": _role_groups(tasks),
        "has_roles": any(task.get("role") for task in tasks),
        "counts": counts,
        "live": live,
        "poll_s": POLL_S,
        "took_s": run_duration_s(run),
        "recap": play_recap(run.stats or {}, list(run.hosts or [])),
        "failed_hosts": counts["failed"] + counts["unreachable"],
    }
    template = "frontend/podsys/runs/grid.html" if wants_partial(request) \
        else "frontend/podsys/runs/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def deployment_run_rerun_view(request, pk: int):
    require_platform_admin(request.user)
    run = get_object_or_404(_runs(request), pk=pk)
    try:
        rerun = deployment_rerun_failed(actor=request.user, run=run)
    except (ValidationError, PermissionDenied) as exc:
        messages.error(request, " ".join(getattr(exc, "messages", [str(exc)])))
        return redirect("frontend:deployment-run", pk=run.pk)
    count = len(rerun.hosts)
    messages.success(request, f"Run #{rerun.pk} started on the {count} node"
                     f"{'s' if count != 1 else ''} that failed in run #{run.pk}.")
    return redirect("frontend:deployment-run", pk=rerun.pk)


@login_required
@require_POST
def deployment_run_cancel_view(request, pk: int):
    require_platform_admin(request.user)
    run = get_object_or_404(_runs(request), pk=pk)
    try:
        deployment_cancel(actor=request.user, run=run)
    except (ValidationError, PermissionDenied) as exc:
        messages.error(request, " ".join(getattr(exc, "messages", [str(exc)])))
    else:
        messages.success(request, f"Run #{run.pk} cancelled: Ansible stops within a second or "
                         "two; what a task already changed on a node stays.")
    return redirect("frontend:deployment-run", pk=run.pk)
