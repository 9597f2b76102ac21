"""Data pipeline runs: validated, launched as one job of N replicas, finished by the runner's
report (a new dataset version with lineage to its input)."""

from pathlib import Path
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from aistation.models import Queue
from aistation.services.jobs import job_cancel
from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.services.audit import audit_record
from ylink import callbacks, storage
from ylink.choices import FINAL_RUN_STATES, TrainingKind, VersionFormat
from ylink.models import DatasetVersion, PipelineRun, TrainingRun
from ylink.services.datasets import dataset_version_from_run
from ylink.services.launch import run_launch
from ylink.steps import EXECUTORS, StepError, validate_steps

MAX_REPLICAS = 64


def _tokenizer_path(run: TrainingRun | None, tenant_id: int) -> str | None:
    if run is None:
        return None
    if (run.tenant_id != tenant_id or run.kind != TrainingKind.TOKENIZER
            or not run.succeeded):
        raise ValidationError({"tokenizer_run": f"Training run {run.pk} is not a finished "
                               "tokenizer run of this tenant."})
    return str(Path(run.output_path) / "tokenizer.json")


def _model_paths(*, actor, tenant, steps: list[dict]) -> dict[str, str]:
    """The local folders of the registry models the steps name (the hap step's model scorer),
    found through the registry's callback: the runner gets plain paths."""
    from ylink.runners.hap import model_references

    paths: dict[str, str] = {}
    errors: dict[str, str] = {}
    for index, reference in model_references(steps):
        try:
            paths[reference] = callbacks.model_path(actor=actor, tenant=tenant,
                                                    reference=reference)
        except callbacks.ModelNotFound as error:
            errors[f"steps[{index}].params.model"] = str(error)
    if errors:
        raise ValidationError(errors)
    return paths


def check_steps(steps) -> list[dict]:
    try:
        return validate_steps(steps)
    except StepError as error:
        raise ValidationError(error.errors) from None


@transaction.atomic
def pipeline_run_start(*, actor, version: DatasetVersion, steps: list, queue: Queue,
                       name: str = "", replicas: int = 1, tokenizer_run: TrainingRun | None = None,
                       cpu: float = 1.0, memory_mib: int = 2048,
                       then_train: dict | None = None, executor: str = "local") -> PipelineRun:
    """`executor` "ray": the steps run through datatrove's RayPipelineExecutor on a Ray cluster
    job of `replicas` workers (and a head that runs the runner), with the same output as
    `replicas` plain replicas."""
    tenant = version.dataset.tenant
    require_role(actor, tenant, WRITE_ROLES)
    if queue.tenant_id != tenant.pk:
        raise ValidationError({"queue": f"Queue {queue.name} is not a queue of {tenant.name}."})
    if version.format != VersionFormat.JSONL:
        raise ValidationError({"version": f"{version} holds token shards; a pipeline runs on "
                               "documents."})
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValidationError({"replicas": f"Use 1 to {MAX_REPLICAS} replicas."})
    if executor not in EXECUTORS:
        raise ValidationError({"executor": f"Use one of {', '.join(EXECUTORS)}, not "
                               f"{executor!r}."})
    steps = check_steps(steps)
    tokenizes = any(step["type"] == "tokenize" for step in steps)
    if tokenizer_run is not None and not tokenizes:
        raise ValidationError({"tokenizer_run": "Only a tokenize step uses a tokenizer; add "
                               "one as the last step."})
    tokenizer_path = _tokenizer_path(tokenizer_run, tenant.pk)
    models = _model_paths(actor=actor, tenant=tenant, steps=steps)
    run = PipelineRun.objects.create(
        tenant=tenant, created_by=actor, name=name or f"{version.dataset.name}-pipeline",
        input_version=version, steps=steps, replicas=replicas, tokenizer_run=tokenizer_run,
        then_train=then_train,
    )
    folder = storage.run_folder("pipeline-runs", run.pk, run.created_at)
    input_path = str(storage.absolute(version.path))
    spec: dict[str, Any] = {
        "input": {"path": input_path, "format": version.format},
        "output_dir": str(folder / "output"),
        "work_dir": str(folder / "work"),
        "steps": steps,
        "tokenizer_path": tokenizer_path,
        "models": models,
    }
    ray = None
    if executor == "ray":
        # one Ray task per worker, each a replica's share; the head runs the runner
        spec.update(executor="ray", tasks=replicas)
        node = {"gpus": 0, "gpu_model": "", "cpu": cpu, "memory_mib": memory_mib}
        ray = {"workers": replicas, "head": dict(node), "worker": node, "dashboard": False}
    run_launch(actor=actor, run=run, kind="pipeline-runs", module="ylink.runners.data",
               spec=spec, queue=queue, replicas=replicas + (1 if ray else 0), cpu=cpu,
               memory_mib=memory_mib, ray=ray,
               reads=(input_path,
                      str(Path(tokenizer_path).parent) if tokenizer_path else None,
                      *models.values()))
    audit_record(actor=actor, action="pipeline_run.start", obj=run, tenant=tenant,
                 changes={"version": str(version), "steps": [s["type"] for s in steps],
                          "replicas": replicas,
                          **({"executor": executor} if executor != "local" else {})})
    return run


@transaction.atomic
def pipeline_run_cancel(*, actor, run: PipelineRun) -> PipelineRun:
    require_role(actor, run.tenant, WRITE_ROLES)
    if run.state in FINAL_RUN_STATES or run.job is None:
        raise ValidationError({"state": f"Pipeline run {run.pk} already {run.state}."})
    job_cancel(actor=actor, job=run.job)
    return run


def pipeline_run_record_steps(*, run: PipelineRun, step: dict) -> None:
    """One step's merged figures, as the runner reported them; a repeat replaces it."""
    results = [r for r in run.step_results if r.get("index") != step.get("index")]
    results.append(step)
    run.step_results = sorted(results, key=lambda r: r.get("index", 0))
    run.save(update_fields=["step_results", "updated_at"])


def pipeline_run_finish(*, run: PipelineRun, output: dict) -> None:
    """The runner's `done`: record the output version, then start the chained training."""
    if run.succeeded:
        return  # a repeated report
    version = dataset_version_from_run(run=run, output=output)
    run.output_version = version
    run.succeeded = True
    run.finished_at = timezone.now()
    run.save(update_fields=["output_version", "succeeded", "finished_at", "updated_at"])
    audit_record(actor=None, action="pipeline_run.finish", obj=run, tenant=run.tenant,
                 changes={"version": str(version), "documents": version.documents})
    if run.then_train and run.job is not None:
        _start_chained_training(run, version, run.job.queue, run.then_train)


def _start_chained_training(run: PipelineRun, version: DatasetVersion, queue: Queue,
                            then_train: dict) -> None:
    """Start the training chained to the run. Its refusal (the user's role changed, the queue
    closed) is told on the run and loses nothing of the pipeline's result."""
    from ylink.services.training import training_run_start

    try:
        with transaction.atomic():
            training_run_start(actor=run.created_by, dataset_version=version, queue=queue,
                               **then_train)
    except (ValidationError, PermissionDenied, Http404) as error:
        reason = "; ".join(getattr(error, "messages", None) or [str(error)])
        run.message = f"The chained training did not start: {reason}"
        run.save(update_fields=["message", "updated_at"])

