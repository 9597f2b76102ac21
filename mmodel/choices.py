from django.db import models


class WeightsFormat(models.TextChoices):
    SAFETENSORS = "safetensors", "safetensors"
    GGUF = "gguf", "GGUF (converted on import)"
    PICKLE = "pickle", "PyTorch pickle (.bin/.pt)"
    ADAPTER = "adapter", "LoRA adapter (safetensors)"


class VersionSource(models.TextChoices):
    IMPORT = "import", "Imported from a directory"
    TRAINING = "training", "Registered from a training run"


class VersionStatus(models.TextChoices):
    IMPORTING = "importing", "Importing"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class ImportState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class BenchmarkKind(models.TextChoices):
    MULTIPLE_CHOICE = "multiple_choice", "Multiple choice (log-likelihood accuracy)"
    GENERATION = "generation", "Generation (exact match)"
    PERPLEXITY = "perplexity", "Perplexity on held-out text"
    RETRIEVAL = "retrieval", "Retrieval (recall@k)"


class EvaluationTarget(models.TextChoices):
    WEIGHTS = "weights", "The version's weights"
    ENDPOINT = "endpoint", "A deployment's endpoint"


class Runtime(models.TextChoices):
    TRANSFORMERS = "transformers", "transformers serve (continuous batching, CPU or GPU)"
    VLLM = "vllm", "vLLM"


class DeploymentState(models.TextChoices):
    """Read off the desired state and the replicas' jobs and readiness."""

    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    DEGRADED = "degraded", "Degraded"
    SCALED_TO_ZERO = "scaled_to_zero", "Scaled to zero"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"


class Vote(models.TextChoices):
    LEFT = "left", "Left is better"
    RIGHT = "right", "Right is better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both are bad"
