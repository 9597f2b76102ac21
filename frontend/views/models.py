"""Models of the current tenant (L4): the list, a model's versions, registering a version from
a training run, importing one from a directory (with its progress), and a version's page with
its files, evaluations, deployments and lineage graph. Writes go through mmodel's registry
services, reads through its selectors."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Sum
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from aistation.selectors import job_waiting_reason
from frontend.access import console_access, current_tenant
from frontend.charts_mmodel import lineage_svg
from frontend.forms import add_service_errors
from frontend.forms_mmodel import REGISTER_FIELD_MAP, ModelImportForm, RegisterFromRunForm
from frontend.lists import list_response
from frontend.tables_mmodel import (
    ModelTable,
    deployment_state_badge,
    version_status_badge,
)
from frontend.tables_ylink import run_state_badge, with_waiting_reason
from infra_os.access import is_platform_admin
from mmodel.choices import ImportState
from mmodel.models import Model, ModelImport, ModelVersion
from mmodel.selectors.deployments import (
    deployment_state,
    deployment_waiting_reason,
    deployments_for,
)
from mmodel.selectors.evaluation import evaluation_runs_for
from mmodel.selectors.registry import imports_for, models_for, version_lineage, versions_for
from mmodel.services.registry import model_import_start, version_register_from_run
from ylink.choices import TrainingKind
from ylink.selectors import dataset_version_list, training_run_list

LIVE_IMPORT_STATES = {ImportState.QUEUED, ImportState.RUNNING}


def current_models(request):
    tenant = current_tenant(request)
    return models_for(request.user, tenant) if tenant else Model.objects.none()


def current_versions(request):
    tenant = current_tenant(request)
    queryset = versions_for(request.user, tenant) if tenant else ModelVersion.objects.none()
    return queryset.select_related("model", "model__tenant")


def require_writer(request, what: str) -> None:
    if not console_access(request).can_write:
        raise PermissionDenied(f"Viewers cannot {what}.")


@login_required
def models(request):
    # models_for counts the versions; one join, so the sum of their sizes is exact.
    queryset = current_models(request).annotate(bytes_total=Sum("versions__bytes"))
    return list_response(request, template="frontend/mmodel/models/list.html",
                         table_class=ModelTable, queryset=queryset)


@login_required
def model_detail_view(request, pk: int):
    model = get_object_or_404(current_models(request), pk=pk)
    versions = list(current_versions(request).filter(model=model).order_by("-number"))
    for version in versions:
        version.status_badge = version_status_badge(version.status)
    imports = list(imports_for(request.user, model.tenant).filter(model=model)
                   .order_by("-created_at", "-id")[:10])
    return render(request, "frontend/mmodel/models/detail.html",
                  {"model": model, "versions": versions, "imports": imports})


def _succeeded_runs(request):
    tenant = current_tenant(request)
    return training_run_list(user=request.user).filter(tenant_id=tenant.pk, succeeded=True) \
        .exclude(kind=TrainingKind.TOKENIZER).order_by("-finished_at", "-id")


def _model_name_initial(request) -> dict:
    name = request.GET.get("model", "")
    return {"model_name": name} if name else {}


@login_required
def version_register_view(request):
    """A version from a finished training run: its weights, lineage and figures."""
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:models")
    require_writer(request, "register model versions")
    runs = _succeeded_runs(request)
    initial = _model_name_initial(request)
    if request.GET.get("run", "").isdecimal():
        initial["training_run"] = int(request.GET["run"])
    form = RegisterFromRunForm(request.POST or None, initial=initial, runs=runs)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                version = version_register_from_run(
                    actor=request.user, run=data["training_run"], model_name=data["model_name"],
                    description=data["description"])
            except ValidationError as exc:
                add_service_errors(form, exc, field_map=REGISTER_FIELD_MAP)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
                status = 403
            else:
                messages.success(request, f"{version.label} registered from training run "
                                 f"{data['training_run'].pk}.")
                return redirect("frontend:model-version", pk=version.pk)
    return render(request, "frontend/mmodel/models/register.html",
                  {"form": form, "has_runs": runs.exists()}, status=status)


@login_required
def model_import_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:models")
    require_writer(request, "import models")
    # Pickle runs code while it loads: only an operator may let it in, and the service still
    # asks the platform's setting.
    form = ModelImportForm(request.POST or None, initial=_model_name_initial(request),
                           may_allow_pickle=is_platform_admin(request.user))
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                started = model_import_start(
                    actor=request.user, tenant=tenant, model_name=data["model_name"],
                    source_path=data["source_path"], description=data["description"],
                    allow_pickle=data.get("allow_pickle", False))
            except ValidationError as exc:
                add_service_errors(form, exc)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
                status = 403
            else:
                messages.success(request, f"Importing {data['source_path']} as a new version "
                                 f"of {data['model_name']}: it is checked, then copied in.")
                return redirect("frontend:model-import-detail", pk=started.pk)
    return render(request, "frontend/mmodel/models/import.html", {"form": form},
                  status=status)


@login_required
def model_import_detail_view(request, pk: int):
    """An import's progress; `?part=status` is what the page polls until it ends."""
    tenant = current_tenant(request)
    imports = imports_for(request.user, tenant) if tenant else ModelImport.objects.none()
    started = get_object_or_404(imports, pk=pk)
    context = {"import": started, "live": started.state in LIVE_IMPORT_STATES}
    template = "frontend/mmodel/models/import_status.html" if request.GET.get("part") == \
        "status" else "frontend/mmodel/models/import_detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _lineage_urls(request, graph: dict) -> dict[str, str]:
    """Each node's page: a dataset version's is its dataset's page showing that version."""
    urls: dict[str, str] = {}
    dataset_pks = [node["pk"] for node in graph.get("nodes", [])
                   if node.get("kind") == "dataset_version"]
    datasets = {version.pk: version for version in
                dataset_version_list(user=request.user).filter(pk__in=dataset_pks)}
    for node in graph.get("nodes", []):
        kind, pk = node.get("kind"), node.get("pk")
        if kind == "dataset_version" and pk in datasets:
            version = datasets[pk]
            urls[node["id"]] = (f"{reverse('frontend:dataset', args=[version.dataset_id])}"
                                f"?version={version.number}")
        elif kind == "pipeline_run":
            urls[node["id"]] = reverse("frontend:pipeline-run", args=[pk])
        elif kind == "training_run":
            urls[node["id"]] = reverse("frontend:training-run", args=[pk])
        elif kind == "model_version":
            urls[node["id"]] = reverse("frontend:model-version", args=[pk])
    return urls


