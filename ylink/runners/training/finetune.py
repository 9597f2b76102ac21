"""Kinds `sft` (all weights), `lora` (PEFT adapter) and the prompt-tuning kinds (PEFT
prompts, see `prompt_tuning`) on an instruction dataset.

A plain torch loop rather than TRL: TRL is not installed here, and the loop the pretraining uses
already gives what SFT needs (prompt masking, packing-free padded batches, accumulation,
checkpoints and resume that continue the data position).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ylink.runners.training import prompt_tuning
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.common import checkpoint_root, context_length_of, find_resume
from ylink.runners.training.data import SampleOrder, collate_instructions, load_instructions
from ylink.runners.training.runtime import Runtime, TrainError
from ylink.runners.training.session import run_training

# PEFT still asks transformers for a property transformers 5 deprecates; nothing to act on.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

# Module names LoRA adapts when the spec leaves lora.target_modules null.
DEFAULT_LORA_TARGETS = {
    "gpt2": ["c_attn"],
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
    "gemma": ["q_proj", "v_proj"],
    "smollm3": ["q_proj", "v_proj"],
}
# GPT-2 stores its projections as Conv1D (weights transposed): PEFT must know.
CONV1D_MODEL_TYPES = {"gpt2"}


def lora_config(settings: dict[str, Any], model_type: str):
    from peft import LoraConfig, TaskType

    targets = settings["target_modules"] or DEFAULT_LORA_TARGETS.get(model_type)
    if not targets:
        raise TrainError(
            f"lora.target_modules: no default for model type {model_type!r}; name the modules "
            f"to adapt",
            exit_code=2,
        )
    return LoraConfig(
        r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
        target_modules=list(targets), fan_in_fan_out=model_type in CONV1D_MODEL_TYPES,
        bias="none", task_type=TaskType.CAUSAL_LM,
    )


def _load_base(base: Path, source: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (base / "config.json").is_file():
        raise TrainError(f"base_model_path {base} is not a saved model (no config.json)",
                         exit_code=2)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(base))
    except (OSError, ValueError) as exc:
        raise TrainError(f"base_model_path {base} has no usable tokenizer files: {exc}",
                         exit_code=2) from None
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    return tokenizer, model


def run_finetune(spec: dict[str, Any], runtime: Runtime, reporter: Any) -> dict[str, Any]:
    if spec["kind"] in prompt_tuning.KINDS:
        return run_prompt_tuning(spec, runtime, reporter)
    kind, training = spec["kind"], spec["training"]
    base = Path(spec["base_model_path"])
    store = CheckpointStore(checkpoint_root(spec), training["keep_checkpoints"])
    resume = find_resume(runtime, store, kind)

    torch.manual_seed(training["seed"])  # the same LoRA initialisation on every replica
    if kind == "sft":
        tokenizer, model = _load_base(base, resume.path if resume else base)
    else:
        from peft import PeftModel, get_peft_model

        tokenizer, model = _load_base(base, base)
        if resume is not None:
            model = PeftModel.from_pretrained(model, str(resume.path), is_trainable=True)
        else:
            model = get_peft_model(model, lora_config(spec["lora"], model.config.model_type))
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise TrainError(f"the tokenizer of {base} has no EOS token", exit_code=2)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    context = context_length_of(model.config)
    instructions = load_instructions(spec["data"]["path"], tokenizer, eos_id, context + 1)
    if runtime.is_main:
        print(f"{kind}: {len(instructions.examples)} instruction examples "
              f"({instructions.skipped} skipped, {instructions.truncated} truncated)", flush=True)
    examples = instructions.examples
    order = SampleOrder(len(examples), training["seed"])

    def make_batch(counters: list[int]):
        return collate_instructions([examples[order(counter)] for counter in counters], pad_id)

    def write_weights(directory: Path, state_dict: dict | None) -> None:
        model.save_pretrained(str(directory), state_dict=state_dict)

    def write_output(directory: Path, state_dict: dict | None) -> None:
        write_weights(directory, state_dict)
        tokenizer.save_pretrained(str(directory))

    return run_training(
        spec=spec, runtime=runtime, reporter=reporter, model=model, resume=resume, store=store,
        make_batch=make_batch, write_weights=write_weights, write_output=write_output,
        artifact="model" if kind == "sft" else "adapter",
        extra_done={"examples": len(examples), "base_model_path": str(base)},
    )


def run_prompt_tuning(spec: dict[str, Any], runtime: Runtime, reporter: Any) -> dict[str, Any]:
    """A tuned prompt (one, or one per task) on the frozen base; the same loop, checkpoints and
    resume as LoRA. Each example's task index goes to the model as `task_ids`."""
    from peft import PeftConfig, get_peft_model, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    kind, training, settings = spec["kind"], spec["training"], spec["prompt_tuning"]
    base = Path(spec["base_model_path"])
    store = CheckpointStore(checkpoint_root(spec), training["keep_checkpoints"])
    resume = find_resume(runtime, store, kind)
    source = prompt_tuning.read_source(settings)

    tokenizer, model = _load_base(base, base)
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise TrainError(f"the tokenizer of {base} has no EOS token", exit_code=2)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    room = context_length_of(model.config) - prompt_tuning.virtual_tokens(settings, source)
    if room < 2:
        raise TrainError(f"prompt_tuning.num_virtual_tokens leaves {max(0, room)} of the "
                         f"model's positions for the text", exit_code=2)
    instructions = load_instructions(spec["data"]["path"], tokenizer, eos_id, room + 1)
    tasks = prompt_tuning.task_names(kind, settings, instructions.tasks)
    if resume is not None and resume.state.get("tasks", tasks) != tasks:
        raise TrainError(f"the checkpoint was trained on tasks {resume.state.get('tasks')}, "
                         f"the data now has {tasks}: use a fresh checkpoint dir", exit_code=2)
    torch.manual_seed(training["seed"])  # the same random prompt on every replica
    if resume is not None:
        # PEFT loads prompt adapters for inference only: build it from the checkpoint's
        # (self-contained) config, then load its weights.
        config = PeftConfig.from_pretrained(str(resume.path))
        config.inference_mode = False
        model = get_peft_model(model, config)
        set_peft_model_state_dict(model, load_peft_weights(str(resume.path), device="cpu"))
    else:
        model = get_peft_model(model, prompt_tuning.peft_config(
            kind, settings, base=base, tasks=tasks, source=source))
    about = prompt_tuning.describe(kind, settings, tasks, source)
    if runtime.is_main:
        counts = {task: 0 for task in tasks}
        for task in instructions.tasks:
            counts[task or prompt_tuning.DEFAULT_TASK] = \
                counts.get(task or prompt_tuning.DEFAULT_TASK, 0) + 1
        print(f"{kind}: {len(instructions.examples)} instruction examples "
              f"({instructions.skipped} skipped, {instructions.truncated} truncated)"
              + (f"; tasks {counts}" if tasks else ""), flush=True)
    examples = instructions.examples
    task_of = [tasks.index(task or prompt_tuning.DEFAULT_TASK) if tasks else 0
               for task in instructions.tasks]
    order = SampleOrder(len(examples), training["seed"])

    def make_batch(counters: list[int]):
        indices = [order(counter) for counter in counters]
        batch = collate_instructions([examples[index] for index in indices], pad_id)
        if tasks:
            batch.task_ids = torch.tensor([task_of[index] for index in indices])
        return batch

    def write_weights(directory: Path, state_dict: dict | None) -> None:
        model.save_pretrained(str(directory), state_dict=state_dict)
        prompt_tuning.finish_folder(directory, about)

    def write_output(directory: Path, state_dict: dict | None) -> None:
        write_weights(directory, state_dict)
        tokenizer.save_pretrained(str(directory))

    return run_training(
        spec=spec, runtime=runtime, reporter=reporter, model=model, resume=resume, store=store,
        make_batch=make_batch, write_weights=write_weights, write_output=write_output,
        artifact="adapter", checkpoint_state={"tasks": tasks},
        extra_done={"examples": len(examples), "base_model_path": str(base),
                    **({"tasks": tasks} if tasks else {})},
    )
