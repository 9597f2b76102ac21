"""Where a training process runs: its rank among the replicas, its device, its precision.

Replicas get torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); with
WORLD_SIZE > 1 the process group starts from them (nccl on CUDA, gloo on CPU).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class TrainError(Exception):
    """A failure the runner can explain in one line (reported as a `failed` event).

    `exit_code` 2 marks bad input (spec, paths, data that does not fit the spec)."""

    def __init__(self, message: str, *, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank passes True."""
        if not self.distributed:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def broadcast_object(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise TrainError(f"environment variable {name}={value!r} is not an integer") from None


def local_world_size(world_size: int) -> int:
    """How many replicas share this machine (to split its CPU cores between them)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return max(1, _env_int("LOCAL_WORLD_SIZE", 1))
    if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost", "::1"):
        return world_size
    return 1


def start_runtime() -> Runtime:
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank if local_world_size(world_size) > 1 else 0)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
                os.cpu_count() or 1
            )
            torch.set_num_threads(max(1, cores // local_world_size(world_size)))
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world_size,
            timeout=timedelta(minutes=_env_int("OGAI_DIST_TIMEOUT_MIN", 30)), **kwargs,
        )
    return Runtime(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def stop_runtime(runtime: Runtime) -> None:
    if runtime.distributed and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def compute_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32. "auto" = bf16 where the GPU supports it."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise TrainError("training.precision bf16: this GPU does not support bfloat16",
                             exit_code=2)
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def precision_name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"
