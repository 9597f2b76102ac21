"""One training attempt of a model kind, from a built model to its saved artifact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ylink.presets import ADAPTER_KINDS, resolve_distributed, uses_gradient_checkpointing
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.common import Resume, attempt_number, wrap_model
from ylink.runners.training.data import Batch
from ylink.runners.training.loop import Loop
from ylink.runners.training.runtime import Runtime, TrainError, compute_dtype, precision_name


def run_training(
    *,
    spec: dict[str, Any],
    runtime: Runtime,
    reporter: Any,
    model: torch.nn.Module,
    resume: Resume | None,
    store: CheckpointStore,
    make_batch: Callable[[list[int]], Batch],
    write_weights: Callable[[Path, dict | None], None],
    write_output: Callable[[Path, dict | None], None],
    artifact: str,
    extra_done: dict[str, Any] | None = None,
    checkpoint_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train `model` (plain, on CPU) per `spec["training"]`; return the `done` output.

    `write_weights(dir, state_dict)` writes checkpoint weights and `write_output(dir, state_dict)`
    the final artifact, on the main rank; `state_dict` is the gathered full state under FSDP and
    None otherwise (then they read the module itself). `checkpoint_state` goes into every
    checkpoint's state file (what a resume must find unchanged)."""
    training = spec["training"]
    kind = spec["kind"]
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mode = resolve_distributed(training["distributed"], parameters, runtime.world_size)
    if kind in ADAPTER_KINDS and mode == "fsdp":
        mode = "ddp"  # only the small adapter trains: replicating the frozen base is the norm
    if runtime.world_size > 1 and mode == "none":
        raise TrainError(
            f"training.distributed none with {runtime.world_size} replicas: the replicas would "
            f"train separate models; choose auto, ddp or fsdp",
            exit_code=2,
        )
    if uses_gradient_checkpointing(training["gradient_checkpointing"], parameters):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    dtype = compute_dtype(training["precision"], runtime.device)
    wrapped = wrap_model(model, runtime, mode, dtype)
    # Dropout and the data order differ per replica only through this seed.
    torch.manual_seed(training["seed"] + 7919 * runtime.rank)

    def gather_weights() -> dict | None:
        if mode != "fsdp":
            return None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        return get_model_state_dict(
            wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    loop = Loop(
        runtime=runtime, model=wrapped, training=training, make_batch=make_batch,
        gather_weights=gather_weights, write_weights=write_weights, store=store,
        reporter=reporter, kind=kind, mode=mode, dtype=dtype,
        extra_state=dict(checkpoint_state or {}),
    )
    loop.build_optimizer()
    if resume is not None:
        loop.resume(resume.path, resume.state)
    if runtime.is_main:
        reporter.send(
            "started", attempt=attempt_number(), world_size=runtime.world_size,
            resumed_from_step=resume.step if resume else None, parameters=parameters,
            trainable_parameters=trainable, device=str(runtime.device),
            precision=precision_name(dtype), distributed=mode,
        )
        print(
            f"{kind}: {parameters:,} parameters ({trainable:,} trainable) on {runtime.device}, "
            f"{precision_name(dtype)}, {runtime.world_size} replica(s) ({mode}); "
            + (f"resuming from step {resume.step}" if resume else "starting fresh"),
            flush=True,
        )
    state = loop.run()
    weights = gather_weights()
    output = Path(spec["output_dir"])
    if runtime.is_main:
        output.mkdir(parents=True, exist_ok=True)
        write_output(output, weights)
    runtime.barrier()
    return {
        "path": str(output.resolve()), "artifact": artifact,
        "parameters": trainable if artifact == "adapter" else parameters,
        "final_loss": state.last_loss, "steps": state.step, "tokens": state.tokens_seen,
        **(extra_done or {}),
    }
