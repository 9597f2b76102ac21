"""Helpers the model-training kinds share: checkpoint location and resume, model configs from
presets, wrapping for DDP/FSDP, tokenizer files next to a model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ylink.presets import preset_config
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.runtime import Runtime, TrainError

EOS_TOKEN = "<|endoftext|>"


def attempt_number() -> int:
    try:
        return int(os.environ.get("OGAI_ATTEMPT", "1"))
    except ValueError:
        return 1


def checkpoint_root(spec: dict[str, Any]) -> Path:
    """$OGAI_CHECKPOINT_DIR, or (standalone runs) a directory beside the output."""
    configured = os.environ.get("OGAI_CHECKPOINT_DIR")
    if configured:
        return Path(configured)
    output = Path(spec["output_dir"])
    return output.parent / f"{output.name}.checkpoints"


@dataclass
class Resume:
    step: int
    path: Path
    state: dict[str, Any]


def find_resume(runtime: Runtime, store: CheckpointStore, kind: str) -> Resume | None:
    """The newest complete checkpoint (the main rank decides; every rank gets the same answer)."""
    found: tuple[int, str, dict] | str | None = None
    if runtime.is_main:
        store.remove_partial()
        for step, path in reversed(store.complete()):
            try:
                state = store.read_state(path)
            except (OSError, ValueError):
                continue  # unreadable: fall back to the one before
            if state.get("kind") != kind:
                found = (f"checkpoint dir {store.root} holds {state.get('kind')} checkpoints, "
                         f"not {kind}: use a fresh checkpoint dir")
            else:
                found = (step, str(path), state)
            break
    found = runtime.broadcast_object(found)  # errors too, so no replica waits forever
    if isinstance(found, str):
        raise TrainError(found, exit_code=2)
    if found is None:
        return None
    return Resume(step=found[0], path=Path(found[1]), state=found[2])


def build_config(
    architecture: str, preset: str, vocab_size: int, context_length: int, eos_id: int
):
    from transformers import GPT2Config, LlamaConfig

    args = preset_config(architecture, preset)
    common = {"vocab_size": vocab_size, "bos_token_id": eos_id, "eos_token_id": eos_id,
              "pad_token_id": eos_id, "attn_implementation": "sdpa"}
    if architecture == "gpt2":
        # No dropout: small models trained from scratch on packed data do not need it.
        return GPT2Config(n_positions=context_length, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, **args, **common)
    return LlamaConfig(max_position_embeddings=context_length, **args, **common)


def context_length_of(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise TrainError("cannot tell the model's context length from its config", exit_code=2)


def set_token_ids(model: Any, eos_id: int, pad_id: int | None = None) -> None:
    pad_id = eos_id if pad_id is None else pad_id
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is None:
            continue
        config.eos_token_id = eos_id
        config.pad_token_id = pad_id
        if getattr(config, "bos_token_id", None) is None:
            config.bos_token_id = eos_id


def wrap_model(model: torch.nn.Module, runtime: Runtime, mode: str, dtype) -> torch.nn.Module:
    model.to(runtime.device)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype \
            else MixedPrecisionPolicy()
        block_names = set(getattr(model, "_no_split_modules", None) or ())
        for module in model.modules():
            if type(module).__name__ in block_names:
                fully_shard(module, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    return model


def save_tokenizer_files(tokenizer: Any, directory: Path, *, eos_id: int,
                         model_max_length: int | None = None) -> None:
    """Write tokenizer.json + the transformers files for a tokenizers.Tokenizer (or a path)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, Tokenizer):
        tokenizer = Tokenizer.from_file(str(tokenizer))
    eos = tokenizer.id_to_token(eos_id)
    if eos is None:
        raise TrainError(f"the tokenizer has no token with the EOS id {eos_id}", exit_code=2)
    kwargs: dict[str, Any] = {"bos_token": eos, "eos_token": eos, "unk_token": eos,
                              "pad_token": eos}
    if model_max_length:
        kwargs["model_max_length"] = model_max_length
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs)
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
