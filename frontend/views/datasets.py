"""Datasets of the current tenant (L3): the list, creating one, the one-click demo, and a
dataset's page with its versions, uploads, statistics and a sample browser. Writes go through
ylink's services, reads through its selectors."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.charts_training import bars_svg, short_number
from frontend.forms import add_service_errors
from frontend.forms_ylink import DatasetCreateForm, DatasetUploadForm
from frontend.lists import list_response
from frontend.tables_ylink import DatasetTable
from ylink import storage
from ylink.choices import VersionFormat
from ylink.filtersets import DatasetFilterSet
from ylink.models import Dataset, DatasetVersion
from ylink.selectors import dataset_list, dataset_version_list
from ylink.services.datasets import (
    check_upload_size,
    dataset_create,
    dataset_upload,
    max_upload_bytes,
)
from ylink.services.demo import DEMO_DATASET, demo_run

SAMPLES_PER_PAGE = 5
MAX_SAMPLES_PER_PAGE = 50


def _current_datasets(request):
    tenant = current_tenant(request)
    queryset = dataset_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _current_versions(request):
    tenant = current_tenant(request)
    queryset = dataset_version_list(user=request.user)
    return queryset.filter(dataset__tenant_id=tenant.pk) if tenant else queryset.none()


def _require_writer(request, what: str) -> None:
    if not console_access(request).can_write:
        raise PermissionDenied(f"Viewers cannot {what}.")


@login_required
def datasets(request):
    tenant = current_tenant(request)
    has_demo = tenant is not None and Dataset.objects.filter(
        tenant=tenant, name=DEMO_DATASET).exists()
    return list_response(
        request,
        template="frontend/ylink/datasets/list.html",
        table_class=DatasetTable,
        queryset=_current_datasets(request),
        filterset_class=DatasetFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"q": "Search", "kind": "Kind"},
        context={"has_demo": has_demo, "demo_dataset": DEMO_DATASET},
    )


@login_required
def dataset_create_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:datasets")
    _require_writer(request, "create datasets")
    form = DatasetCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            dataset = dataset_create(actor=request.user, tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Dataset {dataset.name} created. Upload a corpus to "
                             "make its first version.")
            return redirect("frontend:dataset", pk=dataset.pk)
    return render(request, "frontend/ylink/datasets/create.html", {"form": form})


@login_required
@require_POST
def demo_run_view(request):
    """The one-click demo: the demo pipeline on the demo corpus, then a tiny pretraining."""
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:datasets")
    _require_writer(request, "run the demo")
    try:
        run = demo_run(actor=request.user, tenant=tenant)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:datasets")
    messages.success(request, f"Demo started: pipeline run {run.pk} cleans {DEMO_DATASET}; "
                     "a tiny pretraining starts on its output when it finishes.")
    return redirect("frontend:pipeline-run", pk=run.pk)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    if raw is None or not raw.isdigit():
        return default
    return max(low, min(high, int(raw)))


def _samples_context(request, version: DatasetVersion | None) -> dict:
    """A page of the version's documents (`?offset=&limit=`), read from its files."""
    if version is None:
        return {"samples": [], "samples_note": ""}
    offset = _int(request.GET.get("offset"), 0, 0, max(version.documents - 1, 0))
    limit = _int(request.GET.get("limit"), SAMPLES_PER_PAGE, 1, MAX_SAMPLES_PER_PAGE)
    note = ""
    try:
        samples = storage.read_samples(storage.absolute(version.path), version.format,
                                       offset=offset, limit=limit)
    except Exception as exc:  # the tokenizers library raises bare Exception
        samples, note = [], f"The documents cannot be read: {exc}"
    end = offset + len(samples)
    return {
        "samples": samples,
        "samples_note": note,
        "samples_offset": offset,
        "samples_limit": limit,
        "samples_end": end,
        "samples_previous": max(offset - limit, 0) if offset > 0 else None,
        "samples_next": end if end < version.documents else None,
    }


def _histogram_svg(version: DatasetVersion):
    bins = (version.stats or {}).get("length_histogram") or []
    # From the first length that occurs: a corpus of long documents has no use for the bins
    # of 1, 2-3, 4-7… characters.
    first = next((index for index, item in enumerate(bins) if item["documents"]), None)
    if first is None:
        return None
    bins = bins[first:]
    labels = [short_number(item["from"]) if item["from"] == item["to"] else
              f"{short_number(item['from'])}\N{EN DASH}{short_number(item['to'])}"
              for item in bins]
    return bars_svg(labels=labels, values=[item["documents"] for item in bins],
                    unit="documents", x_title="length in characters",
                    title=f"{version}: documents by length in characters")


def _dataset_page(request, dataset: Dataset, *, upload_form=None, status: int = 200):
    versions = list(_current_versions(request).filter(dataset=dataset).order_by("-number"))
    asked = request.GET.get("version", "")
    by_number = {version.number: version for version in versions}
    version = by_number.get(int(asked)) if asked.isdigit() else None
    if version is None and versions:
        version = versions[0]
    access = console_access(request)
    context = {
        "dataset": dataset,
        "versions": versions,
        "version": version,
        "histogram": _histogram_svg(version) if version else None,
        "upload_form": upload_form or (DatasetUploadForm() if access.can_write else None),
        "max_upload_mib": max_upload_bytes() // 2**20,
        "can_run_pipeline": bool(version and version.format == VersionFormat.JSONL),
        **_samples_context(request, version),
    }
    template = "frontend/ylink/datasets/detail.html"
    if request.GET.get("part") == "samples":
        template = "frontend/ylink/datasets/samples.html"
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
def dataset_detail_view(request, pk: int):
    """The dataset's page; `?version=N` picks a version and `?part=samples&offset=&limit=` is
    its sample browser, which pages in place."""
    dataset = get_object_or_404(_current_datasets(request), pk=pk)
    return _dataset_page(request, dataset)


@login_required
@require_POST
def dataset_upload_view(request, pk: int):
    """A new version from an uploaded file; what is wrong with the file shows on the form."""
    # Refused by the size the browser declared, with the same words as the API.
    length = request.META.get("CONTENT_LENGTH", "")
    dataset = get_object_or_404(_current_datasets(request), pk=pk)
    _require_writer(request, "upload datasets")
    form = DatasetUploadForm()
    try:
        check_upload_size(int(length) if length.isdigit() else None)
    except ValidationError as exc:
        add_service_errors(form, exc)
        return _dataset_page(request, dataset, upload_form=form, status=400)
    form = DatasetUploadForm(request.POST, request.FILES)
    if form.is_valid():
        try:
            version = dataset_upload(actor=request.user, dataset=dataset,
                                     upload=form.cleaned_data["file"])
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"{dataset.name} v{version.number}: {version.documents:,} "
                             f"documents from {version.source}.")
            response = redirect("frontend:dataset", pk=dataset.pk)
            response["Location"] += f"?version={version.number}"
            return response
    return _dataset_page(request, dataset, upload_form=form, status=400)
