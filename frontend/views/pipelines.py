"""Data pipelines of the current tenant (L3): the builder, the list of runs and a run's page
with its per-step funnel. The builder's steps come from the catalogue in `ylink.steps`; the
pipeline service validates them and its errors show beside the step fields they name."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from aistation.selectors import queue_list
from frontend.access import console_access, current_tenant
from frontend.charts_training import FunnelStep, funnel_svg
from frontend.forms_ylink import (
    PIPELINE_FIELD_MAP,
    PipelineRunForm,
    StepsEditor,
    split_service_errors,
)
from frontend.lists import list_response
from frontend.tables_ylink import PipelineRunTable, run_state_badge
from ylink.choices import FINAL_RUN_STATES, TrainingKind, VersionFormat
from ylink.filtersets import PipelineRunFilterSet
from ylink.models import PipelineRun
from ylink.selectors import dataset_list, dataset_version_list, pipeline_run_list, training_run_list
from ylink.services.pipelines import check_steps, pipeline_run_cancel, pipeline_run_start
from ylink.steps import STEP_TYPES, catalogue

# The builder's buttons that only change the steps: the page comes back with them changed.
STEP_ACTIONS = ("add", "defaults", "remove", "up", "down")


def _current_runs(request):
    tenant = current_tenant(request)
    queryset = pipeline_run_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _tenant_scoped(request, queryset, field: str = "tenant_id"):
    tenant = current_tenant(request)
    return queryset.filter(**{field: tenant.pk}) if tenant else queryset.none()


@login_required
def pipeline_runs(request):
    """The runs, newest first; `?dataset=<id>` keeps those that read that dataset."""
    queryset = _current_runs(request)
    dataset = None
    # The API's FilterSet reads the id, so one past what the database holds is no filter
    # rather than an overflow.
    runs = PipelineRunFilterSet({"dataset": request.GET.get("dataset", "")}, queryset=queryset)
    asked = runs.form.cleaned_data.get("dataset") if runs.is_valid() else None
    if asked is not None:
        queryset = runs.qs
        dataset = _tenant_scoped(request, dataset_list(user=request.user)).filter(
            pk=asked).first()
    return list_response(
        request,
        template="frontend/ylink/pipelines/list.html",
        table_class=PipelineRunTable,
        queryset=queryset,
        context={"filtered_dataset": dataset, "filtered": asked is not None},
    )


def _choices(request):
    versions = _tenant_scoped(request, dataset_version_list(user=request.user),
                              "dataset__tenant_id").filter(format=VersionFormat.JSONL) \
        .order_by("dataset__name", "-number")
    queues = _tenant_scoped(request, queue_list(user=request.user)).filter(is_active=True) \
        .select_related("cluster")
    tokenizers = _tenant_scoped(request, training_run_list(user=request.user)).filter(
        kind=TrainingKind.TOKENIZER, succeeded=True)
    return {"versions": versions, "queues": queues, "tokenizers": tokenizers}


def _initial_from_get(request, choices) -> tuple[dict, StepsEditor]:
    """The builder's first state: the defaults, on `?version=<id>`, or a copy of the run
    `?from=<id>`."""
    initial: dict = {}
    editor = StepsEditor.defaults()
    copy_of = request.GET.get("from", "")
    if copy_of.isdigit():
        source = get_object_or_404(_current_runs(request), pk=int(copy_of))
        editor = StepsEditor(source.steps)
        initial = {"version": source.input_version_id, "replicas": source.replicas,
                   "tokenizer_run": source.tokenizer_run_id, "name": source.name}
        if source.job is not None:
            initial |= {"queue": source.job.queue_id, "cpu": source.job.cpu_per_replica,
                        "memory_mib": source.job.memory_mib_per_replica}
    version = request.GET.get("version", "")
    if version.isdigit():
        get_object_or_404(choices["versions"], pk=int(version))
        initial["version"] = int(version)
    return initial, editor


@login_required
def pipeline_builder_view(request):
    """Compose a pipeline: a dataset version, steps with their parameters, resources. The step
    buttons post the whole form back and get it again with the steps changed; "Check" validates
    without starting; "Run" starts it."""
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:pipeline-runs")
    if not console_access(request).can_write:
        raise PermissionDenied("Viewers cannot run pipelines.")
    choices = _choices(request)
    status = 200
    checked = False
    if request.method != "POST":
        initial, editor = _initial_from_get(request, choices)
        form = PipelineRunForm(initial=initial, **choices)
    else:
        editor = StepsEditor.from_post(request.POST)
        action = request.POST.get("action", "check")
        if action.partition(":")[0] in STEP_ACTIONS:
            editor.apply(action, request.POST.get("add_type", ""))
            # The rest of the form as it was, unchecked: it is not being submitted yet.
            form = PipelineRunForm(initial={name: request.POST.get(name)
                                            for name in PipelineRunForm.base_fields}, **choices)
        else:
            form = PipelineRunForm(request.POST, **choices)
            valid = form.is_valid()
            try:
                check_steps(editor.steps)
            except ValidationError as exc:
                split_service_errors(form, editor, exc)
                valid = False
            if valid and action != "run":
                checked = True
            elif valid:
                try:
                    run = pipeline_run_start(
                        actor=request.user, version=form.cleaned_data["version"],
                        steps=editor.steps, queue=form.cleaned_data["queue"],
                        name=form.cleaned_data["name"], replicas=form.cleaned_data["replicas"],
                        tokenizer_run=form.cleaned_data["tokenizer_run"],
                        cpu=form.cleaned_data["cpu"], memory_mib=form.cleaned_data["memory_mib"],
                        executor=form.cleaned_data["executor"] or "local",
                    )
                except ValidationError as exc:
                    split_service_errors(form, editor, exc, field_map=PIPELINE_FIELD_MAP)
                except PermissionDenied as exc:
                    form.add_error(None, str(exc) or "You may not run pipelines here.")
                    status = 403
                else:
                    messages.success(request, f"Pipeline run {run.pk} ({run.name}) started: "
                                     f"{len(run.steps)} steps on {run.input_version}.")
                    return redirect("frontend:pipeline-run", pk=run.pk)
            if not checked and status == 200:
                status = 400
    return render(request, "frontend/ylink/pipelines/builder.html", {
        "form": form,
        "cards": editor.cards(),
        "steps_count": len(editor.steps),
        "general_errors": editor.general_errors,
        "step_errors": bool(editor.errors or editor.general_errors),
        "step_types": catalogue(),
        "checked": checked,
        "has_versions": choices["versions"].exists(),
        "has_queues": choices["queues"].exists(),
    }, status=status)


def _step_rows(run: PipelineRun) -> list[dict]:
    """A row per step of the run: its parameters, and the figures it reported (if it has)."""
    reported = {result.get("index"): result for result in run.step_results or []}
    rows = []
    for index, step in enumerate(run.steps or []):
        spec = STEP_TYPES.get(step.get("type", ""))
        result = reported.get(index)
        changed = {name: value for name, value in (step.get("params") or {}).items()
                   if spec is None or name not in spec.params
                   or spec.params[name].default != value}
        row = {"index": index, "number": index + 1, "type": step.get("type", "?"),
               "title": spec.title if spec else step.get("type", "?"),
               "changed_params": changed, "result": result}
        if result is not None:
            docs_in, docs_out = int(result.get("docs_in") or 0), int(result.get("docs_out") or 0)
            row |= {
                "docs_in": docs_in, "docs_out": docs_out, "docs_dropped": docs_in - docs_out,
                "bytes_in": result.get("bytes_in"), "bytes_out": result.get("bytes_out"),
                "dropped": sorted((result.get("dropped") or {}).items(),
                                  key=lambda item: (-item[1], item[0])),
                "samples": result.get("samples") or [],
                "seconds": result.get("seconds"),
            }
        rows.append(row)
    return rows


def _run_context(run: PipelineRun) -> dict:
    rows = _step_rows(run)
    reported = [row for row in rows if row["result"] is not None]
    funnel = funnel_svg(
        steps=[FunnelStep(f"{row['number']}. {row['title']}", row["docs_in"], row["docs_out"])
               for row in reported],
        title=f"Documents through the steps of pipeline run {run.pk}",
        empty_text="The steps report their counts when the run finishes."
    ) if reported or run.state in FINAL_RUN_STATES else None
    # Kept of all only once every step has reported: before, the last report is not the end.
    complete = bool(rows) and len(reported) == len(rows)
    state = run.state
    return {
        "run": run,
        "state": state,
        "state_badge": run_state_badge(state),
        "live": state not in FINAL_RUN_STATES,
        "reason": run.job.reason if run.job else "",
        "rows": rows,
        "funnel": funnel,
        "kept_docs": (rows[-1]["docs_out"], rows[0]["docs_in"]) if complete else None,
    }


@login_required
def pipeline_run_detail_view(request, pk: int):
    """The run's page; `?part=status` is what changes while it runs (state, figures, output),
    which the page polls every 2 s until the run ends."""
    run = get_object_or_404(_current_runs(request), pk=pk)
    template = "frontend/ylink/pipelines/status.html" if request.GET.get("part") == "status" \
        else "frontend/ylink/pipelines/detail.html"
    response = render(request, template, _run_context(run))
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def pipeline_run_cancel_view(request, pk: int):
    run = get_object_or_404(_current_runs(request), pk=pk)
    try:
        pipeline_run_cancel(actor=request.user, run=run)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Pipeline run {run.pk} cancelled; its job is being stopped.")
    return redirect("frontend:pipeline-run", pk=run.pk)
