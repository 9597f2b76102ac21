from django.db import models

from ylink.models.datasets import DatasetVersion
from ylink.models.runs import ToolchainRun


class PipelineRun(ToolchainRun):
    """A data pipeline (a list of steps from `ylink.steps`) run as one job of `replicas`
    processes on a dataset version; its result is a new version of the same dataset."""

    input_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT,
                                      related_name="pipeline_runs")
    steps = models.JSONField(help_text="The steps with every parameter, defaults filled in.")
    replicas = models.PositiveIntegerField(default=1)
    tokenizer_run = models.ForeignKey("ylink.TrainingRun", null=True, blank=True,
                                      on_delete=models.PROTECT, related_name="+")
    # Per step, merged over replicas: documents and bytes in and out, drops by reason, samples.
    step_results = models.JSONField(default=list, blank=True)
    output_version = models.ForeignKey(DatasetVersion, null=True, blank=True,
                                       on_delete=models.SET_NULL, related_name="+")
    # A training run to start on the output once it is recorded (the demo's one click):
    # the keyword arguments of `training_run_start` less the dataset version.
    then_train = models.JSONField(null=True, blank=True)

    class Meta(ToolchainRun.Meta):
        pass

    def __str__(self) -> str:
        return f"pipeline run {self.pk} {self.name}"
