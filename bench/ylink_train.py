"""Training throughput: the platform's runner against a plain transformers Trainer loop.

Both train the same model (the `small` GPT-2 preset, ~6.4M parameters with the byte
vocabulary) from the same initial weights on the same packed token windows (a generated corpus
tokenized by datatrove into shards), with the same batch size, sequence length, optimizer
(fused AdamW, clipping at 1.0, warmup + cosine), fp32 on CPU and the same number of threads.
The runner runs as the job would (`python -m ylink.runners.train`, events on stdout); the
Trainer has evaluation, logging and saving off. Tokens per second are taken between the end of
a warm-up step and the last step, by each side's own clock, so start-up and the final save do
not count. The two sides alternate (runner, Trainer, runner, Trainer) and each keeps its best
round, which damps the noise of a shared machine.

    .venv/bin/python bench/ylink_train.py [--steps 12] [--rounds 3] [--threads N]

The last line is one JSON object: runner_tokens_s, trainer_tokens_s, ratio (runner / trainer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PRESET = "small"
ARCHITECTURE = "gpt2"


def _threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    for name in ("OGAI_URL", "OGAI_RUN_TOKEN", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    return env


def prepare_data(work: Path, seq_len: int) -> Path:
    from ylink.runners.samples import sample_corpus, write_token_dataset

    data = work / "tokens"
    meta = write_token_dataset(sample_corpus(1500, seed=1), data, seq_len=seq_len)
    print(f"data: {meta['documents']} documents, {meta['tokens']:,} tokens in byte-level shards "
          f"(seq_len {seq_len})", flush=True)
    return data


def runner_spec(out: Path, data: Path, args) -> dict:
    """The pretraining run both benches time: the `small` preset on the byte-level shards."""
    return {
        "run": 1, "kind": "pretrain", "data": {"path": str(data), "format": "tokens"},
        "output_dir": str(out),
        "model": {"preset": PRESET, "architecture": ARCHITECTURE, "context_length": args.seq_len},
        "training": {"max_steps": args.steps, "batch_size": args.batch_size, "grad_accum": 1,
                     "lr": 1e-3, "warmup_steps": 2, "weight_decay": 0.1,
                     "checkpoint_every": args.steps, "log_every": 1, "seed": 0,
                     "precision": "fp32"},
    }


def runner_tokens_s(stdout: str, args) -> float:
    """Tokens per second between the end of the warm-up steps and the last step, by the
    runner's own clock (its metric events on stdout)."""
    from datetime import datetime

    metrics = {}
    for line in stdout.splitlines():
        if line.startswith("OGAI-EVENT "):
            event = json.loads(line[len("OGAI-EVENT "):])
            if event["kind"] == "metric":
                at = datetime.fromisoformat(event["at"]).timestamp()
                metrics[event["data"]["step"]] = (at, event["data"]["tokens"])
    first, last = metrics[args.warmup], metrics[args.steps]
    return (last[1] - first[1]) / (last[0] - first[0])


def run_runner(work: Path, data: Path, args, round_no: int) -> float:
    spec_path = work / f"runner-{round_no}.json"
    spec_path.write_text(json.dumps(runner_spec(work / f"runner-{round_no}", data, args)))
    env = child_env(args.threads)
    env["OGAI_CHECKPOINT_DIR"] = str(work / f"runner-{round_no}-checkpoints")
    result = subprocess.run(  # noqa: S603 - our own runner, fixed arguments
        [sys.executable, "-m", "ylink.runners.train", "--spec", str(spec_path)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"runner failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return runner_tokens_s(result.stdout, args)


def run_trainer(work: Path, data: Path, args, round_no: int) -> float:
    result = subprocess.run(  # noqa: S603 - this script, fixed arguments
        [sys.executable, str(Path(__file__).resolve()), "--trainer-child", "--data", str(data),
         "--work", str(work / f"trainer-{round_no}"), "--steps", str(args.steps),
         "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
         "--warmup", str(args.warmup), "--threads", str(args.threads)],
        cwd=REPO, env=child_env(args.threads), capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"trainer failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["tokens_s"]


def trainer_child(args) -> None:
    """The baseline: transformers.Trainer on the same model, windows and settings."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from ylink.runners.training.common import build_config
    from ylink.runners.training.data import SampleOrder, TokenWindows, read_token_meta

    meta = read_token_meta(args.data)
    windows = TokenWindows(args.data, args.seq_len + 1, int(meta["token_size"]))
    order = SampleOrder(len(windows), 0)
    count = args.steps * args.batch_size

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return count

        def __getitem__(self, index):
            ids = windows.window(order(index))[:-1]
            return {"input_ids": ids, "labels": ids}

    def collate(items):
        ids = torch.stack([item["input_ids"] for item in items])
        return {"input_ids": ids, "labels": ids.clone()}

    torch.manual_seed(0)
    config = build_config(ARCHITECTURE, PRESET, int(meta["vocab_size"]), args.seq_len,
                          int(meta["eos_id"]))
    model = AutoModelForCausalLM.from_config(config)
    times: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, _control, **_kwargs):
            times[state.global_step] = time.perf_counter()

    training_args = TrainingArguments(
        output_dir=args.work, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1, learning_rate=1e-3, warmup_steps=2,
        lr_scheduler_type="cosine", weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
        max_grad_norm=1.0, eval_strategy="no", save_strategy="no", logging_strategy="no",
        report_to=[], disable_tqdm=True, dataloader_num_workers=0, use_cpu=True, seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=Windows(),
                      data_collator=collate, callbacks=[Clock()])
    trainer.train()
    tokens = (args.steps - args.warmup) * args.batch_size * args.seq_len
    print(json.dumps({"tokens_s": tokens / (times[args.steps] - times[args.warmup])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="steps not timed")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=_threads())
    parser.add_argument("--trainer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer_child:
        trainer_child(args)
        return

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ylink-train-bench-") as tmp:
        work = Path(tmp)
        data = prepare_data(work, args.seq_len)
        print(f"model: {ARCHITECTURE} preset {PRESET}; batch {args.batch_size} x {args.seq_len} "
              f"tokens, {args.steps} steps ({args.warmup} untimed), fp32 on CPU, "
              f"{args.threads} threads", flush=True)
        runner, trainer = [], []
        for round_no in range(1, args.rounds + 1):
            runner.append(run_runner(work, data, args, round_no))
            print(f"round {round_no}: runner  {runner[-1]:8.0f} tokens/s", flush=True)
            trainer.append(run_trainer(work, data, args, round_no))
            print(f"round {round_no}: Trainer {trainer[-1]:8.0f} tokens/s", flush=True)
    best_runner, best_trainer = max(runner), max(trainer)
    print(f"runner {best_runner:.0f} tokens/s vs Trainer {best_trainer:.0f} tokens/s: "
          f"{best_runner / best_trainer:.2f}x (best of {args.rounds}; "
          f"{time.perf_counter() - began:.0f} s in all)", flush=True)
    print(json.dumps({
        "runner_tokens_s": round(best_runner, 1), "trainer_tokens_s": round(best_trainer, 1),
        "ratio": round(best_runner / best_trainer, 3), "runner_rounds": [round(v) for v in runner],
        "trainer_rounds": [round(v) for v in trainer], "preset": PRESET,
        "architecture": ARCHITECTURE, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "steps": args.steps, "threads": args.threads, "precision": "fp32", "device": "cpu",
    }))


if __name__ == "__main__":
    main()
