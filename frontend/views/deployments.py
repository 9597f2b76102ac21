"""Deployments of the current tenant (L4): the list, deploying a version, and a deployment's
page with its replicas and their jobs, scale/stop/start/delete, how to call it through the
gateway, and its traffic by minute. Writes go through mmodel's deployment services, reads
through its selectors."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from aistation.selectors import queue_list
from frontend.access import current_tenant
from frontend.charts_mmodel import minutes_svg
from frontend.forms import add_service_errors
from frontend.forms_mmodel import DEPLOYMENT_FIELD_MAP, DeploymentCreateForm, DeploymentScaleForm
from frontend.lists import list_response
from frontend.tables_mmodel import DeploymentTable, deployment_state_badge
from frontend.views.models import current_versions, require_writer
from mmodel.choices import DeploymentState, VersionStatus
from mmodel.models import Deployment
from mmodel.selectors.deployments import (
    deployment_embeds,
    deployment_last_cold_start,
    deployment_pool,
    deployment_state,
    deployment_stats,
    deployment_waiting_reason,
    deployments_for,
)
from mmodel.services.deployments import (
    deployment_create,
    deployment_delete,
    deployment_scale,
    deployment_start,
    deployment_stop,
)
from mmodel.services.pools import pool_budget_mib

# The window the charts show, a point a minute.
CHART_MINUTES = 60
SETTLED_STATES = {DeploymentState.READY, DeploymentState.STOPPED, DeploymentState.SCALED_TO_ZERO}


def current_deployments(request):
    tenant = current_tenant(request)
    if not tenant:
        return Deployment.objects.none()
    return deployments_for(request.user, tenant).select_related("queue__cluster")


@login_required
def deployments(request):
    return list_response(request, template="frontend/mmodel/deployments/list.html",
                         table_class=DeploymentTable, queryset=current_deployments(request))


@login_required
def deployment_create_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:deployments")
    require_writer(request, "deploy models")
    versions = current_versions(request).filter(status=VersionStatus.READY) \
        .order_by("model__name", "-number")
    queues = queue_list(user=request.user).filter(tenant_id=tenant.pk, is_active=True) \
        .select_related("cluster")
    initial = {}
    if request.GET.get("version", "").isdecimal():
        chosen = versions.filter(pk=int(request.GET["version"])).first()
        if chosen is not None:
            initial = {"version": chosen.pk, "name": chosen.model.name}
    form = DeploymentCreateForm(request.POST or None, initial=initial, versions=versions,
                                queues=queues)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                deployment = deployment_create(actor=request.user, tenant=tenant,
                                               **form.cleaned_data)
            except ValidationError as exc:
                add_service_errors(form, exc, field_map=DEPLOYMENT_FIELD_MAP)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
                status = 403
            else:
                plural = "s" if deployment.replicas > 1 else ""
                messages.success(request, f"Deployment {deployment.name} created: its "
                                 f"{deployment.replicas} replica{plural} start as service "
                                 "jobs and take requests once ready.")
                return redirect("frontend:deployment", pk=deployment.pk)
    return render(request, "frontend/mmodel/deployments/create.html", {
        "form": form, "has_versions": versions.exists(), "has_queues": queues.exists(),
    }, status=status)


def _charts(deployment: Deployment) -> dict:
    now = timezone.now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=CHART_MINUTES - 1)
    rows = {row["minute"].replace(second=0, microsecond=0): row
            for row in deployment_stats(deployment, since)}
    minutes = [since + timedelta(minutes=index) for index in range(CHART_MINUTES)]
    empty: dict = {}

    def series(key: str, missing=0) -> list:
        return [rows.get(minute, empty).get(key, missing) for minute in minutes]

    requests, prompt, completion = series("requests"), series("prompt_tokens"), \
        series("completion_tokens")
    name = deployment.name
    return {
        "requests_chart": minutes_svg(minutes=minutes, series=[("requests", requests),
                                                               ("errors", series("errors"))],
                                      unit="requests per minute",
                                      title=f"{name}: requests per minute"),
        "tokens_chart": minutes_svg(minutes=minutes, series=[("prompt", prompt),
                                                             ("completion", completion)],
                                    unit="tokens per minute", title=f"{name}: tokens per minute"),
        # Percentiles from the gateway's latency histogram; a minute without requests has none.
        "latency_chart": minutes_svg(
            minutes=minutes, series=[("p50", series("latency_ms_p50", None)),
                                     ("p99", series("latency_ms_p99", None)),
                                     ("mean", series("latency_ms_mean", None))],
            unit="latency (ms)", title=f"{name}: latency by minute"),
        # A request that waited for a replica to start: how long, the longest of its minute.
        "cold_start_chart": minutes_svg(
            minutes=minutes, series=[("longest wait", series("cold_start_ms_max", None))],
            unit="wait (ms)", title=f"{name}: waits for a replica to start"),
        "cold_starts_total": sum(series("cold_starts")),
        "last_cold_start": deployment_last_cold_start(deployment),
        "requests_total": sum(requests),
        "tokens_total": sum(prompt) + sum(completion),
    }


def _snippets(request, deployment: Deployment) -> dict:
    gateway = request.build_absolute_uri("/v1")
    if deployment_embeds(deployment):
        return {"gateway_url": gateway, "curl_snippet": (
            f"curl {gateway}/embeddings \\\n"
            '  -H "Authorization: Bearer $OGAI_TOKEN" \\\n'
            '  -H "Content-Type: application/json" \\\n'
            f'  -d \'{{"model": "{deployment.name}", "input": ["Hello!", "Bonjour!"]}}\''),
            "python_snippet": (
            "import os\n\n"
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url="{gateway}", api_key=os.environ["OGAI_TOKEN"])\n'
            f'vectors = client.embeddings.create(model="{deployment.name}", '
            'input=["Hello!", "Bonjour!"])\n'
            "print(len(vectors.data[0].embedding))"), "embeds": True}
    curl = (
        f"curl {gateway}/chat/completions \\\n"
        '  -H "Authorization: Bearer $OGAI_TOKEN" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{deployment.name}", "messages": '
        '[{"role": "user", "content": "Hello!"}]}\''
    )
    python = (
        "import os\n\n"
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{gateway}", api_key=os.environ["OGAI_TOKEN"])\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{deployment.name}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    return {"gateway_url": gateway, "curl_snippet": curl, "python_snippet": python,
            "embeds": False}


@login_required
def deployment_detail_view(request, pk: int):
    """The deployment's page; `?part=status` (state and replicas) polls itself every 3 s
    while the deployment is still settling."""
    deployment = get_object_or_404(current_deployments(request), pk=pk)
    state = deployment_state(deployment)
    replicas = list(deployment.replica_set.all())
    context = {
        "deployment": deployment,
        "state": state,
        "state_badge": deployment_state_badge(state),
        "live": state not in SETTLED_STATES,
        "replicas": replicas,
        "ready_count": sum(1 for replica in replicas if replica.ready),
        "waiting_reason": deployment_waiting_reason(deployment),
        "scale_form": DeploymentScaleForm(initial={"replicas": deployment.replicas}),
        "pool": deployment_pool(deployment),
        "pool_budget_mib": pool_budget_mib(
            pool_memory_mib=deployment.pool_memory_mib,
            memory_mib_per_replica=deployment.memory_mib_per_replica),
    }
    if request.GET.get("part") == "status":
        template = "frontend/mmodel/deployments/status.html"
    else:
        template = "frontend/mmodel/deployments/detail.html"
        context |= _snippets(request, deployment) | _charts(deployment)
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _act(request, pk: int, action, done: str):
    deployment = get_object_or_404(current_deployments(request), pk=pk)
    try:
        action(deployment)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done.format(name=deployment.name))
        return deployment
    return None


@login_required
@require_POST
def deployment_scale_view(request, pk: int):
    form = DeploymentScaleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Replicas: " + " ".join(form.errors["replicas"]))
        return redirect("frontend:deployment", pk=pk)
    replicas = form.cleaned_data["replicas"]
    _act(request, pk, lambda deployment: deployment_scale(
        actor=request.user, deployment=deployment, replicas=replicas),
        f"{{name}} scaled to {replicas} replica{'s' if replicas > 1 else ''}.")
    return redirect("frontend:deployment", pk=pk)


@login_required
@require_POST
def deployment_stop_view(request, pk: int):
    _act(request, pk, lambda deployment: deployment_stop(actor=request.user,
                                                         deployment=deployment),
         "{name} stopped: its replicas' jobs are being stopped.")
    return redirect("frontend:deployment", pk=pk)


@login_required
@require_POST
def deployment_start_view(request, pk: int):
    _act(request, pk, lambda deployment: deployment_start(actor=request.user,
                                                          deployment=deployment),
         "{name} starting: its replicas take requests once ready.")
    return redirect("frontend:deployment", pk=pk)


@login_required
@require_POST
def deployment_delete_view(request, pk: int):
    deleted = _act(request, pk, lambda deployment: deployment_delete(actor=request.user,
                                                                     deployment=deployment),
                   "{name} deleted.")
    if deleted is None:
        return redirect("frontend:deployment", pk=pk)
    return redirect("frontend:deployments")

