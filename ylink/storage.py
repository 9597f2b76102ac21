"""Where YLink keeps its files under DATA_DIR, and reading dataset versions back: statistics,
content hashes and sample documents. Versions are folders of JSONL documents or token shards
(the formats in `ylink.runners`), never changed once recorded."""

import hashlib
import json
import math
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

# Document lengths in characters are counted in bins of powers of two: 1, 2-3, 4-7, …
HISTOGRAM_BINS = 24


def data_root() -> Path:
    return Path(settings.DATA_DIR)


def absolute(relative: str) -> Path:
    return data_root() / relative


def relative(path: Path) -> str:
    return str(path.resolve().relative_to(data_root().resolve()))


def staging_folder() -> Path:
    """A fresh folder for files not yet recorded; removed on any failure, renamed on success."""
    folder = data_root() / "datasets" / ".staging" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    return folder


def version_folder(*, tenant: str, dataset_id: int, dataset: str, number: int,
                   content_hash: str) -> Path:
    return (data_root() / "datasets" / tenant / f"{dataset_id}-{dataset}"
            / f"v{number}-{content_hash[:12]}")


def run_folder(kind: str, pk: int, created_at) -> Path:
    """A pipeline or training run's spec, scratch files and result. Named by id and creation
    time, so a database started afresh never reuses an old run's files."""
    return data_root() / "ylink" / kind / f"{pk}-{created_at:%Y%m%dT%H%M%S%f}"


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class DocumentStats:
    """Counts documents and bytes and a histogram of lengths as documents stream past."""

    def __init__(self) -> None:
        self.documents = 0
        self.bytes = 0
        self.chars = 0
        self.shortest: int | None = None
        self.longest = 0
        self.bins = [0] * HISTOGRAM_BINS

    def add(self, text: str, size: int) -> None:
        length = len(text)
        self.documents += 1
        self.bytes += size
        self.chars += length
        self.shortest = length if self.shortest is None else min(self.shortest, length)
        self.longest = max(self.longest, length)
        self.bins[min(HISTOGRAM_BINS - 1, int(math.log2(length)) + 1 if length else 0)] += 1

    def summary(self) -> dict:
        last = max((i for i, n in enumerate(self.bins) if n), default=0)
        return {
            "chars": self.chars,
            "shortest_chars": self.shortest or 0,
            "longest_chars": self.longest,
            "mean_chars": round(self.chars / self.documents, 1) if self.documents else 0,
            # Bin i holds lengths from 2**(i-1) (0 for i = 0) up to 2**i - 1 characters.
            "length_histogram": [
                {"from": 0 if i == 0 else 2 ** (i - 1), "to": 0 if i == 0 else 2**i - 1,
                 "documents": self.bins[i]}
                for i in range(last + 1)
            ],
        }


def document_files(folder: Path) -> list[Path]:
    # Links are never followed: a version's files are its own.
    return sorted(p for p in folder.rglob("*.jsonl") if not p.is_symlink() and p.is_file())


def content_hash(files: list[Path], root: Path) -> str:
    """SHA-256 over the files' names (relative to the version) and contents, in name order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def scan_documents(folder: Path) -> tuple[DocumentStats, str]:
    """Statistics and content hash of a folder of JSONL documents (a pipeline's output)."""
    stats = DocumentStats()
    files = document_files(folder)
    for path in files:
        with path.open("rb") as stream:
            for line in stream:
                if line.strip():
                    text = json.loads(line).get("text", "")
                    stats.add(text, len(text.encode()))
    return stats, content_hash(files, folder)


def token_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_symlink() and p.is_file())


def iter_documents(folder: Path, fmt: str) -> Iterator[dict]:
    """The version's documents in a stable order: {"id", "text", "metadata"}."""
    if fmt == "tokens":
        from ylink.runners.shards import decode_documents

        for index, text in enumerate(decode_documents(folder)):
            yield {"id": str(index), "text": text, "metadata": {}}
        return
    for path in document_files(folder):
        with path.open("rb") as stream:
            for line in stream:
                if line.strip():
                    yield json.loads(line)


def read_samples(folder: Path, fmt: str, *, offset: int, limit: int,
                 max_chars: int = 4000) -> list[dict]:
    samples: list[dict] = []
    for index, document in enumerate(iter_documents(folder, fmt)):
        if index < offset:
            continue
        if len(samples) >= limit:
            break
        text = document.get("text", "")
        samples.append({
            "index": index, "id": str(document.get("id", index)), "chars": len(text),
            "text": text[:max_chars], "truncated": len(text) > max_chars,
            "metadata": {k: v for k, v in (document.get("metadata") or {}).items()
                         if k in ("prompt", "response", "source")},
        })
    return samples