@login_required
def version_detail_view(request, pk: int):
    version = get_object_or_404(current_versions(request), pk=pk)
    graph = version_lineage(version)
    current = next((node["id"] for node in graph.get("nodes", [])
                    if node.get("kind") == "model_version" and node.get("pk") == version.pk), "")
    tenant = current_tenant(request)
    evaluations = list(
        evaluation_runs_for(request.user, tenant).filter(version=version)
        .select_related("job").prefetch_related("results__benchmark")
        .order_by("-created_at", "-id")[:20])
    deployments = list(deployments_for(request.user, tenant).filter(version=version)
                       .prefetch_related("replica_set"))
    return render(request, "frontend/mmodel/models/version.html", {
        "version": version,
        "status_badge": version_status_badge(version.status),
        "files": sorted(version.files or [], key=lambda item: item.get("path", "")),
        "lineage": lineage_svg(graph=graph, urls=_lineage_urls(request, graph), current=current,
                               title=f"Lineage of {version.label}"),
        "lineage_nodes": len(graph.get("nodes", [])),
        "evaluations": [(run, with_waiting_reason(run_state_badge(run.state),
                                                   job_waiting_reason(run.job)))
                        for run in evaluations],
        "deployments": [(deployment, with_waiting_reason(
            deployment_state_badge(deployment_state(deployment)),
            deployment_waiting_reason(deployment))) for deployment in deployments],
        "can_write": console_access(request).can_write,
    })
