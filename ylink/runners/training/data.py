"""Reading training data: documents (jsonl), packed token shards, instruction pairs.

Every kind of training sees its data as a list of samples addressed by a global sample counter
(`samples_seen` in the checkpoint). `SampleOrder` maps the counter to a sample index: epoch by
epoch, each a seeded permutation, so a resumed run continues exactly where the last checkpoint
left off, whatever the number of replicas. Within a step, replica r of W takes, for micro-batch m,
the counters `start + (m * W + r) * batch_size + [0, batch_size)`: disjoint shares that together
are what one process with the whole batch would read.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ylink.runners.training.runtime import TrainError

IGNORE_INDEX = -100


def iter_jsonl_records(folder: str | Path) -> Iterator[dict[str, Any]]:
    """Records of every `*.jsonl` file in a dataset version directory, files in name order."""
    root = Path(folder)
    if not root.is_dir():
        raise TrainError(f"data.path {root} is not a directory", exit_code=2)
    files = sorted(root.glob("*.jsonl"))
    if not files:
        raise TrainError(f"data.path {root} holds no *.jsonl files", exit_code=2)
    for path in files:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TrainError(
                        f"{path.name} line {number} is not JSON: {exc.msg}", exit_code=2
                    ) from None
                if isinstance(record, dict):
                    yield record


def iter_texts(folder: str | Path) -> Iterator[str]:
    for record in iter_jsonl_records(folder):
        text = record.get("text")
        if isinstance(text, str) and text:
            yield text


class SampleOrder:
    """Global sample counter -> sample index: a fresh permutation of [0, n) each epoch.

    The permutation is affine (i -> (a*i + b) mod n with gcd(a, n) = 1, a and b drawn from the
    seed and the epoch): it needs no memory however large n is, and consecutive counters land
    far apart in the data.
    """

    def __init__(self, size: int, seed: int):
        if size <= 0:
            raise ValueError("empty dataset")
        self.size = size
        self.seed = seed
        self._epoch = -1
        self._a = 1
        self._b = 0

    def _set_epoch(self, epoch: int) -> None:
        rng = random.Random(self.seed * 1_000_003 + epoch)  # noqa: S311 - data order, not secrets
        n = self.size
        a = 1
        if n > 2:
            while True:
                a = rng.randrange(1, n)
                if math.gcd(a, n) == 1:
                    break
        self._a, self._b, self._epoch = a, rng.randrange(n), epoch

    def __call__(self, counter: int) -> int:
        epoch, index = divmod(counter, self.size)
        if epoch != self._epoch:
            self._set_epoch(epoch)
        return (self._a * index + self._b) % self.size


def rank_counters(
    start: int, *, rank: int, world_size: int, batch_size: int, grad_accum: int
) -> list[list[int]]:
    """Sample counters of one step for one replica: one list per micro-batch."""
    return [
        [start + (micro * world_size + rank) * batch_size + b for b in range(batch_size)]
        for micro in range(grad_accum)
    ]


@dataclass
class Batch:
    """Model input is `input_ids`; position t is trained to predict `labels[:, t]`."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    tokens: int  # real (not padding) input tokens
    task_ids: torch.Tensor | None = None  # multi-task prompt tuning: each row's task index


# ----------------------------------------------------------------------------- token shards


def read_token_meta(folder: str | Path) -> dict[str, Any]:
    root = Path(folder)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise TrainError(f"data.path {root} has no meta.json: not a token dataset", exit_code=2)
    meta = json.loads(meta_path.read_text())
    missing = [key for key in ("seq_len", "eos_id", "vocab_size", "token_size") if key not in meta]
    if missing:
        raise TrainError(f"{meta_path} lacks {', '.join(missing)}", exit_code=2)
    return meta


