"""Turning an uploaded corpus into a document dataset version's files, streaming.

Accepted: JSONL (one object per line with a `text` field; `prompt` and `response`, and an
optional `task`, for an instruction dataset), plain text (one document per file), or a zip of
those. Everything is checked while it streams into a staging folder: the first problem raises
`UploadError` naming the file and line, and the caller removes the folder, so nothing
half-written stays behind.
"""

import json
import stat
import zipfile
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO

from ogai import json_input
from ylink.choices import DatasetKind
from ylink.storage import DocumentStats

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
# A plain-text file becomes one document, held in memory once: bound it.
MAX_TEXT_DOCUMENT_BYTES = 64 * 2**20
# A JSONL line is parsed whole.
MAX_LINE_BYTES = 64 * 2**20
OUTPUT_FILE = "00000.jsonl"


class UploadError(ValueError):
    pass


def kind_of(name: str) -> str:
    lowered = name.lower()
    if lowered.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if lowered.endswith(TEXT_SUFFIXES):
        return "text"
    if lowered.endswith(".zip"):
        return "zip"
    raise UploadError(f"{name}: upload a .jsonl, .txt (or .md) file, or a .zip of them.")


class _Writer:
    """Writes documents as JSONL into the staging folder, counting as it goes."""

    def __init__(self, folder: Path, dataset_kind: str, max_bytes: int) -> None:
        self.out = (folder / OUTPUT_FILE).open("w", encoding="utf-8")
        self.kind = dataset_kind
        self.max_bytes = max_bytes
        self.read_bytes = 0
        self.stats = DocumentStats()
        self.files: list[dict] = []

    def count_read(self, size: int) -> None:
        # Counted as read, whatever a zip's headers claimed: a zip bomb stops here.
        self.read_bytes += size
        if self.read_bytes > self.max_bytes:
            raise UploadError(f"The corpus is larger than the limit of "
                              f"{self.max_bytes // 2**20} MiB once unpacked.")

    def document(self, *, source: str, number: int, fields: dict) -> None:
        text = fields["text"]
        metadata = {"source": source, **{k: v for k, v in fields.items() if k != "text"}}
        self.out.write(json.dumps({"id": f"{source}:{number}", "text": text,
                                   "metadata": metadata}, ensure_ascii=False) + "\n")
        self.stats.add(text, len(text.encode()))

    def close(self) -> None:
        self.out.close()


