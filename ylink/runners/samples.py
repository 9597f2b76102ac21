"""Small generated datasets in the platform's storage formats, for tests and benchmarks.

`sample_corpus`: sentences drawn from small word lists (so a tiny model has something to
learn); `synthetic_corpus`: English-like documents with planted exact and near duplicates,
personal data and junk (so a cleaning pipeline has something to remove); token datasets are
written with datatrove's own `DocumentTokenizer`, exactly as the `tokenize` step writes them.
No Django here.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird",
             "the teacher", "our neighbour", "the farmer", "a young girl"]
_VERBS = ["sees", "likes", "finds", "carries", "paints", "follows", "feeds", "watches",
          "builds", "cleans"]
_OBJECTS = ["the red ball", "a green box", "the big house", "a wooden chair", "the blue car",
            "an apple", "the garden", "a long letter", "the river", "a warm coat"]
_PLACES = ["in the morning", "at night", "near the school", "after lunch", "in the park",
           "by the sea", "on monday", "before dinner"]


def sample_corpus(documents: int, *, seed: int = 0, sentences: tuple[int, int] = (3, 8)
                  ) -> list[str]:
    rng = random.Random(seed)  # noqa: S311 - sample text, not secrets
    texts = []
    for _ in range(documents):
        parts = []
        for _ in range(rng.randint(*sentences)):
            parts.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} "
                         f"{rng.choice(_OBJECTS)} {rng.choice(_PLACES)}.")
        texts.append(" ".join(parts).capitalize())
    return texts


def sample_instructions(count: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Records of an instruction dataset: metadata.prompt / metadata.response."""
    rng = random.Random(seed)  # noqa: S311
    records = []
    for index in range(count):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        prompt, response = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        records.append({"id": f"q{index}", "text": f"{prompt}\n{response}",
                        "metadata": {"prompt": prompt, "response": response}})
    return records


def write_jsonl(directory: str | Path, records: Iterable[dict[str, Any] | str],
                name: str = "part-00000.jsonl") -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / name).open("w", encoding="utf-8") as handle:
        for index, record in enumerate(records):
            if isinstance(record, str):
                record = {"id": str(index), "text": record, "metadata": {}}
            handle.write(json.dumps(record) + "\n")
    return directory


def write_token_dataset(
    texts: Iterable[str], directory: str | Path, *, seq_len: int,
    tokenizer_json: str | Path | None = None, seed: int = 0,
) -> dict[str, Any]:
    """Tokenize `texts` into a token dataset version directory; return its meta.json."""
    from datatrove.data import Document
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer
    from tokenizers import Tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "tokenizer.json"
    if tokenizer_json is None:
        from ylink.runners.shards import byte_tokenizer

        byte_tokenizer().save(str(target))
    else:
        shutil.copyfile(tokenizer_json, target)
    tokenizer = Tokenizer.from_file(str(target))
    step = DocumentTokenizer(
        output_folder=str(directory), tokenizer_name_or_path=str(target), eos_token=EOS_TOKEN,
        seed=seed, save_filename="shard",
    )
    documents = [Document(text=text, id=str(index)) for index, text in enumerate(texts)]
    result = step.run(iter(documents), rank=0, world_size=1)
    if result is not None:  # a generator step: drain it
        for _ in result:
            pass
    total = sum(path.stat().st_size for path in directory.glob("*.ds")) // step.token_size
    meta = {"seq_len": seq_len, "eos_id": tokenizer.token_to_id(EOS_TOKEN),
            "vocab_size": tokenizer.get_vocab_size(), "token_size": step.token_size,
            "documents": len(documents), "tokens": total}
    (directory / "meta.json").write_text(json.dumps(meta))
    return meta


# -- documents with planted duplicates, personal data and junk ---------------------------------
_STOP = ("the", "be", "to", "of", "and", "that", "have", "with", "a", "in", "it", "for", "on",
         "as", "was", "by", "at", "from", "this", "is", "are", "or", "an", "which")
_WORD_TEXT = """
river mountain village harbor lantern garden market winter summer autumn spring morning evening
teacher student farmer sailor merchant painter doctor builder baker writer soldier traveler
bridge castle forest meadow valley island desert canyon glacier volcano orchard vineyard
window doorway kitchen library chapel tavern workshop station factory museum theater stadium
silver golden copper wooden marble crystal velvet cotton leather paper iron stone
quietly slowly gently bravely eagerly softly loudly warmly rarely often always sometimes
carried painted gathered followed watched remembered discovered wandered promised answered
wonder journey letter story season harvest thunder whisper shadow silence feather candle
ancient distant narrow crowded peaceful golden bitter gentle hollow humble restless steady
measure balance pattern signal method theory engine circuit network machine sensor battery
planet comet orbit galaxy telescope compass lighthouse anchor voyage current tide coastline
cabbage barley pepper ginger honey butter cheese bread apple cherry lemon walnut almond
council village citizen festival parade ceremony tradition language history culture memory
"""
_WORDS = tuple(_WORD_TEXT.split())


def _sentence(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(8, 16)):
        words.append(rng.choice(_STOP) if rng.random() < 0.3 else rng.choice(_WORDS))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(".....!?")


