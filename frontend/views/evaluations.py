"""Evaluations of the current tenant's model versions (L4): the leaderboard with its chart and
the arena's ratings, starting an evaluation, a run's page, the sample viewer (one run, or two
runs side by side), and the benchmarks with their upload form. Writes go through mmodel's
evaluation services, reads through its selectors."""

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from aistation.selectors import queue_list
from frontend.access import console_access, current_tenant
from frontend.charts_mmodel import BenchmarkAxis, grouped_bars_svg
from frontend.forms import add_service_errors
from frontend.forms_mmodel import (
    BENCHMARK_FIELD_MAP,
    EVALUATION_FIELD_MAP,
    BenchmarkCreateForm,
    EvaluationStartForm,
)
from frontend.lists import list_response
from frontend.tables_mmodel import BenchmarkTable, EvaluationRunTable
from frontend.tables_ylink import run_state_badge
from frontend.views.models import current_versions, require_writer
from mmodel.choices import BenchmarkKind, VersionStatus
from mmodel.models import Benchmark, EvaluationRun
from mmodel.selectors.arena import arena_ratings
from mmodel.selectors.evaluation import (
    benchmarks_for,
    evaluation_runs_for,
    evaluation_samples,
    leaderboard,
    paired_samples,
)
from mmodel.services.evaluation import benchmark_create, evaluation_cancel, evaluation_start
from ylink.choices import FINAL_RUN_STATES

# The metric a leaderboard shows for each kind of benchmark, and whether lower is better.
MAIN_METRICS = {
    BenchmarkKind.MULTIPLE_CHOICE: ("acc", False),
    BenchmarkKind.GENERATION: ("exact_match", False),
    BenchmarkKind.PERPLEXITY: ("word_perplexity", True),
    BenchmarkKind.RETRIEVAL: ("recall@1", False),
}
# Versions the chart compares when the reader chose none.
CHART_DEFAULT_VERSIONS = 6
SAMPLES_PER_PAGE = 10


def main_metric(kind: str) -> tuple[str, bool]:
    return MAIN_METRICS.get(kind, ("acc", False))


def metric_value(metrics: dict, metric: str) -> float | None:
    """`metric` from a benchmark's scores: lm-eval names filtered metrics
    "exact_match,remove_whitespace"; the plain name wins when both are there."""
    if metric in metrics:
        return metrics[metric]
    for key, value in sorted(metrics.items()):
        if key.split(",", 1)[0] == metric:
            return value
    return None


def current_runs(request):
    tenant = current_tenant(request)
    if not tenant:
        return EvaluationRun.objects.none()
    return evaluation_runs_for(request.user, tenant).select_related(
        "version", "version__model", "job", "created_by").prefetch_related("benchmarks")


def current_benchmarks(request):
    tenant = current_tenant(request)
    return benchmarks_for(request.user, tenant) if tenant else Benchmark.objects.none()


@dataclass
class Cell:
    value: float | None
    best: bool = False
    # How many documents the score is over, and whether a limit left some of the benchmark out.
    documents: int = 0
    limited: bool = False
    # Scores compare only within a group: the same benchmark data, the same number of documents.
    group: tuple = ()
    # The column mixes runs on different documents: each cell says on how many.
    mixed: bool = False


@dataclass
class Column:
    benchmark: str
    metric: str
    lower_is_better: bool


def _board(request, tenant) -> tuple[list[Column], list[tuple], list]:
    """The leaderboard's columns, its rows (version, cells) and the versions' rows as the
    selector gave them."""
    rows = leaderboard(user=request.user, tenant=tenant)
    kinds = dict(current_benchmarks(request).values_list("name", "kind"))
    names = sorted({name for row in rows for name in row["scores"]})
    columns = [Column(name, *main_metric(kinds.get(name, ""))) for name in names]
    table = []
    for row in rows:
        cells = []
        for column in columns:
            run = row.get("runs", {}).get(column.benchmark) or {}
            documents = int(run.get("documents") or 0)
            cells.append(Cell(
                metric_value(row["scores"].get(column.benchmark, {}), column.metric),
                documents=documents,
                limited=bool(run.get("limit")) and documents < run.get("benchmark_documents", 0),
                group=(run.get("benchmark_version"), documents)))
        table.append((row["version"], cells))
    for index, column in enumerate(columns):
        scored = [cells[index] for _, cells in table if cells[index].value is not None]
        groups: dict[tuple, list[Cell]] = {}
        for cell in scored:
            groups.setdefault(cell.group, []).append(cell)
        for group in groups.values():
            # A run alone on its documents is best of nothing, once the column mixes counts.
            if len(groups) > 1 and len(group) < 2:
                continue
            values = [cell.value for cell in group]
            best = min(values) if column.lower_is_better else max(values)
            for cell in group:
                cell.best = cell.value == best
        for cell in scored:
            cell.mixed = len(groups) > 1
    return columns, table, rows


