"""LoRA adapter versions served by a runtime that cannot apply adapters itself (transformers
serve): the adapter merged into its base once, into a folder cached by the adapter's content
hash and shared by every deployment of it. The merge runs in a Celery task
(`mmodel.merge_adapter`), never in a request; replicas start once the folder is complete.

A tuned prompt (prompt tuning, multi-task prompt tuning) is input embeddings, not a change to
any weight: it cannot be merged. The transformers runtime serves it attached (PEFT's
PeftModel on the base, in `mmodel.runners.serve_transformers`); vLLM cannot serve it."""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

from django.conf import settings

from mmodel.choices import Runtime, WeightsFormat
from mmodel.models import ModelVersion
from mmodel.storage import artifact_folder

logger = logging.getLogger(__name__)
COMPLETE = ".complete"  # written last: a folder without it is a merge that did not finish
FAILED = ".failed"  # beside the folder, the reason a merge failed


def is_adapter(version: ModelVersion) -> bool:
    return version.format == WeightsFormat.ADAPTER


PROMPT_PEFT_TYPES = frozenset({"PROMPT_TUNING", "MULTITASK_PROMPT_TUNING"})
PROMPT_SERVING = ("served attached by the transformers runtime; vLLM cannot serve "
                  "prompt-tuning adapters")


def adapter_type(version: ModelVersion) -> str:
    """PEFT's type of an adapter version ("LORA", "PROMPT_TUNING", …; "" when unreadable)."""
    if not is_adapter(version):
        return ""
    try:
        config = json.loads((artifact_folder(version) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(config.get("peft_type") or "")


def is_prompt_adapter(version: ModelVersion) -> bool:
    return adapter_type(version) in PROMPT_PEFT_TYPES


def adapter_serving(version: ModelVersion, runtime: str) -> str:
    """How a runtime serves the version, in words ("" for a plain model)."""
    if not is_adapter(version):
        return ""
    if is_prompt_adapter(version):
        return PROMPT_SERVING
    if runtime == Runtime.VLLM:
        return "LoRA adapter attached to its base by vLLM"
    return "LoRA adapter merged into its base for the transformers runtime"


def merged_folder(version: ModelVersion) -> Path:
    key = version.content_hash or f"version-{version.pk}"
    return Path(settings.DATA_DIR) / "mmodel" / "merged" / key


def merge_state(version: ModelVersion) -> tuple[bool, str]:
    """(merged and complete, why a merge failed: "" when it did not fail)."""
    folder = merged_folder(version)
    if (folder / COMPLETE).exists():
        return True, ""
    failed = folder.with_name(folder.name + FAILED)
    return False, failed.read_text() if failed.exists() else ""


def adapter_merge(*, version: ModelVersion) -> Path:
    """Merge the adapter into its base (peft `merge_and_unload`) and save the result with the
    tokenizer; idempotent (a complete folder is returned as it is). On failure the reason is
    kept beside the folder and the error raised."""
    folder = merged_folder(version)
    if (folder / COMPLETE).exists():
        return folder
    failed = folder.with_name(folder.name + FAILED)
    base = version.base_version
    if base is None:
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"{version.label} is an adapter without a base version")
        raise ValueError(failed.read_text())
    staging = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}")
    try:
        _merge_into(artifact_folder(base), artifact_folder(version), staging)
        (staging / COMPLETE).write_text(version.label)
        if (folder / COMPLETE).exists():
            # Another merge of the same adapter finished first (replicas may start from it).
            shutil.rmtree(staging, ignore_errors=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)  # an unfinished one
            staging.rename(folder)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"merging adapter {version.label} into {base.label} failed: {exc}")
        raise
    failed.unlink(missing_ok=True)
    return folder


def _merge_into(base: Path, adapter: Path, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out.mkdir(parents=True)
    merged.save_pretrained(str(out), safe_serialization=True)
    # The fine-tune's tokenizer (a chat template may have been added) when it saved one.
    has_tokenizer = any((adapter / name).exists()
                        for name in ("tokenizer.json", "tokenizer_config.json"))
    AutoTokenizer.from_pretrained(str(adapter if has_tokenizer else base)) \
        .save_pretrained(str(out))
    for path in out.rglob("*"):
        # Readable by model servers running as the tenant's user (save_pretrained writes 0600).
        if path.is_file() and not path.is_symlink():
            path.chmod(0o644)


def single_task_prompt(version: ModelVersion, task: str = "") -> Path:
    """A multi-task prompt adapter as the plain prompt of one of its tasks (`task`, else its
    first), for tools that cannot pass task ids (lm-eval): the shared embedding scaled by that
    task's factors, which is what its forward computes for that task id. Written once per
    adapter and task; a plain prompt adapter is returned as it is."""
    adapter = artifact_folder(version)
    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("peft_type") != "MULTITASK_PROMPT_TUNING":
        return adapter
    from safetensors.torch import load_file, save_file

    try:
        tasks = json.loads((adapter / "prompt_tasks.json").read_text()).get("tasks") or []
    except (OSError, ValueError):
        tasks = []
    if task and task not in tasks:
        raise ValueError(f"{version.label} has no task {task!r} ({', '.join(tasks)})")
    index = tasks.index(task) if task else 0
    key = version.content_hash or f"version-{version.pk}"
    folder = Path(settings.DATA_DIR) / "mmodel" / "prompts" / f"{key}-task{index}"
    if (folder / COMPLETE).exists():
        return folder
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    factors = weights["prefix_task_cols"][index] @ weights["prefix_task_rows"][index]
    plain = {key: value for key, value in config.items()
             if key not in ("num_ranks", "num_tasks", "prompt_tuning_init_task",
                            "prompt_tuning_init_state_dict_path")}
    plain |= {"peft_type": "PROMPT_TUNING", "prompt_tuning_init": "RANDOM"}
    staging = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}")
    staging.mkdir(parents=True)
    save_file({"prompt_embeddings": (weights["prompt_embeddings"] * factors).contiguous()},
              str(staging / "adapter_model.safetensors"))
    (staging / "adapter_config.json").write_text(json.dumps(plain, indent=2, sort_keys=True))
    (staging / "prompt_tasks.json").write_text(json.dumps(
        {"kind": "prompt_tuning", "tasks": [], "from_task": tasks[index] if tasks else None}))
    (staging / COMPLETE).write_text(version.label)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder
