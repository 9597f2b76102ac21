"""What the evaluation runner reports from inside its job, applied to its run.

Reports may arrive late, in batches, and twice (a runner re-sends what it could not confirm,
and a restarted job runs again): every kind is applied so that a repeat changes nothing.
"""

import math
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from aistation.models import Job
from infra_os.services.audit import audit_record
from mmodel.models import EvaluationResult, EvaluationRun, EvaluationSample

EVENT_KINDS = ("started", "progress", "result", "samples", "finished", "failed")
MAX_TEXT = 10_000


def _at(event: dict) -> datetime:
    at = parse_datetime(event.get("at") or "")
    if at is None:
        return timezone.now()
    return at if timezone.is_aware(at) else timezone.make_aware(at, UTC)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text(value: Any) -> str:
    return "" if value is None else str(value)[:MAX_TEXT]


def _record_result(run: EvaluationRun, benchmark_id: int, data: dict) -> None:
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        return
    for metric, reported in metrics.items():
        value = _number(reported.get("value")) if isinstance(reported, dict) else None
        if value is None:
            continue
        EvaluationResult.objects.update_or_create(
            run=run, benchmark_id=benchmark_id, metric=str(metric)[:64],
            defaults={"value": value, "stderr": _number(reported.get("stderr")),
                      "samples": _count(data.get("samples"))})


def _record_samples(run: EvaluationRun, benchmark_id: int, samples: Any) -> None:
    if not isinstance(samples, list):
        return
    rows = {}
    for sample in samples:
        if not isinstance(sample, dict) or not isinstance(sample.get("index"), int) \
                or sample["index"] < 0:
            continue
        correct = sample.get("correct")
        scores = sample.get("scores")
        rows[sample["index"]] = EvaluationSample(
            run=run, benchmark_id=benchmark_id, index=sample["index"],
            prompt=_text(sample.get("prompt")), target=_text(sample.get("target")),
            output=_text(sample.get("output")),
            correct=correct if isinstance(correct, bool) else None,
            scores=scores if isinstance(scores, dict) else {})
    # A second delivery of the same documents overwrites the first.
    EvaluationSample.objects.bulk_create(
        rows.values(), update_conflicts=True, unique_fields=["run", "benchmark", "index"],
        update_fields=["prompt", "target", "output", "correct", "scores"])


def _apply(run: EvaluationRun, kind: str, data: dict, at: datetime,
           benchmark_ids: set[int]) -> set[str]:
    """Apply one event; the run's fields it changed."""
    if kind in ("started", "progress"):
        if run.progress_at is None or at >= run.progress_at:
            run.progress_at = at
            return {"progress_at"}
        return set()
    if kind in ("result", "samples"):
        benchmark_id = data.get("benchmark")
        if benchmark_id not in benchmark_ids:
            return set()  # not a benchmark of this run: nothing of it is recorded
        if kind == "result":
            _record_result(run, benchmark_id, data)
        else:
            _record_samples(run, benchmark_id, data.get("samples"))
        return set()
    if kind == "finished":
        run.succeeded = True
        run.finished_at = at
        run.cached_requests = _count(data.get("cached_requests"))
        run.total_requests = max(_count(data.get("total_requests")), run.cached_requests)
        run.message = ""
        audit_record(actor=None, action="evaluation_run.finish", obj=run, tenant=run.tenant,
                     changes={"cached_requests": run.cached_requests,
                              "total_requests": run.total_requests})
        return {"succeeded", "finished_at", "cached_requests", "total_requests", "message"}
    if kind == "failed":
        run.message = _text(data.get("message"))[:2000]
        return {"message"}
    return set()


@transaction.atomic
def evaluation_events_apply(*, job: Job, events: list[dict]) -> int:
    """Apply a batch from the job's runner, in order; how many were applied."""
    run = EvaluationRun.objects.select_for_update().filter(job=job).first()
    if run is None:
        return 0
    benchmark_ids = set(run.benchmarks.values_list("pk", flat=True))
    changed: set[str] = set()
    for event in events:
        if run.succeeded:
            break  # its result is recorded; a late repeat changes nothing
        data = event.get("data") or {}
        changed |= _apply(run, event["kind"], data, _at(event), benchmark_ids)
    if changed:
        run.save(update_fields=[*sorted(changed), "updated_at"])
    return len(events)
