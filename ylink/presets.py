"""Model size presets, size and memory estimates, and validation of training specs.

Pure Python: the API validates specs with it before a job exists, and the runner inside the job
builds its model config from it. Importing this module must not import torch or Django.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
MIB = 1024**2

ARCHITECTURES = ("gpt2", "llama")
KINDS = ("tokenizer", "pretrain", "sft", "lora", "prompt_tuning", "multitask_prompt_tuning")
# Kinds that train a small PEFT adapter on a frozen base (its replicas use DDP, never FSDP).
ADAPTER_KINDS = ("lora", "prompt_tuning", "multitask_prompt_tuning")
PROMPT_TUNING_KINDS = ("prompt_tuning", "multitask_prompt_tuning")
PRECISIONS = ("auto", "fp32", "bf16")
DISTRIBUTED = ("auto", "none", "ddp", "fsdp")
GRADIENT_CHECKPOINTING = ("auto", "on", "off")

# Above this many parameters "auto" picks FSDP (with more than one GPU) and gradient checkpointing.
LARGE_MODEL_PARAMETERS = 1_000_000_000

# Each preset gives the transformers config arguments for both architectures (GPT2Config and
# LlamaConfig names), so the console can show exactly what a preset builds. Vocabulary size and
# context length come from the data and the spec, not from the preset.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "description": "2 layers, width 64: well under 1M parameters with a small vocabulary; CPU",
        "context_length": 256,
        "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256},
        "llama": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "intermediate_size": 172,
                  "tie_word_embeddings": True},
    },
    "small": {
        "description": "8 layers, width 256: ~10M parameters with an 8k vocabulary; CPU or 1 GPU",
        "context_length": 512,
        "gpt2": {"n_embd": 256, "n_layer": 8, "n_head": 8, "n_inner": 1024},
        "llama": {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 688,
                  "tie_word_embeddings": True},
    },
    "gpt2-124m": {
        "description": "GPT-2 small: 12 layers, width 768, ~124M parameters with a 50k vocabulary",
        "context_length": 1024,
        "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": 3072},
        "llama": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "num_key_value_heads": 12, "intermediate_size": 2048,
                  "tie_word_embeddings": True},
    },
    "350m": {
        "description": "24 layers, width 1024: ~350M parameters (GPT-2 medium); 1 GPU",
        "context_length": 1024,
        "gpt2": {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_inner": 4096},
        "llama": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "intermediate_size": 2816,
                  "tie_word_embeddings": True},
    },
    "1b": {
        "description": "16 layers, width 2048: ~1B parameters; 1 large GPU or several with FSDP",
        "context_length": 2048,
        "gpt2": {"n_embd": 2048, "n_layer": 16, "n_head": 32, "n_inner": 8192},
        "llama": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "intermediate_size": 8192,
                  "tie_word_embeddings": True},
    },
    "7b": {
        "description": "32 layers, width 4096: ~7B parameters (Llama-2 7B shape); GPUs with FSDP",
        "context_length": 4096,
        "gpt2": {"n_embd": 4096, "n_layer": 32, "n_head": 32, "n_inner": 16384},
        "llama": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "intermediate_size": 11008,
                  "tie_word_embeddings": False},
    },
}


class SpecError(ValueError):
    """A training spec that cannot run; `errors` maps the place ("training.lr") to what to fix."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{key}: {message}" for key, message in self.errors.items()))


