"""Training runs of the current tenant (L3): the list, starting one (tokenizer, pretraining,
SFT, LoRA) and a run's page with its progress, live loss, throughput and learning-rate charts
and its checkpoints. Writes go through ylink's training services, reads through its
selectors."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from aistation.selectors import queue_list
from frontend.access import console_access, current_tenant
from frontend.charts import PALETTE
from frontend.charts_training import line_svg
from frontend.forms import add_service_errors
from frontend.forms_ylink import (
    TRAINING_FIELD_MAP,
    ConsoleTrainingRunFilterSet,
    TrainingRunForm,
)
from frontend.lists import list_response
from frontend.tables_ylink import TrainingRunTable, run_state_badge
from ylink.choices import FINAL_RUN_STATES, TrainingKind, VersionFormat
from ylink.models import TrainingRun
from ylink.selectors import (
    dataset_version_list,
    training_checkpoints,
    training_metrics,
    training_run_list,
)
from ylink.services.training import training_run_cancel, training_run_start


def _current_runs(request):
    tenant = current_tenant(request)
    queryset = training_run_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


@login_required
def training_runs(request):
    return list_response(
        request,
        template="frontend/ylink/training/list.html",
        table_class=TrainingRunTable,
        queryset=_current_runs(request),
        filterset_class=ConsoleTrainingRunFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"q": "Search", "kind": "Kind", "succeeded": "Has a result"},
    )


def _choices(request) -> dict:
    tenant = current_tenant(request)
    versions = dataset_version_list(user=request.user).filter(dataset__tenant_id=tenant.pk) \
        .order_by("dataset__name", "-number")
    base_runs = _current_runs(request).filter(succeeded=True, artifact="model")
    queues = queue_list(user=request.user).filter(tenant_id=tenant.pk, is_active=True) \
        .select_related("cluster")
    return {"versions": versions, "base_runs": base_runs, "queues": queues}


def _initial(request, choices) -> dict:
    """`?version=<id>` picks the data; `?base=<run id>` fine-tunes that run's model (LoRA
    unless `?kind=` says otherwise)."""
    initial: dict = {}
    version = request.GET.get("version", "")
    if version.isdigit():
        chosen = get_object_or_404(choices["versions"], pk=int(version))
        initial["dataset_version"] = chosen.pk
        if chosen.format == VersionFormat.TOKENS:
            initial["kind"] = TrainingKind.PRETRAIN
    base = request.GET.get("base", "")
    if base.isdigit():
        run = get_object_or_404(choices["base_runs"], pk=int(base))
        initial |= {"base_run": run.pk, "kind": TrainingKind.LORA,
                    "architecture": (run.spec.get("model") or {}).get("architecture", "gpt2")}
    if request.GET.get("kind") in TrainingKind.values:
        initial["kind"] = request.GET["kind"]
    return initial


@login_required
def training_run_start_view(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:training-runs")
    if not console_access(request).can_write:
        raise PermissionDenied("Viewers cannot start training runs.")
    choices = _choices(request)
    initial = _initial(request, choices) if request.method != "POST" else {}
    form = TrainingRunForm(request.POST or None, initial=initial, **choices)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                run = training_run_start(actor=request.user, **form.service_kwargs())
            except ValidationError as exc:
                add_service_errors(form, exc, field_map=TRAINING_FIELD_MAP)
            except PermissionDenied as exc:
                form.add_error(None, str(exc) or "You may not train in this tenant.")
                status = 403
            else:
                messages.success(request, f"Training run {run.pk} ({run.name}) started: it "
                                 f"waits in queue {form.cleaned_data['queue'].name} until it "
                                 "can run.")
                return redirect("frontend:training-run", pk=run.pk)
    return render(request, "frontend/ylink/training/start.html", {
        "form": form,
        "has_versions": choices["versions"].exists(),
        "has_queues": choices["queues"].exists(),
    }, status=status)


# Logged steps a run page reads for its charts (it draws at most ~600 of them).
CHART_METRICS = 20_000


def _charts(run: TrainingRun, metrics: list[tuple]) -> dict:
    losses = [(step, loss) for step, loss, _, _ in metrics]
    speeds = [(step, speed) for step, _, speed, _ in metrics if speed is not None]
    rates = [(step, lr) for step, _, _, lr in metrics if lr is not None]
    return {
        "loss_chart": line_svg(points=losses, unit="loss", title=f"{run.name}: training loss "
                               "by step", empty_text="The loss appears with the first logged "
                               "step."),
        "speed_chart": line_svg(points=speeds, unit="tokens/s", zero_based=True,
                                color=PALETTE[2], title=f"{run.name}: throughput by step",
                                empty_text="Throughput appears with the first logged step."),
        "lr_chart": line_svg(points=rates, unit="learning rate", zero_based=True,
                             color=PALETTE[1], title=f"{run.name}: learning rate by step",
                             empty_text="No learning rate logged yet."),
    }


def _run_context(run: TrainingRun) -> dict:
    state = run.state
    metrics = list(training_metrics(run=run, limit=CHART_METRICS)
                   .values_list("step", "loss", "tokens_per_s", "lr"))
    total = run.total_steps or 0
    context = {
        "run": run,
        "state": state,
        "state_badge": run_state_badge(state),
        "live": state not in FINAL_RUN_STATES,
        "reason": run.job.reason if run.job else "",
        "percent": min(100.0, 100.0 * run.step / total) if total else 0.0,
        "metrics_count": len(metrics),
        "checkpoints": list(training_checkpoints(run=run)),
        "can_fine_tune": (run.succeeded and run.artifact == "model"
                          and run.kind == TrainingKind.PRETRAIN),
        "model_spec": (run.spec or {}).get("model") or {},
        "training_spec": (run.spec or {}).get("training") or {},
    }
    if run.kind != TrainingKind.TOKENIZER:
        context |= _charts(run, metrics)
    return context


@login_required
def training_run_detail_view(request, pk: int):
    """The run's page; `?part=status` is what changes while it trains (progress, charts,
    checkpoints, result), which the page polls every 2 s until the run ends."""
    run = get_object_or_404(_current_runs(request), pk=pk)
    template = "frontend/ylink/training/status.html" if request.GET.get("part") == "status" \
        else "frontend/ylink/training/detail.html"
    response = render(request, template, _run_context(run))
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def training_run_cancel_view(request, pk: int):
    run = get_object_or_404(_current_runs(request), pk=pk)
    try:
        training_run_cancel(actor=request.user, run=run)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Training run {run.pk} cancelled; its job is being stopped. "
                         "Its checkpoints stay.")
    return redirect("frontend:training-run", pk=run.pk)