@login_required
def leaderboard_view(request):
    tenant = current_tenant(request)
    context: dict = {}
    if tenant:
        columns, table, _ = _board(request, tenant)
        asked = {int(pk) for pk in request.GET.getlist("compare") if pk.isdecimal()}
        chosen = [(version, cells) for version, cells in table if version.pk in asked] \
            or table[:CHART_DEFAULT_VERSIONS]
        chart = grouped_bars_svg(
            benchmarks=[BenchmarkAxis(column.benchmark, column.metric, column.lower_is_better)
                        for column in columns],
            series=[(version.label, {column.benchmark: cell.value
                                     for column, cell in zip(columns, cells, strict=True)
                                     if cell.value is not None})
                    for version, cells in chosen],
            title="Model versions compared across benchmarks")
        runs = EvaluationRunTable(current_runs(request), prefix="runs-")
        RequestConfig(request, paginate={"per_page": 10}).configure(runs)
        context = {
            "columns": columns, "table_rows": table, "chart": chart,
            "chosen": {version.pk for version, _ in chosen},
            "runs": runs, "ratings": arena_ratings(tenant=tenant),
        }
    return render(request, "frontend/mmodel/evaluations/leaderboard.html", context)


@login_required
def evaluation_start_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:evaluations")
    require_writer(request, "start evaluations")
    versions = current_versions(request).filter(status=VersionStatus.READY) \
        .order_by("model__name", "-number")
    benchmarks = current_benchmarks(request).order_by("name")
    queues = queue_list(user=request.user).filter(tenant_id=tenant.pk, is_active=True) \
        .select_related("cluster")
    initial = {}
    if request.GET.get("version", "").isdecimal():
        initial["version"] = int(request.GET["version"])
    form = EvaluationStartForm(request.POST or None, initial=initial, versions=versions,
                               benchmarks=benchmarks, queues=queues)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                run = evaluation_start(
                    actor=request.user, tenant=tenant, version=data["version"],
                    benchmarks=list(data["benchmarks"]), queue=data["queue"],
                    limit=data["limit"], gpus=data["gpus"])
            except ValidationError as exc:
                add_service_errors(form, exc, field_map=EVALUATION_FIELD_MAP)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
                status = 403
            else:
                messages.success(request, f"Evaluation {run.pk} of {data['version'].label} "
                                 f"started: it waits in queue {data['queue'].name}.")
                return redirect("frontend:evaluation-run", pk=run.pk)
    return render(request, "frontend/mmodel/evaluations/start.html", {
        "form": form, "has_versions": versions.exists(), "has_benchmarks": benchmarks.exists(),
        "has_queues": queues.exists(),
    }, status=status)


def _results(run: EvaluationRun) -> list[dict]:
    """Per benchmark: its metrics, the main one first."""
    by_benchmark: dict[int, dict] = {}
    for result in run.results.select_related("benchmark"):
        entry = by_benchmark.setdefault(result.benchmark_id, {
            "benchmark": result.benchmark, "metrics": [], "samples": result.samples,
            "main": main_metric(result.benchmark.kind)})
        entry["metrics"].append(result)
    for entry in by_benchmark.values():
        main = entry["main"][0]
        entry["metrics"].sort(key=lambda result: (result.metric.split(",")[0] != main,
                                                  result.metric))
    return sorted(by_benchmark.values(), key=lambda entry: entry["benchmark"].name)


@login_required
def evaluation_run_view(request, pk: int):
    """The run's page; `?part=status` is what changes while it runs, polled every 2 s."""
    run = get_object_or_404(current_runs(request), pk=pk)
    state = run.state
    context = {
        "run": run,
        "state_badge": run_state_badge(state),
        "live": state not in FINAL_RUN_STATES,
        "reason": run.job.reason if run.job else "",
        "results": _results(run),
        "benchmarks": list(run.benchmarks.order_by("name")),
    }
    template = "frontend/mmodel/evaluations/run_status.html" \
        if request.GET.get("part") == "status" else "frontend/mmodel/evaluations/run.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def evaluation_cancel_view(request, pk: int):
    run = get_object_or_404(current_runs(request), pk=pk)
    try:
        evaluation_cancel(actor=request.user, run=run)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Evaluation {run.pk} cancelled; its job is being stopped.")
    return redirect("frontend:evaluation-run", pk=run.pk)


