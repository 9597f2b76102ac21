"""Training runner: `python -m ylink.runners.train --spec PATH` (also under torchrun).

Kinds: `tokenizer` (ByteLevel BPE), `pretrain` (GPT-2/Llama from a preset on token shards),
`sft` and `lora` (on an instruction dataset, from a model `pretrain` saved). Reports go to the
platform through `Reporter` (rank 0 only) and to stdout as `OGAI-EVENT {json}` lines.
Exit codes: 0 done, 1 failed, 2 bad spec or input, 143 stopped by SIGTERM (checkpoint saved).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

from ylink.presets import SpecError, validate_train_spec
from ylink.runners.report import Reporter

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED = 143

# Nothing at run time may reach the network: models and tokenizers are local paths.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def _one_line(message: str) -> str:
    return " ".join(str(message).split())[:2000]


def _fail(reporter: Any, rank: int, message: str, code: int) -> int:
    message = _one_line(message)
    print(f"ylink.runners.train: {message}", file=sys.stderr, flush=True)
    if rank != 0:  # other ranks report nothing else, but a failure they can explain counts
        reporter = Reporter.from_env()
    reporter.send("failed", message=message)
    reporter.close()
    return code


def run(spec: dict[str, Any], reporter: Any) -> dict[str, Any] | None:
    """Run a validated spec; the `done` output on the main rank, None on the others."""
    kind = spec["kind"]
    if kind == "tokenizer":
        if _rank() != 0:
            return None  # one process trains a tokenizer; other replicas have nothing to do
        from ylink.runners.training.tokenizer import train_tokenizer

        return train_tokenizer(spec, reporter)
    from transformers.utils import logging as hf_logging

    from ylink.runners.training.runtime import start_runtime, stop_runtime

    hf_logging.disable_progress_bar()  # job logs want events, not progress bars
    runtime = start_runtime()
    try:
        if kind == "pretrain":
            from ylink.runners.training.pretrain import run_pretrain

            output = run_pretrain(spec, runtime, reporter)
        else:
            from ylink.runners.training.finetune import run_finetune

            output = run_finetune(spec, runtime, reporter)
        return output if runtime.is_main else None
    finally:
        stop_runtime(runtime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ylink.runners.train", description=__doc__)
    parser.add_argument("--spec", required=True, help="path of the train spec JSON file")
    args = parser.parse_args(argv)
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)

    rank = _rank()
    reporter = Reporter.from_env(enabled=rank == 0)
    try:
        with open(args.spec, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        return _fail(reporter, rank, f"cannot read spec {args.spec}: {exc}", EXIT_BAD_INPUT)
    try:
        spec = validate_train_spec(raw)
    except SpecError as exc:
        problems = "; ".join(f"{key}: {message}" for key, message in exc.errors.items())
        return _fail(reporter, rank, f"bad spec: {problems}", EXIT_BAD_INPUT)

    from ylink.runners.training.loop import Stopped
    from ylink.runners.training.runtime import TrainError

    try:
        output = run(spec, reporter)
    except TrainError as exc:
        return _fail(reporter, rank, exc.message, exc.exit_code)
    except Stopped as exc:
        print(f"ylink.runners.train: {exc}", file=sys.stderr, flush=True)
        reporter.close()
        return EXIT_STOPPED
    except Exception as exc:
        traceback.print_exc()
        return _fail(reporter, rank, f"{type(exc).__name__}: {exc}", EXIT_FAILED)
    if output is not None:
        reporter.send("done", output=output)
    reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