class TokenWindows:
    """Windows of `length` tokens read back to back from datatrove `.ds` shards."""

    def __init__(self, folder: str | Path, length: int, token_size: int):
        from datatrove.utils.dataset import DatatroveFolderDataset

        try:
            self.dataset = DatatroveFolderDataset(
                str(folder), seq_len=length - 1, filename_pattern="*.ds", recursive=False,
                token_size=token_size,
            )
        except FileNotFoundError:
            raise TrainError(f"data.path {folder} holds no .ds token shards", exit_code=2) from None
        self.length = length
        if len(self.dataset) == 0:
            raise TrainError(
                f"the token shards in {folder} hold no window of {length} tokens", exit_code=2
            )

    def __len__(self) -> int:
        return len(self.dataset)

    def window(self, index: int) -> torch.Tensor:
        return self.dataset[index]["input_ids"]

    def batch(self, indices: list[int]) -> Batch:
        windows = torch.stack([self.window(i) for i in indices])
        return Batch(windows[:, :-1], windows[:, 1:], windows.shape[0] * (self.length - 1))


# ----------------------------------------------------------------------------- instructions


@dataclass
class InstructionSet:
    examples: list[tuple[list[int], list[int]]]  # (token ids, labels) of equal length
    skipped: int
    truncated: int
    # Each example's optional task column (`metadata.task`), None where a record has none.
    tasks: list[str | None] = field(default_factory=list)


def encode_instruction(
    tokenizer: Any, prompt: str, response: str, eos_id: int, max_tokens: int
) -> tuple[list[int], list[int]] | None:
    """Token ids of `prompt + "\\n" + response + EOS` and labels that mask the prompt.

    The prompt part (including the newline) is labelled IGNORE_INDEX, so only response tokens
    and the EOS are learnt. `max_tokens` bounds the whole sequence (the model's context + 1):
    a long prompt is cut from the left, then the response from the right; None when no response
    token would remain.
    """
    prompt_ids = tokenizer.encode(prompt + "\n", add_special_tokens=False)
    response_ids = [*tokenizer.encode(response, add_special_tokens=False), eos_id]
    overflow = len(prompt_ids) + len(response_ids) - max_tokens
    if overflow > 0:
        cut = min(overflow, max(0, len(prompt_ids) - 1))
        prompt_ids = prompt_ids[cut:]
        overflow -= cut
        if overflow > 0:
            response_ids = response_ids[: len(response_ids) - overflow]
    if not response_ids or not prompt_ids:
        return None
    ids = prompt_ids + response_ids
    labels = [IGNORE_INDEX] * len(prompt_ids) + response_ids
    return ids, labels


def load_instructions(
    folder: str | Path, tokenizer: Any, eos_id: int, max_tokens: int
) -> InstructionSet:
    examples = []
    tasks: list[str | None] = []
    skipped = truncated = 0
    for record in iter_jsonl_records(folder):
        metadata = record.get("metadata") or {}
        prompt, response = metadata.get("prompt"), metadata.get("response")
        if not isinstance(prompt, str) or not isinstance(response, str) or not response:
            skipped += 1
            continue
        encoded = encode_instruction(tokenizer, prompt, response, eos_id, max_tokens)
        if encoded is None:
            skipped += 1
            continue
        if encoded[0][-1] != eos_id:
            truncated += 1
        examples.append(encoded)
        task = metadata.get("task")
        tasks.append(str(task) if isinstance(task, (str, int)) and str(task) else None)
    if not examples:
        raise TrainError(
            f"data.path {folder} holds no instruction records (metadata.prompt and "
            f"metadata.response); {skipped} records skipped",
            exit_code=2,
        )
    return InstructionSet(examples, skipped, truncated, tasks)


def collate_instructions(
    examples: list[tuple[list[int], list[int]]], pad_id: int
) -> Batch:
    """Right-padded batch. Padding needs no attention mask: with causal attention no real token
    sees a later position, and padded positions carry IGNORE_INDEX labels."""
    longest = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), longest), IGNORE_INDEX, dtype=torch.long)
    tokens = 0
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        tokens += len(ids) - 1
    return Batch(input_ids[:, :-1], labels[:, 1:], tokens)