def _offset(raw: str | None) -> int:
    return int(raw) if raw and raw.isdecimal() else 0


def _pair_sides(pair: dict) -> tuple[dict, dict]:
    """A pair from `paired_samples` as the two samples the template shows side by side."""
    shared = {"index": pair["index"], "prompt": pair["prompt"], "target": pair["target"]}
    return shared | pair["a"], shared | pair["b"]


@login_required
def evaluation_samples_view(request, pk: int):
    """A run's samples of one benchmark, `?correct=yes|no` filtering, paged in place
    (`?part=samples`); `?compare=<run id>` puts another run of the same benchmark beside it,
    and `?correct=differ` keeps the documents the two scored differently."""
    runs = current_runs(request)
    run = get_object_or_404(runs, pk=pk)
    benchmarks = list(run.benchmarks.order_by("name"))
    asked = request.GET.get("benchmark", "")
    benchmark = next((item for item in benchmarks if str(item.pk) == asked),
                     benchmarks[0] if benchmarks else None)
    if benchmark is None:
        raise Http404("This run has no benchmark.")
    correct = request.GET.get("correct", "")
    others = runs.filter(benchmarks=benchmark).exclude(pk=run.pk).order_by("-created_at")
    compare = None
    if request.GET.get("compare", "").isdecimal():
        compare = get_object_or_404(others, pk=int(request.GET["compare"]))
    if compare is not None:
        pairs = [_pair_sides(pair) for pair in
                 paired_samples(run_a=run, run_b=compare, benchmark=benchmark)]
        if correct == "differ":
            pairs = [(left, right) for left, right in pairs
                     if left["correct"] != right["correct"]]
        elif correct in ("yes", "no"):
            pairs = [(left, right) for left, right in pairs
                     if left["correct"] is (correct == "yes")]
        items, total = pairs, len(pairs)
    else:
        queryset = evaluation_samples(run=run, benchmark=benchmark)
        if correct in ("yes", "no"):
            queryset = queryset.filter(correct=(correct == "yes"))
        items, total = queryset, queryset.count()
    offset = min(_offset(request.GET.get("offset")), max(total - 1, 0))
    page = [item if compare is not None else (item, None)
            for item in items[offset:offset + SAMPLES_PER_PAGE]]
    query = {"benchmark": benchmark.pk, "correct": correct,
             "compare": compare.pk if compare else ""}
    end = offset + len(page)
    context = {
        "run": run, "benchmarks": benchmarks, "benchmark": benchmark, "compare": compare,
        "others": others.select_related("version__model")[:20], "correct": correct,
        "pairs": page, "total": total, "offset": offset, "end": end,
        "previous": max(offset - SAMPLES_PER_PAGE, 0) if offset > 0 else None,
        "next": end if end < total else None,
        "query": "&".join(f"{key}={value}" for key, value in query.items() if value != ""),
    }
    template = "frontend/mmodel/evaluations/samples_page.html" \
        if request.GET.get("part") == "samples" else "frontend/mmodel/evaluations/samples.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
def benchmarks_view(request):
    """The benchmarks the tenant can use (its own and the shared ones) and, for members, the
    form that uploads a new one (POST here)."""
    tenant = current_tenant(request)
    access = console_access(request)
    form = None
    status = 200
    if tenant and request.method == "POST":
        if not access.can_write:
            raise PermissionDenied("Viewers cannot add benchmarks.")
        form = BenchmarkCreateForm(request.POST, request.FILES)
        status = 400
        if form.is_valid():
            data = dict(form.cleaned_data)
            upload = data.pop("file")
            try:
                benchmark = benchmark_create(actor=request.user, tenant=tenant, data=upload,
                                             **data)
            except ValidationError as exc:
                add_service_errors(form, exc, field_map=BENCHMARK_FIELD_MAP)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
                status = 403
            else:
                messages.success(request, f"Benchmark {benchmark.name} added: "
                                 f"{benchmark.documents:,} documents.")
                return redirect("frontend:benchmarks")
    if form is None and tenant and access.can_write:
        form = BenchmarkCreateForm()
    return list_response(request, template="frontend/mmodel/evaluations/benchmarks.html",
                         table_class=BenchmarkTable,
                         queryset=current_benchmarks(request).select_related("tenant"),
                         context={"form": form}, status=status)
