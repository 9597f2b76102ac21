"""What a runner reports from inside its job (`ylink.runners.report`), applied to its run.

Reports may arrive late, in batches, and twice (a runner re-sends what it could not confirm):
every kind is applied so that a repeat changes nothing.
"""

from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from aistation.models import Job
from infra_os.services.audit import audit_record
from ylink import storage
from ylink.models import Checkpoint, PipelineRun, TrainingMetric, TrainingRun
from ylink.services.pipelines import pipeline_run_finish, pipeline_run_record_steps
from ylink.services.training import training_runs_after
from ylink.signals import training_run_succeeded


def _at(event: dict) -> datetime:
    at = parse_datetime(event.get("at") or "")
    if at is None:
        return timezone.now()
    return at if timezone.is_aware(at) else timezone.make_aware(at, UTC)


def _number(data: dict, key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and value == value else None


def _training_event(run: TrainingRun, kind: str, data: dict, at: datetime) -> set[str]:
    """Apply one event; the run's fields it changed."""
    if kind == "started":
        run.resumed_from_step = data.get("resumed_from_step")
        return {"resumed_from_step"}
    if kind in ("progress", "metric"):
        changed = set()
        step = int(data.get("step") or 0)
        loss = _number(data, "loss")
        if kind == "metric" and loss is not None:
            TrainingMetric.objects.update_or_create(
                run=run, step=step,
                defaults={"loss": loss, "lr": _number(data, "lr"),
                          "tokens": int(data.get("tokens") or 0),
                          "tokens_per_s": _number(data, "tokens_per_s"),
                          "grad_norm": _number(data, "grad_norm"), "reported_at": at},
            )
            run.loss, run.lr = loss, _number(data, "lr")
            changed |= {"loss", "lr"}
        # Late reports of earlier steps do not move the progress back.
        if run.progress_at is None or at >= run.progress_at:
            run.step = step
            run.tokens = int(data.get("tokens") or run.tokens)
            run.tokens_per_s = _number(data, "tokens_per_s")
            run.eta_s = _number(data, "eta_s") if kind == "progress" else run.eta_s
            run.total_steps = int(data.get("total_steps") or run.total_steps)
            run.progress_at = at
            changed |= {"step", "tokens", "tokens_per_s", "eta_s", "total_steps", "progress_at"}
        return changed
    if kind == "checkpoint":
        Checkpoint.objects.update_or_create(
            run=run, step=int(data.get("step") or 0),
            defaults={"path": str(data.get("path", ""))[:500],
                      "bytes": int(data.get("bytes") or 0), "created_at": at},
        )
        return set()
    if kind == "done":
        output = data.get("output") or {}
        run.succeeded = True
        run.finished_at = at
        run.artifact = str(output.get("artifact", ""))[:16]
        # Where the platform told the runner to write, whatever the report says.
        run.output_path = str(storage.absolute(run.folder) / "output")
        run.parameters = output.get("parameters")
        if output.get("steps") is not None:
            run.step = int(output["steps"])
        if output.get("final_loss") is not None:
            run.loss = _number(output, "final_loss")
        audit_record(actor=None, action="training_run.finish", obj=run, tenant=run.tenant,
                     changes={"artifact": run.artifact, "steps": run.step})
        return {"succeeded", "finished_at", "artifact", "output_path", "parameters", "step",
                "loss"}
    if kind == "failed":
        run.message = str(data.get("message", ""))[:2000]
        return {"message"}
    return set()


def _pipeline_event(run: PipelineRun, kind: str, data: dict) -> None:
    if kind == "data_step":
        pipeline_run_record_steps(run=run, step=data)
    elif kind == "done":
        try:
            with transaction.atomic():
                pipeline_run_finish(run=run, output=data.get("output") or {})
        except ValidationError as refused:
            # The output is not recorded; the run says why (and fails once its job ends).
            run.message = "; ".join(refused.messages)[:2000]
            run.save(update_fields=["message", "updated_at"])
    elif kind == "failed":
        run.message = str(data.get("message", ""))[:2000]
        run.save(update_fields=["message", "updated_at"])


@transaction.atomic
def runner_events_apply(*, job: Job, events: list[dict]) -> int:
    """Apply a batch from the job's runner, in order; how many were applied."""
    training = TrainingRun.objects.select_for_update().filter(job=job).first()
    pipeline = None if training else \
        PipelineRun.objects.select_for_update().filter(job=job).first()
    if training is None and pipeline is None:
        return 0
    changed: set[str] = set()
    for event in events:
        kind, data = event["kind"], event.get("data") or {}
        if training is not None:
            if training.succeeded and kind != "checkpoint":
                continue
            changed |= _training_event(training, kind, data, _at(event))
        elif pipeline is not None:
            _pipeline_event(pipeline, kind, data)
    if training is not None and changed:
        training.save(update_fields=[*sorted(changed), "updated_at"])
        if "succeeded" in changed:
            # Runs that waited for this one (a recipe's next stage) start now.
            training_runs_after(run=training)
            run = training
            transaction.on_commit(lambda: training_run_succeeded.send(TrainingRun, run=run))
    return len(events)
