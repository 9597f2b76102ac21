from django.db import models

from ylink.choices import RunState, TrainingKind
from ylink.models.datasets import DatasetVersion
from ylink.models.runs import ToolchainRun


class TrainingRun(ToolchainRun):
    """A tokenizer, a pretraining or a fine-tune (SFT, LoRA) run as one job; progress as the
    runner reports it, its metrics and checkpoints in their own tables."""

    kind = models.CharField(max_length=32, choices=TrainingKind.choices)
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT,
                                        related_name="training_runs")
    base_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="fine_tunes",
                                 help_text="The run whose model a fine-tune starts from.")
    # Stage 2 of a recipe (the multi-task prompt-tuning preset): no job until this run
    # succeeds, then one is submitted with the `pending_launch` resources.
    after_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="next_runs",
                                  help_text="The run this one starts after, once it succeeds.")
    pending_launch = models.JSONField(default=dict, blank=True,
                                      help_text="queue, resources and restarts of a run that "
                                      "waits for its after_run.")
    spec = models.JSONField(help_text="The runner's spec, defaults filled in.")
    gpus = models.PositiveIntegerField(default=0)
    replicas = models.PositiveIntegerField(default=1)

    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    tokens_per_s = models.FloatField(null=True, blank=True)
    eta_s = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    lr = models.FloatField(null=True, blank=True)
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)

    # The result: a tokenizer, model or adapter folder (absolute, as the runner wrote it).
    artifact = models.CharField(max_length=16, blank=True)
    output_path = models.CharField(max_length=500, blank=True)
    parameters = models.BigIntegerField(null=True, blank=True)

    class Meta(ToolchainRun.Meta):
        pass

    def __str__(self) -> str:
        return f"training run {self.pk} {self.name}"

    @property
    def waiting_for(self) -> "TrainingRun | None":
        """The run this one waits for before its job exists (None once it has one)."""
        if self.job_id is None and not self.succeeded and self.after_run_id is not None:
            return self.after_run
        return None

    @property
    def state(self) -> str:
        before = self.waiting_for
        if before is not None:
            ended = before.state in (RunState.FAILED, RunState.CANCELLED)
            return RunState.FAILED if ended or self.message else RunState.QUEUED
        return super().state


class TrainingMetric(models.Model):
    """One logged training step. One row per step: a step trained again after a resume
    replaces its row."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    loss = models.FloatField()
    lr = models.FloatField(null=True, blank=True)
    tokens = models.BigIntegerField(default=0)
    tokens_per_s = models.FloatField(null=True, blank=True)
    grad_norm = models.FloatField(null=True, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="training_metric_unique_step"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}: loss {self.loss:.4f}"


class Checkpoint(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_step"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} checkpoint at step {self.step}"
