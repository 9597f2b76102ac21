"""Kind `tokenizer`: a ByteLevel BPE tokenizer trained on a document dataset."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ylink.runners.training.common import EOS_TOKEN, attempt_number, save_tokenizer_files
from ylink.runners.training.data import iter_texts
from ylink.runners.training.runtime import TrainError


def new_byte_level_bpe() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def train_tokenizer(spec: dict[str, Any], reporter: Any) -> dict[str, Any]:
    settings = spec["tokenizer"]
    output = Path(spec["output_dir"])
    reporter.send("started", attempt=attempt_number(), world_size=1, resumed_from_step=None)
    began = time.perf_counter()
    counts = {"documents": 0, "bytes": 0}

    def texts():
        for text in iter_texts(spec["data"]["path"]):
            counts["documents"] += 1
            counts["bytes"] += len(text.encode("utf-8"))
            yield text

    tokenizer = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=settings["vocab_size"], min_frequency=settings["min_frequency"],
        special_tokens=[EOS_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts(), trainer)
    if counts["documents"] == 0:
        raise TrainError(f"data.path {spec['data']['path']} holds no documents with text",
                         exit_code=2)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(output / "tokenizer.json"))
    save_tokenizer_files(tokenizer, output, eos_id=tokenizer.token_to_id(EOS_TOKEN))
    seconds = time.perf_counter() - began
    print(f"tokenizer: {tokenizer.get_vocab_size()} tokens from {counts['documents']} documents "
          f"({counts['bytes'] / 1e6:.1f} MB) in {seconds:.1f} s", flush=True)
    return {
        "path": str(output.resolve()), "artifact": "tokenizer", "parameters": None,
        "final_loss": None, "steps": 0, "tokens": None,
        "vocab_size": tokenizer.get_vocab_size(), "documents": counts["documents"],
        "bytes": counts["bytes"], "eos_id": tokenizer.token_to_id(EOS_TOKEN),
    }
