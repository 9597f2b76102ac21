"""Kind `pretrain`: a GPT-2 or Llama model from a size preset, trained on packed token shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ylink.presets import PRESETS
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.common import (
    build_config,
    checkpoint_root,
    find_resume,
    save_tokenizer_files,
    set_token_ids,
)
from ylink.runners.training.data import SampleOrder, TokenWindows, read_token_meta
from ylink.runners.training.runtime import Runtime, TrainError
from ylink.runners.training.session import run_training


def run_pretrain(spec: dict[str, Any], runtime: Runtime, reporter: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    data_dir = Path(spec["data"]["path"])
    settings, training = spec["model"], spec["training"]
    meta = read_token_meta(data_dir)
    tokenizer_file = data_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TrainError(f"data.path {data_dir} has no tokenizer.json", exit_code=2)
    seq_len, eos_id = int(meta["seq_len"]), int(meta["eos_id"])
    context = settings["context_length"] or min(
        PRESETS[settings["preset"]]["context_length"], seq_len
    )
    if context > seq_len:
        raise TrainError(
            f"model.context_length {context} is longer than the token dataset's seq_len "
            f"{seq_len}: at most {seq_len}",
            exit_code=2,
        )
    vocab_size = settings["vocab_size"] or int(meta["vocab_size"])
    if vocab_size < int(meta["vocab_size"]):
        raise TrainError(
            f"model.vocab_size {vocab_size} is smaller than the tokenizer's {meta['vocab_size']}",
            exit_code=2,
        )
    windows = TokenWindows(data_dir, context + 1, int(meta["token_size"]))
    order = SampleOrder(len(windows), training["seed"])
    store = CheckpointStore(checkpoint_root(spec), training["keep_checkpoints"])
    resume = find_resume(runtime, store, "pretrain")

    torch.manual_seed(training["seed"])  # the same initial weights on every replica
    if resume is not None:
        model = AutoModelForCausalLM.from_pretrained(str(resume.path), dtype=torch.float32)
    else:
        config = build_config(settings["architecture"], settings["preset"], vocab_size, context,
                              eos_id)
        model = AutoModelForCausalLM.from_config(config)
    set_token_ids(model, eos_id)

    def make_batch(counters: list[int]):
        return windows.batch([order(counter) for counter in counters])

    def write_weights(directory: Path, state_dict: dict | None) -> None:
        model.save_pretrained(str(directory), state_dict=state_dict)

    def write_output(directory: Path, state_dict: dict | None) -> None:
        write_weights(directory, state_dict)
        save_tokenizer_files(tokenizer_file, directory, eos_id=eos_id, model_max_length=context)

    return run_training(
        spec=spec, runtime=runtime, reporter=reporter, model=model, resume=resume, store=store,
        make_batch=make_batch, write_weights=write_weights, write_output=write_output,
        artifact="model",
        extra_done={"architecture": settings["architecture"], "preset": settings["preset"],
                    "context_length": context, "vocab_size": vocab_size},
    )