class FitError(ValueError):
    """The requested model and training do not fit the requested resources."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(message)


# ----------------------------------------------------------------------------- shapes and sizes


@dataclass(frozen=True)
class Shape:
    """The numbers every estimate needs, whatever the architecture."""

    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool


def preset_config(architecture: str, preset: str | dict) -> dict[str, Any]:
    """The transformers config arguments of a preset (name or already-resolved dict)."""
    if architecture not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise ValueError(f"unknown architecture {architecture!r}; known: {known}")
    if isinstance(preset, dict):
        return dict(preset.get(architecture, preset))
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[preset][architecture])


def shape_of(architecture: str, preset: str | dict, overrides: dict | None = None) -> Shape:
    config = preset_config(architecture, preset)
    config.update(overrides or {})
    if architecture == "gpt2":
        hidden = config["n_embd"]
        return Shape("gpt2", hidden, config["n_layer"], config["n_head"], config["n_head"],
                     config.get("n_inner") or 4 * hidden, True)
    heads = config["num_attention_heads"]
    return Shape("llama", config["hidden_size"], config["num_hidden_layers"], heads,
                 config.get("num_key_value_heads") or heads, config["intermediate_size"],
                 bool(config.get("tie_word_embeddings", False)))


def estimate_parameters(
    architecture: str,
    preset: str | dict,
    vocab_size: int,
    *,
    context_length: int | None = None,
    overrides: dict | None = None,
) -> int:
    """Parameter count of the model a preset builds (what `num_parameters()` reports).

    GPT-2: token and position embeddings, per block two LayerNorms, fused QKV and output
    projections and a 2-layer MLP, all with biases; the LM head is tied to the token embedding.
    Llama: token embedding, per block q/k/v/o projections (k/v sized by the KV heads), a gated
    MLP (three matrices), two RMSNorms, no biases; a final norm and an LM head unless tied.
    """
    shape = shape_of(architecture, preset, overrides)
    d, f, layers = shape.hidden, shape.intermediate, shape.layers
    if architecture == "gpt2":
        positions = context_length or _preset_context(preset)
        block = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) + (d * f + f) + (f * d + d)
        return vocab_size * d + positions * d + layers * block + 2 * d
    kv_dim = shape.kv_heads * (d // shape.heads)
    block = 2 * d * d + 2 * d * kv_dim + 3 * d * f + 2 * d
    head = 0 if shape.tied else vocab_size * d
    return vocab_size * d + layers * block + d + head


def estimate_lora_parameters(
    architecture: str,
    preset: str | dict,
    r: int,
    target_modules: list[str] | None = None,
) -> int:
    """Trainable parameters LoRA adds: r * (fan in + fan out) per targeted matrix per layer."""
    shape = shape_of(architecture, preset)
    d, f = shape.hidden, shape.intermediate
    kv_dim = shape.kv_heads * (d // shape.heads)
    if architecture == "gpt2":
        sizes = {"c_attn": (d, 3 * d), "c_proj": (d, d), "c_fc": (d, f)}
        default = ["c_attn"]
    else:
        sizes = {"q_proj": (d, d), "k_proj": (d, kv_dim), "v_proj": (d, kv_dim),
                 "o_proj": (d, d), "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
        default = ["q_proj", "v_proj"]
    total = 0
    for name in target_modules or default:
        fan_in, fan_out = sizes.get(name, (d, d))
        total += r * (fan_in + fan_out)
    return total * shape.layers


def estimate_prompt_tuning_parameters(
    architecture: str,
    preset: str | dict,
    num_virtual_tokens: int,
    *,
    num_tasks: int = 0,
    num_ranks: int = 1,
) -> int:
    """Trainable parameters of a tuned prompt (PEFT's PromptEmbedding): one embedding of the
    model's width per virtual token; the multi-task variant (num_tasks > 0) adds per task a
    rank-`num_ranks` factorisation, tokens x ranks and ranks x width."""
    d = shape_of(architecture, preset).hidden
    total = num_virtual_tokens * d
    if num_tasks:
        total += num_tasks * num_virtual_tokens * num_ranks + num_tasks * num_ranks * d
    return total


def _preset_context(preset: str | dict) -> int:
    if isinstance(preset, dict):
        return int(preset.get("context_length", 1024))
    return int(PRESETS[preset]["context_length"])


def uses_gradient_checkpointing(setting: str, parameters: int) -> bool:
    if setting == "on":
        return True
    if setting == "off":
        return False
    return parameters > LARGE_MODEL_PARAMETERS


def resolve_distributed(setting: str, parameters: int, world_size: int) -> str:
    """What a run actually uses: "none" (one process), "ddp" or "fsdp"."""
    if world_size <= 1 or setting == "none":
        return "none"
    if setting in ("ddp", "fsdp"):
        return setting
    return "fsdp" if parameters > LARGE_MODEL_PARAMETERS else "ddp"


def training_memory(
    parameters: int,
    kind: str,
    precision: str,
    *,
    trainable_parameters: int | None = None,
    shards: int = 1,
    batch_size: int = 8,
    context_length: int = 1024,
    hidden: int | None = None,
    layers: int | None = None,
    vocab_size: int | None = None,
    gradient_checkpointing: bool = False,
) -> dict[str, int]:
    """Bytes one device needs to train, split into weights, gradients, optimizer, activations.

    Weights stay fp32 (bf16 is autocast compute, the master weights remain fp32): 4 bytes each;
    gradients 4 bytes per trainable parameter; AdamW keeps two fp32 moments, 8 bytes. FSDP
    divides those by the number of shards. Activations (never sharded) follow Korthikanti et al.
    (2022): ~34 bytes per token per layer per unit of width at 16-bit (68 at fp32) without
    checkpointing, ~2-4 bytes (one saved input per layer) with it, plus fp32 logits and their
    gradient over the vocabulary.
    """
    trainable = parameters if kind in ("pretrain", "sft") else (trainable_parameters or 0)
    if kind in ADAPTER_KINDS and trainable_parameters is None:
        trainable = max(1, parameters // 100)
    shards = max(1, shards)
    weights = 4 * parameters // shards
    gradients = 4 * trainable // shards
    optimizer = 8 * trainable // shards
    activations = 0
    if hidden and layers:
        tokens = batch_size * context_length
        width = 2 if precision == "bf16" else 4
        if gradient_checkpointing:
            per_layer = width * hidden  # the saved input of each block
            activations = tokens * hidden * 17 * width + tokens * layers * per_layer
        else:
            activations = tokens * layers * hidden * 17 * width
        if vocab_size:
            activations += 3 * tokens * vocab_size * 4
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
        "total": weights + gradients + optimizer + activations,
    }


def training_memory_bytes(parameters: int, kind: str, precision: str, **kwargs: Any) -> int:
    """Total bytes per device; see `training_memory` for the parts and the keyword arguments."""
    return training_memory(parameters, kind, precision, **kwargs)["total"]


def _gib(value: float) -> str:
    gib = value / GIB
    return f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.1f} GiB"


# Per GPU: the CUDA context, allocator fragmentation and temporary buffers.
GPU_OVERHEAD_BYTES = 2 * GIB


def check_fits(
    *,
    architecture: str,
    preset: str | dict | None,
    vocab_size: int,
    context_length: int | None,
    kind: str,
    gpus: int,
    gpu_memory_mib: int | None,
    cpu_memory_mib: int | None,
    distributed: str = "auto",
    batch_size: int = 8,
    precision: str = "auto",
    parameters: int | None = None,
    lora_r: int = 8,
    lora_target_modules: list[str] | None = None,
    gradient_checkpointing: str = "auto",
    prompt_tuning: dict | None = None,
) -> None:
    """Raise FitError when the training cannot fit the resources asked for; return None if it can.

    `parameters` replaces the preset's estimate (fine-tuning a model whose size is known);
    `preset` may then be None, which skips the activation estimate. `gpus=0` means a CPU job,
    checked against `cpu_memory_mib` when given.
    """
    if kind == "tokenizer":
        return
    label = f"preset {preset}" if isinstance(preset, str) else "model"
    shape = shape_of(architecture, preset) if preset is not None else None
    if context_length is None and preset is not None:
        context_length = _preset_context(preset)
    context_length = context_length or 1024
    if parameters is None:
        if preset is None:
            raise ValueError("check_fits needs a preset or a parameter count")
        parameters = estimate_parameters(
            architecture, preset, vocab_size, context_length=context_length
        )
    label = f"{label} ({_count(parameters)} parameters)"
    trainable = None
    if kind == "lora":
        trainable = (
            estimate_lora_parameters(architecture, preset, lora_r, lora_target_modules)
            if preset is not None else None
        )
    if kind in PROMPT_TUNING_KINDS and preset is not None:
        settings = prompt_tuning or {}
        trainable = estimate_prompt_tuning_parameters(
            architecture, preset, settings.get("num_virtual_tokens", 8),
            num_tasks=len(settings.get("tasks") or ["?"]) if kind != "prompt_tuning" else 0,
            num_ranks=settings.get("num_ranks", 1),
        )
    checkpointing = uses_gradient_checkpointing(gradient_checkpointing, parameters)
    wanted_precision = "bf16" if gpus and precision in ("auto", "bf16") else "fp32"

    def need(shards: int) -> dict[str, int]:
        return training_memory(
            parameters, kind, wanted_precision, trainable_parameters=trainable, shards=shards,
            batch_size=batch_size, context_length=context_length,
            hidden=shape.hidden if shape else None, layers=shape.layers if shape else None,
            vocab_size=vocab_size if shape else None, gradient_checkpointing=checkpointing,
        )

    if not gpus:
        parts = need(1)
        if cpu_memory_mib is not None and parts["total"] > cpu_memory_mib * MIB:
            raise FitError(
                "resources.memory_mib",
                f"{label}: ~{_gib(parts['total'])} to train on CPU "
                f"({_gib(parts['total'] - parts['activations'])} of weights, gradients and "
                f"optimizer state, {_gib(parts['activations'])} of activations); the job has "
                f"{_gib(cpu_memory_mib * MIB)} of memory — ask for more memory, GPUs, or pick a "
                f"smaller preset",
            )
        return
    if gpu_memory_mib is None:
        return
    per_gpu = gpu_memory_mib * MIB
    mode = resolve_distributed(distributed, parameters, gpus)
    shards = gpus if mode == "fsdp" else 1
    parts = need(shards)
    if parts["total"] + GPU_OVERHEAD_BYTES <= per_gpu:
        return
    state = need(1)
    state_bytes = state["weights"] + state["gradients"] + state["optimizer"]
    activations = parts["activations"]
    room = per_gpu - GPU_OVERHEAD_BYTES - activations
    gpu_word = "GPU" if gpus == 1 else "GPUs"
    held = f"{gpus} {gpu_word} of {_gib(per_gpu)}"
    if room <= 0:
        raise FitError(
            "training.batch_size",
            f"{label}: activations of batch {batch_size} x {context_length} tokens need "
            f"~{_gib(activations)} per GPU, more than the {_gib(per_gpu)} a GPU holds — lower "
            f"training.batch_size and raise training.grad_accum, or shorten the context",
        )
    least = math.ceil(state_bytes / room)
    if mode == "ddp" and shards == 1 and least > 1:
        raise FitError(
            "training.distributed",
            f"{label}: ~{_gib(state_bytes)} of weights, gradients and optimizer state; DDP keeps "
            f"a full copy on each GPU of {_gib(per_gpu)} — use distributed fsdp with at least "
            f"{least} GPUs",
        )
    holds = f"{held} holds {_gib(per_gpu * (gpus if shards > 1 else 1))}"
    raise FitError(
        "resources.gpus",
        f"{label}: ~{_gib(state_bytes)} of weights, gradients and optimizer state "
        f"and ~{_gib(activations)} of activations per GPU; {holds} — ask for at least "
        f"{max(least, gpus + 1)} GPUs with FSDP",
    )


def _count(parameters: int) -> str:
    if parameters >= 1_000_000_000:
        return f"{parameters / 1e9:.1f}B"
    if parameters >= 1_000_000:
        return f"{parameters / 1e6:.1f}M"
    return f"{parameters / 1e3:.0f}k"


# ----------------------------------------------------------------------------- spec validation


@dataclass(frozen=True)
class Field:
    """One setting of a train spec section: type, default and bounds, with help for the console."""

    type: str  # "int" | "float" | "str" | "choice" | "path" | "list"
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    items: str = "module names"  # what a "list" holds, for its error message


TRAINING_FIELDS: dict[str, Field] = {
    "max_steps": Field("int", 200, "optimizer steps to train", 1, 10_000_000),
    "batch_size": Field("int", 8, "sequences per step on each replica", 1, 4096),
    "grad_accum": Field("int", 1, "micro-batches accumulated into one step", 1, 1024),
    "lr": Field("float", 3e-4, "peak learning rate (AdamW)", 1e-8, 1.0),
    "warmup_steps": Field("int", 10, "linear warmup steps before cosine decay", 0, 10_000_000),
    "weight_decay": Field("float", 0.1, "AdamW weight decay on matrices", 0.0, 1.0),
    "max_grad_norm": Field("float", 1.0, "gradient clipping norm; 0 = no clipping", 0.0, 1e6),
    "checkpoint_every": Field("int", 50, "steps between checkpoints", 1, 10_000_000),
    "log_every": Field("int", 10, "steps between metric events", 1, 1_000_000),
    "seed": Field("int", 0, "seed for initialisation and data order", 0, 2**31 - 1),
    "precision": Field("choice", "auto", "auto = bf16 on GPUs that support it, else fp32",
                       choices=PRECISIONS),
    "distributed": Field("choice", "auto",
                         "with several replicas: auto = FSDP above 1B parameters, else DDP",
                         choices=DISTRIBUTED),
    "gradient_checkpointing": Field("choice", "auto",
                                    "recompute activations; auto = on above 1B parameters",
                                    choices=GRADIENT_CHECKPOINTING),
    "keep_checkpoints": Field("int", 2, "newest checkpoints kept", 1, 1000),
}
MODEL_FIELDS: dict[str, Field] = {
    "preset": Field("choice", "tiny", "model size preset", choices=tuple(PRESETS)),
    "architecture": Field("choice", "gpt2", "model family", choices=ARCHITECTURES),
    "context_length": Field("int", None, "tokens per sequence; default: the preset's, at most "
                            "the token dataset's seq_len", 8, 131_072, nullable=True),
    "vocab_size": Field("int", None, "default: the token dataset's vocabulary", 2, 1_048_576,
                        nullable=True),
}
TOKENIZER_FIELDS: dict[str, Field] = {
    "vocab_size": Field("int", 4096, "vocabulary size (256 bytes + merges + special)", 257,
                        1_048_576),
    "min_frequency": Field("int", 2, "minimum pair count for a merge", 1, 1_000_000),
}
LORA_FIELDS: dict[str, Field] = {
    "r": Field("int", 8, "rank of the LoRA matrices", 1, 1024),
    "alpha": Field("float", 16, "LoRA scaling numerator (scale = alpha / r)", 1e-6, 1e6),
    "dropout": Field("float", 0.05, "dropout on the LoRA input", 0.0, 0.99),
    "target_modules": Field("list", None, "module names to adapt; default per architecture "
                            "(gpt2: c_attn, llama: q_proj, v_proj)", nullable=True),
}
PROMPT_TUNING_INITS = ("random", "text", "sample_vocab", "average_source_tasks",
                       "exact_source_task", "only_source_shared")
# Initialisations that start from a source run's multi-task prompt (stage 2 of the recipe).
SOURCE_INITS = ("average_source_tasks", "exact_source_task", "only_source_shared")
PROMPT_TUNING_FIELDS: dict[str, Field] = {
    "num_virtual_tokens": Field("int", 8, "virtual tokens prepended to every input", 1, 4096),
    "init": Field("choice", "random", "how the prompt starts: random, text (init_text's "
                  "token embeddings), sample_vocab (prompt_tuning only), or from a source "
                  "multi-task prompt: average_source_tasks, exact_source_task, "
                  "only_source_shared (multitask_prompt_tuning only)",
                  choices=PROMPT_TUNING_INITS),
    "init_text": Field("str", None, "text whose tokens start the prompt (init text)",
                       nullable=True),
    "num_ranks": Field("int", 1, "multitask: rank of each task's factors", 1, 1024),
    "tasks": Field("list", None, "multitask: task names in task-id order; default: the "
                   "dataset's metadata.task values, sorted", nullable=True, items="task names"),
    "source_adapter_path": Field("path", None, "multitask: the source run's adapter folder "
                                 "for the source inits", nullable=True),
    "source_task": Field("str", None, "multitask, init exact_source_task: the source task "
                         "to start from", nullable=True),
}
DATA_FIELDS: dict[str, Field] = {
    "path": Field("path", None, "absolute path of the dataset version directory"),
    "format": Field("choice", None, "jsonl (documents) or tokens (packed shards)",
                    choices=("jsonl", "tokens")),
}
SECTIONS_BY_KIND: dict[str, tuple[str, ...]] = {
    "tokenizer": ("tokenizer",),
    "pretrain": ("model", "training"),
    "sft": ("training",),
    "lora": ("lora", "training"),
    "prompt_tuning": ("prompt_tuning", "training"),
    "multitask_prompt_tuning": ("prompt_tuning", "training"),
}
SECTION_FIELDS = {
    "training": TRAINING_FIELDS, "model": MODEL_FIELDS, "tokenizer": TOKENIZER_FIELDS,
    "lora": LORA_FIELDS, "prompt_tuning": PROMPT_TUNING_FIELDS,
}
TOP_LEVEL_KEYS = ("run", "kind", "data", "output_dir", "tokenizer", "model", "base_model_path",
                  "lora", "prompt_tuning", "training")
DATA_FORMAT_BY_KIND = {"tokenizer": "jsonl", "pretrain": "tokens", "sft": "jsonl",
                       "lora": "jsonl", "prompt_tuning": "jsonl",
                       "multitask_prompt_tuning": "jsonl"}


def _check_value(field: Field, value: Any) -> tuple[Any, str | None]:
    """The value as stored, or an error message saying what to fix."""
    if value is None:
        if field.nullable:
            return None, None
        return None, "is required"
    kind = field.type
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                return None, "must be an integer"
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "must be a number"
        value = float(value)
        if not math.isfinite(value):
            return None, "must be a finite number"
    elif kind == "choice":
        if value not in field.choices:
            return None, f"unknown value {value!r}; choose one of: {', '.join(field.choices)}"
        return value, None
    elif kind == "path":
        if not isinstance(value, str) or not value:
            return None, "must be a path"
        if not os.path.isabs(value):
            return None, "must be an absolute path"
        return value, None
    elif kind == "str":
        if not isinstance(value, str) or not value.strip():
            return None, "must be a non-empty string"
        return value, None
    elif kind == "list":
        if not isinstance(value, list) or not value or not all(
            isinstance(item, str) and item for item in value
        ):
            return None, f"must be null or a non-empty list of {field.items}"
        return list(value), None
    if field.min is not None and value < field.min:
        return None, _bounds(field)
    if field.max is not None and value > field.max:
        return None, _bounds(field)
    return value, None


def _bounds(field: Field) -> str:
    return f"must be between {field.min:g} and {field.max:g}"


def _check_section(
    name: str, fields: dict[str, Field], given: Any, errors: dict[str, str]
) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        errors[name] = "must be an object"
        return {}
    out: dict[str, Any] = {}
    for key in given:
        if key not in fields:
            errors[f"{name}.{key}"] = f"unknown setting {key!r}; known: {', '.join(fields)}"
    for key, field in fields.items():
        value, problem = _check_value(field, given.get(key, field.default))
        if problem:
            errors[f"{name}.{key}"] = problem
        out[key] = value
    return out


def _check_prompt_tuning(kind: str, settings: dict[str, Any], errors: dict[str, str]) -> None:
    init = settings.get("init")
    if init is None or "prompt_tuning.init" in errors:
        return
    if kind == "prompt_tuning":
        if init not in ("random", "text", "sample_vocab"):
            errors["prompt_tuning.init"] = (
                f"init {init} starts from a source multi-task prompt: it is for kind "
                "multitask_prompt_tuning; prompt_tuning uses random, text or sample_vocab")
        for name in ("tasks", "source_adapter_path", "source_task"):
            if settings.get(name) is not None:
                errors[f"prompt_tuning.{name}"] = "only for kind multitask_prompt_tuning"
    elif init == "sample_vocab":
        errors["prompt_tuning.init"] = ("multitask_prompt_tuning starts from random, text or a "
                                        "source prompt, not sample_vocab")
    if init == "text" and not settings.get("init_text"):
        errors["prompt_tuning.init_text"] = "init text needs the text to start from"
    if init in SOURCE_INITS and not settings.get("source_adapter_path"):
        errors["prompt_tuning.source_adapter_path"] = (
            f"init {init} needs the source run's adapter folder")
    if init not in SOURCE_INITS and settings.get("source_adapter_path"):
        errors["prompt_tuning.source_adapter_path"] = (
            f"only read by the source inits ({', '.join(SOURCE_INITS)}), not {init}")
    if init == "exact_source_task" and not settings.get("source_task"):
        errors["prompt_tuning.source_task"] = "init exact_source_task needs the source task"
    tasks = settings.get("tasks")
    if tasks and len(set(tasks)) != len(tasks):
        errors["prompt_tuning.tasks"] = "names a task twice"


def validate_train_spec(spec: Any) -> dict[str, Any]:
    """The spec with defaults filled in, or SpecError naming every problem at once.

    Only the sections the kind uses are kept (tokenizer: `tokenizer`; pretrain: `model`,
    `training`; sft: `training`; lora: `lora`, `training`; prompt_tuning and
    multitask_prompt_tuning: `prompt_tuning`, `training`); others may be present and are dropped.
    """
    if not isinstance(spec, dict):
        raise SpecError({"spec": "must be a JSON object"})
    errors: dict[str, str] = {}
    for key in spec:
        if key not in TOP_LEVEL_KEYS:
            errors[key] = f"unknown key {key!r}; known: {', '.join(TOP_LEVEL_KEYS)}"
    kind = spec.get("kind")
    if kind not in KINDS:
        errors["kind"] = f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}"
        raise SpecError(errors)
    out: dict[str, Any] = {"run": spec.get("run"), "kind": kind}
    if out["run"] is not None and (isinstance(out["run"], bool) or not isinstance(out["run"], int)):
        errors["run"] = "must be an integer or null"

    data = _check_section("data", DATA_FIELDS, spec.get("data"), errors)
    wanted = DATA_FORMAT_BY_KIND[kind]
    if data.get("format") and data["format"] != wanted and "data.format" not in errors:
        errors["data.format"] = f"kind {kind} trains on a {wanted} dataset, not {data['format']}"
    out["data"] = data
    output_dir, problem = _check_value(Field("path", None, ""), spec.get("output_dir"))
    if problem:
        errors["output_dir"] = problem
    out["output_dir"] = output_dir

    for section in SECTIONS_BY_KIND[kind]:
        out[section] = _check_section(section, SECTION_FIELDS[section], spec.get(section), errors)
    if kind in ("sft", *ADAPTER_KINDS):
        base, problem = _check_value(Field("path", None, ""), spec.get("base_model_path"))
        if problem:
            errors["base_model_path"] = problem
        out["base_model_path"] = base

    training = out.get("training")
    if kind in ADAPTER_KINDS and training and training["distributed"] == "fsdp":
        errors["training.distributed"] = (
            f"{kind} trains with ddp (the frozen base is replicated on each replica); "
            "choose auto or ddp"
        )
    if kind in PROMPT_TUNING_KINDS and "prompt_tuning" in out:
        _check_prompt_tuning(kind, out["prompt_tuning"], errors)
    if errors:
        raise SpecError(errors)
    return out
