"""LoRA adapter versions served by a runtime that cannot apply adapters itself (transformers
serve): the adapter merged into its base once, into a folder cached by the adapter's content
hash and shared by every deployment of it. The merge runs in a Celery task
(`mmodel.merge_adapter`), never in a request; replicas start once the folder is complete."""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from django.conf import settings

from mmodel.choices import WeightsFormat
from mmodel.models import ModelVersion
from mmodel.storage import artifact_folder

logger = logging.getLogger(__name__)
COMPLETE = ".complete"  # written last: a folder without it is a merge that did not finish
FAILED = ".failed"  # beside the folder, the reason a merge failed


def is_adapter(version: ModelVersion) -> bool:
    return version.format == WeightsFormat.ADAPTER


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