def _decode(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UploadError(f"{where}: not UTF-8 text (byte {error.start}).") from None
    if "\x00" in text:
        raise UploadError(f"{where}: holds NUL bytes; this is not a text file.")
    return text


def _fields(obj, where: str, dataset_kind: str) -> dict:
    if not isinstance(obj, dict):
        raise UploadError(f"{where}: each line must be a JSON object.")
    if dataset_kind == DatasetKind.INSTRUCTION:
        for key in ("prompt", "response"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise UploadError(f"{where}: an instruction dataset needs a non-empty string "
                                  f"'{key}' on every line.")
        fields = {"text": f"{obj['prompt']}\n{obj['response']}", "prompt": obj["prompt"],
                  "response": obj["response"]}
        task = obj.get("task")  # optional: multi-task prompt tuning trains a prompt per task
        if task is not None:
            if not isinstance(task, str) or not task.strip() or len(task) > 200:
                raise UploadError(f"{where}: 'task' must be a non-empty string of at most 200 "
                                  "characters (or absent).")
            fields["task"] = task
        return fields
    text = obj.get("text")
    if not isinstance(text, str):
        raise UploadError(f"{where}: no string field 'text'.")
    extra = {k: v for k, v in obj.items() if k not in ("text", "id", "metadata")
             and isinstance(v, str | int | float | bool) and len(str(v)) <= 1000}
    return {"text": text, **extra}


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = bytearray()
    for chunk in chunks:
        if b"\n" not in chunk:
            pending += chunk  # amortised: a long line costs its length, not its square
            if len(pending) > MAX_LINE_BYTES:
                raise UploadError("A line is longer than 64 MiB.")
            continue
        first, *lines, rest = chunk.split(b"\n")
        pending += first
        yield bytes(pending)
        yield from lines
        pending = bytearray(rest)
    if pending:
        yield bytes(pending)


def _read_jsonl(name: str, chunks: Iterable[bytes], writer: _Writer) -> None:
    for number, raw in enumerate(_lines(chunks), start=1):
        writer.count_read(len(raw) + 1)
        if not raw.strip():
            continue
        where = f"{name} line {number}"
        line = _decode(raw, where)
        try:
            obj = json_input.loads(line)
        except json.JSONDecodeError as error:
            raise UploadError(f"{where}: not JSON ({error.msg}).") from None
        writer.document(source=name, number=number, fields=_fields(obj, where, writer.kind))


def _read_text(name: str, chunks: Iterable[bytes], writer: _Writer) -> None:
    if writer.kind == DatasetKind.INSTRUCTION:
        raise UploadError(f"{name}: an instruction dataset is JSONL with 'prompt' and "
                          "'response' fields.")
    parts = []
    size = 0
    for chunk in chunks:
        writer.count_read(len(chunk))
        size += len(chunk)
        if size > MAX_TEXT_DOCUMENT_BYTES:
            raise UploadError(f"{name}: one text file is one document, at most 64 MiB; "
                              "split it or upload JSONL.")
        parts.append(chunk)
    text = _decode(b"".join(parts), name)
    if text.strip():
        writer.document(source=name, number=1, fields={"text": text})


def _member_name(info: zipfile.ZipInfo) -> str:
    """The entry's name, refused when it would land outside the target folder."""
    name = info.filename
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise UploadError(f"The zip entry {name!r} points outside the dataset; nothing was "
                          "stored.")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UploadError(f"The zip entry {name!r} is a symbolic link; nothing was stored.")
    return str(path)


def _skipped(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return any(part.startswith(".") or part == "__MACOSX" for part in parts)


def _read_zip(name: str, stream: IO[bytes], writer: _Writer, max_files: int) -> None:
    try:
        archive = zipfile.ZipFile(stream)
    except (zipfile.BadZipFile, OSError):
        raise UploadError(f"{name}: not a zip file.") from None
    with archive:
        entries = archive.infolist()
        if len(entries) > max_files:
            raise UploadError(f"{name} holds {len(entries)} entries; at most {max_files} are "
                              "allowed.")
        members = [(info, _member_name(info)) for info in entries]
        declared = sum(info.file_size for info, _ in members)
        if declared > writer.max_bytes:
            raise UploadError(f"{name} unpacks to {declared // 2**20} MiB; the limit is "
                              f"{writer.max_bytes // 2**20} MiB.")
        for info, member in members:
            if info.is_dir() or _skipped(member):
                continue
            kind = kind_of(member) if not member.lower().endswith(".zip") else "zip"
            if kind == "zip":
                raise UploadError(f"{name}: {member} is a zip inside the zip; unpack it first.")
            where = f"{name}/{member}"
            try:
                with archive.open(info) as entry:
                    chunks: Iterator[bytes] = iter(partial(entry.read, 1 << 20), b"")
                    reader = _read_jsonl if kind == "jsonl" else _read_text
                    reader(where, chunks, writer)
            except (zipfile.BadZipFile, EOFError, OSError) as error:
                raise UploadError(f"{where}: cannot be read from the zip ({error}).") from None
            writer.files.append({"name": member, "bytes": info.file_size})


def read_upload(*, name: str, chunks: Iterable[bytes], open_file, folder: Path,
                dataset_kind: str, max_bytes: int, max_files: int) -> DocumentStats:
    """Stream the upload into `folder`/00000.jsonl; the statistics of what was written.
    `open_file()` gives a seekable binary file of the upload (a zip needs one)."""
    kind = kind_of(name)
    writer = _Writer(folder, dataset_kind, max_bytes)
    try:
        if kind == "zip":
            with open_file() as stream:
                _read_zip(name, stream, writer, max_files)
        elif kind == "jsonl":
            _read_jsonl(name, chunks, writer)
        else:
            _read_text(name, chunks, writer)
    finally:
        writer.close()
    if not writer.stats.documents:
        raise UploadError(f"{name}: no documents found (empty, or only blank lines).")
    return writer.stats
