from django.db import models


class DatasetKind(models.TextChoices):
    TEXT = "text", "Text corpus"
    INSTRUCTION = "instruction", "Instructions (prompt and response)"


class VersionFormat(models.TextChoices):
    JSONL = "jsonl", "Documents (JSONL)"
    TOKENS = "tokens", "Token shards"


class TrainingKind(models.TextChoices):
    TOKENIZER = "tokenizer", "Tokenizer"
    PRETRAIN = "pretrain", "Pretraining"
    SFT = "sft", "Full fine-tune (SFT)"
    LORA = "lora", "LoRA fine-tune"
    PROMPT_TUNING = "prompt_tuning", "Prompt tuning"
    MULTITASK_PROMPT_TUNING = "multitask_prompt_tuning", "Multi-task prompt tuning"


class RunState(models.TextChoices):
    """A toolchain run's state, read off its job (and its reported result)."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    RESTARTING = "restarting", "Restarting"
    FINISHING = "finishing", "Finishing"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# What a runner reports (`ylink.runners.report`).
RUNNER_EVENT_KINDS = [(kind, kind) for kind in (
    "started", "progress", "metric", "checkpoint", "data_step", "done", "failed")]

FINAL_RUN_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
