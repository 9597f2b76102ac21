"""The optimisation loop every trained kind shares: accumulation, precision, clipping, warmup +
cosine LR, metrics, checkpoints and resume, stop on SIGTERM.

The loss of a step is the sum of token losses over the whole global batch (every micro-batch of
every replica) divided by its number of labelled tokens, so 1 replica x batch 8, 2 replicas x
batch 4 and 1 replica x batch 4 x 2 accumulations take the same step.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.data import IGNORE_INDEX, Batch, rank_counters
from ylink.runners.training.runtime import Runtime, autocast

OPTIMIZER_FILE = "optimizer.pt"
TRAINER_FILE = "trainer_state.pt"
MIN_LR_RATIO = 0.1


class Stopped(Exception):
    """SIGTERM arrived; a checkpoint of the last finished step was written."""

    def __init__(self, step: int):
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint saved")
        self.step = step


@dataclass
class LoopState:
    step: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    last_loss: float | None = None


@dataclass
class Loop:
    runtime: Runtime
    model: torch.nn.Module  # as wrapped for training (DDP/FSDP) or plain
    training: dict[str, Any]  # the validated spec's "training" section
    make_batch: Callable[[list[int]], Batch]  # sample counters -> batch (this replica's share)
    gather_weights: Callable[[], Any]  # collective: what write_weights needs
    write_weights: Callable[[Path, Any], None]  # main rank only
    store: CheckpointStore
    reporter: Any
    kind: str
    mode: str = "none"  # "none" | "ddp" | "fsdp"
    dtype: torch.dtype | None = None
    extra_state: dict[str, Any] = field(default_factory=dict)  # into every checkpoint's state
    state: LoopState = field(default_factory=LoopState)
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    _stop: bool = False
    _last_saved: int = -1

    # ------------------------------------------------------------------------------ set-up

    def build_optimizer(self) -> None:
        cfg = self.training
        decay, no_decay = [], []
        for param in self.model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
                  {"params": no_decay, "weight_decay": 0.0}]
        kwargs: dict[str, Any] = {"lr": cfg["lr"], "betas": (0.9, 0.95), "eps": 1e-8}
        if self.mode != "fsdp":
            kwargs["fused"] = True  # one kernel per step on CPU and CUDA alike
        self.optimizer = torch.optim.AdamW(groups, **kwargs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)

    def _lr_factor(self, step: int) -> float:
        warmup, total = self.training["warmup_steps"], self.training["max_steps"]
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))

    def resume(self, path: Path, state: dict[str, Any]) -> None:
        """Load optimizer, scheduler, RNG and counters of a checkpoint (model weights are loaded
        by the kind before wrapping)."""
        assert self.optimizer is not None and self.scheduler is not None
        rt = self.runtime
        fsdp = self.mode == "fsdp"
        optim_state = {}
        if rt.is_main or not fsdp:
            optim_state = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(
            self.model, self.optimizer, optim_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=fsdp),
        )
        trainer = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=True)
        self.scheduler.load_state_dict(trainer["scheduler"])
        rng = trainer.get("rng") or []
        if len(rng) == rt.world_size:
            _set_rng_state(rng[rt.rank])
        else:  # the replica count changed: a fresh but deterministic stream per replica
            torch.manual_seed(self.training["seed"] + 7919 * rt.rank + state["step"])
        self.state = LoopState(
            step=int(state["step"]), samples_seen=int(state["samples_seen"]),
            tokens_seen=int(state["tokens_seen"]), last_loss=state.get("last_loss"),
        )
        self._last_saved = self.state.step

    # ------------------------------------------------------------------------------ running

    def _request_stop(self, _signum, _frame) -> None:
        self._stop = True

    def run(self) -> LoopState:
        assert self.optimizer is not None and self.scheduler is not None
        rt, cfg, st = self.runtime, self.training, self.state
        max_steps = cfg["max_steps"]
        previous = None
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            previous = signal.signal(signal.SIGTERM, self._request_stop)
        try:
            self._run(rt, cfg, st, max_steps)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return st

    def _run(self, rt: Runtime, cfg: dict[str, Any], st: LoopState, max_steps: int) -> None:
        self.model.train()
        device = rt.device
        world = rt.world_size
        batch_size, accum = cfg["batch_size"], cfg["grad_accum"]
        started_at = time.perf_counter()
        steps_this_attempt = 0
        interval_start = time.perf_counter()
        interval_pause = 0.0
        interval_loss = torch.zeros((), dtype=torch.float64, device=device)
        interval_labels = 0
        interval_tokens = 0
        interval_steps = 0
        grad_norm: torch.Tensor | None = None
        lr = cfg["lr"]
        while st.step < max_steps:
            if rt.any(self._stop):
                if self._last_saved != st.step:
                    self.save_checkpoint()
                raise Stopped(st.step)
            micro_counters = rank_counters(
                st.samples_seen, rank=rt.rank, world_size=world, batch_size=batch_size,
                grad_accum=accum,
            )
            batches = [self.make_batch(counters) for counters in micro_counters]
            labels_total = sum(int((b.labels != IGNORE_INDEX).sum()) for b in batches)
            tokens_total = sum(b.tokens for b in batches)
            if rt.distributed:  # the loss is normalised by the labelled tokens of all replicas
                counts = torch.tensor([labels_total, tokens_total], dtype=torch.float64,
                                      device=device)
                labels_total, tokens_total = (int(v) for v in rt.all_reduce_sum(counts).tolist())
            scale = world / max(1, labels_total)
            step_loss = torch.zeros((), dtype=torch.float64, device=device)
            for index, batch in enumerate(batches):
                last = index == len(batches) - 1
                with self._sync_gradients(last):
                    loss_sum = self._forward(batch)
                    (loss_sum * scale).backward()
                step_loss += loss_sum.detach().double()
            if cfg["max_grad_norm"] > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], cfg["max_grad_norm"]
                )
            lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)

            st.step += 1
            steps_this_attempt += 1
            st.samples_seen += batch_size * accum * world
            st.tokens_seen += tokens_total
            interval_loss += step_loss
            interval_labels += labels_total
            interval_tokens += tokens_total
            interval_steps += 1

            if st.step % cfg["log_every"] == 0 or st.step == max_steps:
                loss = float(rt.all_reduce_sum(interval_loss.clone()).item()) / max(
                    1, interval_labels
                )
                st.last_loss = loss
                now = time.perf_counter()
                seconds = max(1e-9, now - interval_start - interval_pause)
                tokens_per_s = interval_tokens / seconds
                elapsed = now - started_at
                eta = (max_steps - st.step) * elapsed / max(1, steps_this_attempt)
                if rt.is_main:
                    metric = {"step": st.step, "loss": round(loss, 6), "lr": lr,
                              "tokens": st.tokens_seen, "tokens_per_s": round(tokens_per_s, 1)}
                    if grad_norm is not None:
                        metric["grad_norm"] = round(float(_full(grad_norm)), 6)
                    self.reporter.send("metric", **metric)
                    self.reporter.send(
                        "progress", step=st.step, total_steps=max_steps, tokens=st.tokens_seen,
                        tokens_per_s=round(tokens_per_s, 1), eta_s=round(eta, 1),
                        samples_per_s=round(
                            interval_steps * batch_size * accum * world / seconds, 2
                        ),
                    )
                interval_start = time.perf_counter()
                interval_pause = 0.0
                interval_loss.zero_()
                interval_labels = interval_tokens = interval_steps = 0

            if st.step % cfg["checkpoint_every"] == 0 or st.step == max_steps:
                began = time.perf_counter()
                self.save_checkpoint()
                interval_pause += time.perf_counter() - began

    def _forward(self, batch: Batch) -> torch.Tensor:
        device = self.runtime.device
        input_ids = batch.input_ids.to(device, non_blocking=True)
        labels = batch.labels.to(device, non_blocking=True)
        extra = {}
        if batch.task_ids is not None:
            extra["task_ids"] = batch.task_ids.to(device, non_blocking=True)
        with autocast(device, self.dtype):
            logits = self.model(input_ids=input_ids, use_cache=False, **extra).logits
        # Prompt tuning prepends its virtual tokens' positions: score the input's own.
        logits = logits[:, logits.shape[1] - labels.shape[1]:]
        return F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction="sum",
        )

    def _sync_gradients(self, sync: bool):
        """Replicas average gradients only on the last micro-batch of a step."""
        if sync or self.mode == "none":
            if self.mode == "fsdp":
                self.model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self.mode == "fsdp":
            self.model.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        return self.model.no_sync()

    # ------------------------------------------------------------------------------ saving

    def save_checkpoint(self) -> None:
        assert self.optimizer is not None and self.scheduler is not None
        rt, st = self.runtime, self.state
        fsdp = self.mode == "fsdp"
        weights = self.gather_weights()
        optim_state = get_optimizer_state_dict(
            self.model, self.optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=fsdp),
        )
        rng = rt.gather_objects(_rng_state())
        if rt.is_main:
            # Every step up to this checkpoint reaches the platform before the checkpoint
            # exists: a resumed attempt starts after it and never reports those steps again.
            # An unreachable platform delays this by the timeout, then gets them later.
            self.reporter.flush(timeout=CHECKPOINT_FLUSH_S)
            scheduler_state = self.scheduler.state_dict()

            def write(directory: Path) -> None:
                self.write_weights(directory, weights)
                torch.save(optim_state, directory / OPTIMIZER_FILE)
                torch.save({"scheduler": scheduler_state, "rng": rng}, directory / TRAINER_FILE)

            path, size = self.store.save(st.step, write, {
                **self.extra_state, "kind": self.kind, "samples_seen": st.samples_seen,
                "tokens_seen": st.tokens_seen, "last_loss": st.last_loss,
                "world_size": rt.world_size, "max_steps": self.training["max_steps"],
            })
            self.reporter.send("checkpoint", step=st.step, path=str(path.resolve()), bytes=size)
        self._last_saved = st.step
        rt.barrier()


CHECKPOINT_FLUSH_S = 5.0


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
