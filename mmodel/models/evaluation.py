from django.conf import settings
from django.db import models

from infra_os.models import Tenant
from mmodel.choices import BenchmarkKind, EvaluationTarget
from mmodel.models.registry import ModelVersion, model_name
from ogai.models import TimeStampedModel
from ylink.models.runs import ToolchainRun


class Benchmark(TimeStampedModel):
    """A benchmark kept by the platform: JSONL data and how to prompt and score it, compiled
    into an lm-eval task. `tenant` empty: shipped with the platform, visible to every tenant."""

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="benchmarks")
    name = models.CharField(max_length=100, validators=[model_name])
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=24, choices=BenchmarkKind.choices)
    # The JSONL file under DATA_DIR, and what it holds.
    data_path = models.CharField(max_length=1000)
    documents = models.PositiveIntegerField(default=0)
    content_hash = models.CharField(max_length=64)
    # Jinja templates over a document's fields, as lm-eval takes them (doc_to_text,
    # doc_to_target, doc_to_choice); perplexity reads `text_field` whole.
    prompt_template = models.TextField(blank=True)
    target_template = models.TextField(blank=True)
    choices_template = models.TextField(blank=True)
    text_field = models.CharField(max_length=100, blank=True)
    few_shot = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=list, blank=True)
    generation_kwargs = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="benchmark_unique_name"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(tenant__isnull=True),
                                    name="benchmark_unique_shared_name"),
        ]

    def __str__(self) -> str:
        return self.name


class EvaluationRun(ToolchainRun):
    """One version (its weights, or a deployment of it) scored on benchmarks by
    `python -m mmodel.runners.evaluate` inside a job."""

    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT,
                                related_name="evaluation_runs")
    target = models.CharField(max_length=16, choices=EvaluationTarget.choices,
                              default=EvaluationTarget.WEIGHTS)
    deployment = models.ForeignKey("mmodel.Deployment", null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="evaluation_runs")
    benchmarks = models.ManyToManyField(Benchmark, related_name="evaluation_runs")
    limit = models.PositiveIntegerField(null=True, blank=True,
                                        help_text="At most this many documents per benchmark.")
    spec = models.JSONField(default=dict, blank=True)
    # How many of its requests were answered from the cache of earlier runs.
    cached_requests = models.PositiveIntegerField(default=0)
    total_requests = models.PositiveIntegerField(default=0)
    progress_at = models.DateTimeField(null=True, blank=True)

    class Meta(ToolchainRun.Meta):
        pass


class EvaluationResult(models.Model):
    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="results")
    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="results")
    metric = models.CharField(max_length=64)
    value = models.FloatField()
    stderr = models.FloatField(null=True, blank=True)
    samples = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["benchmark__name", "metric"]
        constraints = [
            models.UniqueConstraint(fields=["run", "benchmark", "metric"],
                                    name="evaluation_result_once"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.metric}={self.value:g}"


class EvaluationSample(models.Model):
    """What the model did on one document: the prompt, the expected answer, its answer, and
    whether it scored."""

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="samples")
    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="+")
    index = models.PositiveIntegerField()
    prompt = models.TextField(blank=True)
    target = models.TextField(blank=True)
    output = models.TextField(blank=True)
    correct = models.BooleanField(null=True)
    scores = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "benchmark", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "benchmark", "index"],
                                    name="evaluation_sample_once"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} sample {self.index}"
