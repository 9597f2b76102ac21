"""Reads, always scoped to the caller's tenants."""

from pathlib import Path

from django.db.models import Count, Max, QuerySet

from infra_os.access import scope_to_user
from ylink.models import (
    Checkpoint,
    Dataset,
    DatasetVersion,
    PipelineRun,
    TrainingMetric,
    TrainingRun,
)


def dataset_list(*, user) -> QuerySet[Dataset]:
    return scope_to_user(Dataset.objects.select_related("tenant", "created_by"), user).annotate(
        version_count=Count("versions"), latest_version=Max("versions__number"))


def dataset_version_list(*, user) -> QuerySet[DatasetVersion]:
    return scope_to_user(
        DatasetVersion.objects.select_related("dataset", "dataset__tenant", "parent",
                                              "parent__dataset", "created_by"),
        user, tenant_field="dataset__tenant")


def pipeline_run_list(*, user) -> QuerySet[PipelineRun]:
    return scope_to_user(
        PipelineRun.objects.select_related(
            "tenant", "created_by", "job", "job__queue", "input_version",
            "input_version__dataset__tenant", "input_version__created_by", "output_version",
            "output_version__dataset__tenant", "output_version__created_by", "tokenizer_run"),
        user)


def training_run_list(*, user) -> QuerySet[TrainingRun]:
    return scope_to_user(
        TrainingRun.objects.select_related(
            "tenant", "created_by", "job", "job__queue", "dataset_version__dataset__tenant",
            "dataset_version__created_by", "base_run"),
        user)


def training_metrics(*, run: TrainingRun, after_step: int = -1,
                     limit: int = 5000) -> QuerySet[TrainingMetric]:
    return run.metrics.filter(step__gt=after_step).order_by("step")[:limit]


def training_checkpoints(*, run: TrainingRun) -> list[Checkpoint]:
    """The run's checkpoints whose files are still there, newest first: the runner keeps only
    the newest few, and a folder may be deleted by hand, so a row alone proves nothing."""
    return [checkpoint for checkpoint in run.checkpoints.order_by("-step")
            if checkpoint.path and Path(checkpoint.path).exists()]