def _clean_text(rng: random.Random, lines: tuple[int, int] = (4, 7)) -> str:
    return "\n".join(
        " ".join(_sentence(rng) for _ in range(rng.randint(2, 4)))
        for _ in range(rng.randint(*lines))
    )


def _near_duplicate(rng: random.Random, text: str, fraction: float) -> str:
    lines = [line.split(" ") for line in text.split("\n")]
    places = [(i, j) for i, words in enumerate(lines) for j in range(len(words))]
    for i, j in rng.sample(places, max(1, round(len(places) * fraction))):
        word = lines[i][j]
        tail = word[-1] if word[-1] in ".!?" else ""
        replacement = rng.choice(_WORDS)
        lines[i][j] = (replacement.capitalize() if word[0].isupper() else replacement) + tail
    return "\n".join(" ".join(words) for words in lines)


def synthetic_corpus(n_clean: int = 200, *, seed: int = 0, exact_dups: int = 0,
                     near_dups: int = 0, near_fraction: tuple[float, float] = (0.02, 0.05),
                     pii: int = 0, junk: int = 0, js_lines: int = 0) -> list[dict]:
    """English-like documents built from a word list (no download), with planted cases.

    Each record is {"id", "text", "metadata": {"kind": ...}} with kind one of `clean`,
    `exact_dup`, `near_dup` (metadata.of names the original), `pii` (metadata.secrets lists the
    planted emails, IPs and phones), `junk` (metadata.junk says which), `js_line` (a clean
    document with a javascript notice line, which C4 rules remove; metadata.clean is the text
    expected after). Duplicates come after their originals."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    records: list[dict] = []
    for i in range(n_clean):
        records.append({"id": f"clean-{i}", "text": _clean_text(rng),
                        "metadata": {"kind": "clean"}})
    originals = [r for r in records if r["metadata"]["kind"] == "clean"]
    for i in range(pii):
        email = f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}{i}@{rng.choice(_WORDS)}-mail.com"
        public_ip = f"{rng.randint(11, 99)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}." \
                    f"{rng.randint(1, 254)}"
        private_ip = f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        area, mid, last = rng.randint(200, 989), rng.randint(200, 999), rng.randint(1000, 9999)
        phone = rng.choice([f"({area}) {mid}-{last}", f"{area}-{mid}-{last}",
                            f"+1 {area} {mid} {last}", f"{area}.{mid}.{last}",
                            f"+44 20 {mid}{last % 10} {last}"])
        lines = _clean_text(rng).split("\n")
        lines.insert(1, f"You can write to {email} or call {phone} for the schedule today.")
        lines.append(f"The old server at {public_ip} and the router {private_ip} are offline now.")
        records.append({"id": f"pii-{i}", "text": "\n".join(lines),
                        "metadata": {"kind": "pii",
                                     "secrets": [email, phone, public_ip, private_ip]}})
    for i in range(js_lines):
        clean = _clean_text(rng)
        lines = clean.split("\n")
        lines.insert(2, "Please enable JavaScript in your browser to see the full page.")
        records.append({"id": f"js-{i}", "text": "\n".join(lines),
                        "metadata": {"kind": "js_line", "clean": clean}})
    junk_kinds = ["short", "repetitive", "symbols", "lorem", "code"]
    for i in range(junk):
        kind = junk_kinds[i % len(junk_kinds)]
        if kind == "short":
            text = "Buy now. Click here to subscribe."
        elif kind == "repetitive":
            text = "\n".join([_sentence(rng)] * 25)
        elif kind == "symbols":
            text = " ".join("".join(rng.choice("#$%&*@!~^+=<>|/\\{}[]") for _ in range(
                rng.randint(2, 6))) for _ in range(120))
        elif kind == "lorem":
            lines = _clean_text(rng).split("\n")
            lines.insert(1, "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do.")
            text = "\n".join(lines)
        else:
            text = "\n".join(
                f"function handler{j}(event) {{ var node = document.getElementById('item{j}'); "
                f"node.style.display = 'none'; return false; }}" for j in range(12))
        records.append({"id": f"junk-{i}", "text": text,
                        "metadata": {"kind": "junk", "junk": kind}})
    for i in range(exact_dups):
        original = originals[i % len(originals)]
        records.append({"id": f"exact-{i}", "text": original["text"],
                        "metadata": {"kind": "exact_dup", "of": original["id"]}})
    for i in range(near_dups):
        original = originals[(i * 7 + 3) % len(originals)]
        fraction = rng.uniform(*near_fraction)
        records.append({"id": f"near-{i}", "text": _near_duplicate(rng, original["text"],
                                                                  fraction),
                        "metadata": {"kind": "near_dup", "of": original["id"],
                                     "fraction": round(fraction, 4)}})
    return records


def write_corpus(records: list[dict], directory: str | Path, files: int = 2) -> list[Path]:
    """Writes records into `files` JSONL files of consecutive records (input order is kept)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"part-{i:03d}.jsonl" for i in range(files)]
    chunks: list[list[str]] = [[] for _ in range(files)]
    per_file = -(-len(records) // files)
    for position, record in enumerate(records):
        chunks[position // per_file].append(json.dumps(record))
    for path, lines in zip(paths, chunks, strict=True):
        path.write_text("".join(line + "\n" for line in lines))
    return paths
