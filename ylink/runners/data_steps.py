"""Datatrove steps of the data runner: the platform's own formatters and filters, the readers,
the counting wrapper behind each step's funnel, and the global dedup stages that keep the first
document (in input order) of each duplicate group whatever the number of replicas.

No Django here: this module runs inside job processes.
"""

import json
import re
import unicodedata
import zlib
from collections import deque
from pathlib import Path
from time import perf_counter

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig, get_sig_dtype
from datatrove.pipeline.dedup.minhash import SENTINEL, MinhashDedupCluster
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.formatters.base import BaseFormatter
from datatrove.pipeline.formatters.pii import PIIFormatter, PIIReplacer
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.binaryio import read_tuples_from_file
from datatrove.utils.text import simplify_text
from datatrove.utils.typeshelper import ExtensionHelperSD

from ylink.runners import DataError

__all__ = [
    "POSITION_KEY",
    "BucketShare",
    "CountedStep",
    "DataError",
    "EarliestMinhashCluster",
    "GlobalExactFind",
    "HapFilter",
    "InputReader",
    "JsonlFileWriter",
    "LengthFilter",
    "NormalizeFormatter",
    "OutputStats",
    "PIIScrubber",
    "PositionRecorder",
    "RankFileReader",
    "RankSeededTokenizer",
    "build_step",
    "exact_dedup_config",
    "output_adapter",
    "utf8_len",
]

# Metadata key carrying a document's place in the input ((file index << 32) | line number): dedup
# keeps the smallest, so its choice does not depend on how the input was split over replicas.
POSITION_KEY = "_ylink_pos"
SAMPLES_PER_REASON = 5
SAMPLE_CHARS = 500


try:  # datatrove's JSONL reader/writer need orjson; the runner also works without it
    import orjson

    def _loads(raw: bytes):
        return orjson.loads(raw)

    def _dumps_line(record: dict) -> bytes:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)

    _JSONError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - depends on the environment
    def _loads(raw: bytes):
        return json.loads(raw)

    def _dumps_line(record: dict) -> bytes:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")

    _JSONError = ValueError


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


# -- readers --------------------------------------------------------------------------------
class InputReader(PipelineStep):
    """Reads the input dataset's `*.jsonl` files ({"id", "text", "metadata", ...} per line).

    Files are split over the replicas (file i goes to rank i % world_size); with fewer files than
    replicas, lines are split instead. A line that is not JSON, not an object, or whose text is not
    a string stops the run with the file and line named. Documents with no text are skipped and
    counted."""

    type = "📖 - READER"
    name = "ylink input"

    def __init__(self, input_dir: str, stats_dir: str):
        super().__init__()
        self.input_dir = input_dir
        self.stats_dir = stats_dir

    def list_files(self) -> list[Path]:
        root = Path(self.input_dir)
        return sorted(path for path in root.rglob("*.jsonl") if path.is_file())

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if data:
            yield from data
        root = Path(self.input_dir)
        files = self.list_files()
        by_line = len(files) < world_size
        documents = skipped = size = 0
        line_counter = -1
        started = perf_counter()
        for file_index, path in enumerate(files):
            if not by_line and file_index % world_size != rank:
                continue
            relative = path.relative_to(root).as_posix()
            with open(path, "rb") as handle:
                for line_no, raw in enumerate(handle, start=1):
                    if not raw.strip():
                        continue
                    line_counter += 1
                    if by_line and line_counter % world_size != rank:
                        continue
                    try:
                        record = _loads(raw)
                    except _JSONError as exc:
                        raise DataError(f"{path}: line {line_no}: not valid JSON ({exc})") from None
                    if not isinstance(record, dict):
                        raise DataError(
                            f"{path}: line {line_no}: expected a JSON object, "
                            f"got {type(record).__name__}"
                        )
                    text = record.pop("text", None)
                    if text is None or text == "":
                        skipped += 1
                        continue
                    if not isinstance(text, str):
                        raise DataError(
                            f"{path}: line {line_no}: 'text' must be a string, "
                            f"got {type(text).__name__}"
                        )
                    doc_id = record.pop("id", None)
                    metadata = record.pop("metadata", None) or {}
                    if not isinstance(metadata, dict):
                        metadata = {"metadata": metadata}
                    record.pop("media", None)
                    if record:  # other top-level keys are kept, as datatrove's readers do
                        metadata = metadata | record
                    metadata[POSITION_KEY] = (file_index << 32) | line_no
                    documents += 1
                    size += utf8_len(text)
                    yield Document(
                        text=text,
                        id=str(doc_id) if doc_id is not None else f"{relative}/{line_no}",
                        metadata=metadata,
                    )
        write_record(
            self.stats_dir, "input", "main", rank,
            {"documents": documents, "bytes": size, "skipped_empty": skipped,
             "files": len(files), "seconds": perf_counter() - started},
        )


class RankFileReader(PipelineStep):
    """Reads back what this rank wrote to an intermediate folder (`{rank:05d}.jsonl`), in order,
    keeping documents whose text became empty (dedup stages address documents by position)."""

    type = "📖 - READER"
    name = "ylink intermediate"

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        path = Path(self.folder) / f"{rank:05d}.jsonl"
        if not path.exists():
            return
        with open(path, "rb") as handle:
            for raw in handle:
                record = _loads(raw)
                yield Document(
                    text=record.get("text", ""),
                    id=record.get("id", ""),
                    metadata=record.get("metadata") or {},
                )


class JsonlFileWriter(DiskWriter):
    """Uncompressed JSONL (`{rank:05d}.jsonl`), like datatrove's JsonlWriter(compression=None)
    but without requiring orjson."""

    default_output_filename = "${rank}.jsonl"
    name = "🐿 Jsonl"

    def __init__(self, output_folder: str, output_filename: str | None = None, adapter=None):
        super().__init__(output_folder, output_filename=output_filename, compression=None,
                         adapter=adapter, mode="wb")

    def _write(self, document: dict, file_handler, _filename: str) -> None:
        file_handler.write(_dumps_line(document))


def output_adapter(writer, document: Document) -> dict:
    """The dataset format: {"id", "text", "metadata"}, without the runner's own keys."""
    metadata = {k: v for k, v in document.metadata.items() if not k.startswith("_ylink")}
    return {"id": document.id, "text": document.text, "metadata": metadata}


# -- formatters and filters -----------------------------------------------------------------
_SPACE_RUNS = re.compile(r"[ \t\f\v\u00a0]+")
_BLANK_RUNS = re.compile(r"\n{3,}")


INSTRUCTION_KEYS = ("prompt", "response")


class InstructionFormatter(BaseFormatter):
    """A formatter that also rewrites an instruction dataset's prompt and response (what
    fine-tuning trains on), not only the text they are joined into."""

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1
            ) -> DocumentsPipeline:
        def with_instructions(docs: DocumentsPipeline) -> DocumentsPipeline:
            for doc in docs:
                for key in INSTRUCTION_KEYS:
                    if isinstance(doc.metadata.get(key), str):
                        doc.metadata[key] = self.format(doc.metadata[key])
                yield doc

        yield from super().run(with_instructions(data), rank, world_size)


class NormalizeFormatter(InstructionFormatter):
    name = "🧹 Normalize"

    def __init__(self, unicode_form: str = "NFC", fix_encoding: bool = False,
                 collapse_whitespace: bool = True):
        super().__init__()
        self.unicode_form = None if unicode_form == "none" else unicode_form
        self.fix_encoding = fix_encoding
        self.collapse_whitespace = collapse_whitespace

    def format(self, text: str) -> str:
        if self.fix_encoding:
            import ftfy

            text = ftfy.fix_text(text)
        if self.unicode_form and not text.isascii():
            text = unicodedata.normalize(self.unicode_form, text)
        if self.collapse_whitespace:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
            lines = [_SPACE_RUNS.sub(" ", line).strip() for line in text.split("\n")]
            text = _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()
        return text


# North American numbers ((555) 123-4567, 555-123-4567, 555.123.4567) and "+country" numbers
# (+1 555 123 4567, +44 20 7946 0958). Bare digit runs are left alone: they are more often ids.
PHONE_RE = re.compile(
    r"(?<![\w+.-])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,5}){1,4}"
    r"|(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}"
    r")(?![\w-]|\.\d)"
)


class StableReplacer(PIIReplacer):
    """datatrove's PIIReplacer takes its replacements in turn, so a document's placeholder
    depends on what the process saw before (and on the number of replicas); this one picks
    the replacement from the matched text."""

    def replace(self, text: str) -> str:
        def pick(match: re.Match) -> str:
            found = match.group(0)
            if self.validator and not self.validator(found):
                return found
            return self.replacements[zlib.crc32(found.encode()) % len(self.replacements)]

        return self.regex.sub(pick, text)


class PIIScrubber(InstructionFormatter, PIIFormatter):
    """datatrove's email and IP replacement (placeholders chosen per address), plus phone
    numbers."""

    name = "📞 PII"

    def __init__(self, emails: bool = True, ip_addresses: bool = True,
                 only_public_ips: bool = False, phones: bool = True,
                 phone_replacement: str = "<PHONE>"):
        super().__init__(remove_emails=emails, remove_ips=ip_addresses,
                         only_remove_public_ips=only_public_ips)
        self.emails_replacer, self.ip_replacer = (
            StableReplacer(r.regex.pattern, r.replacements, r.validator)
            for r in (self.emails_replacer, self.ip_replacer)
        )
        self.phones = phones
        self.phone_replacement = phone_replacement

    def format(self, text: str) -> str:
        text = super().format(text)
        if self.phones:
            text = PHONE_RE.sub(self.phone_replacement, text)
        return text


class LengthFilter(BaseFilter):
    name = "📏 Length"

    def __init__(self, min_chars: int = 200, max_chars: int = 1_000_000, min_words: int = 0):
        super().__init__()
        self.min_chars = min_chars
        self.max_chars = max_chars
        self.min_words = min_words

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        length = len(doc.text)
        if length < self.min_chars:
            return False, "too_short"
        if length > self.max_chars:
            return False, "too_long"
        if self.min_words and len(doc.text.split()) < self.min_words:
            return False, "too_few_words"
        return True


class HapFilter(BaseFilter):
    """Drops documents whose hate/abuse/profanity score (the highest of their sentences', see
    ylink.runners.hap) is above `threshold`. Scores documents in batches (the classifier and a
    model score all sentences of a batch at once); the scorer loads on first use, in the task's
    process."""

    name = "🤬 HAP"

    def __init__(self, scorer: str = "wordlist", threshold: float = 0.5,
                 model_path: str | None = None, batch_size: int = 256):
        super().__init__(batch_size=batch_size)
        self.scorer = scorer
        self.threshold = threshold
        self.model_path = model_path
        self._scorer = None

    def score(self, texts: list[str]) -> list[float]:
        if self._scorer is None:
            from ylink.runners.hap import make_scorer

            self._scorer = make_scorer(self.scorer, self.model_path)
        return self._scorer.score_documents(texts)

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        return [(False, "hap") if score > self.threshold else True
                for score in self.score([doc.text for doc in batch])]

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return self.filter_batch([doc])[0]


def build_step(step: dict, models: dict[str, str] | None = None) -> PipelineStep:
    """The datatrove step for a validated per-document step (not dedup, not tokenize).
    `models` maps the registry references steps name to their local folders."""
    kind, p = step["type"], step["params"]
    if kind == "hap":
        model_path = None
        if p["scorer"] == "model":
            model_path = (models or {}).get(p["model"])
            if not model_path:
                raise DataError(f"hap: no local folder given for model {p['model']}")
        return HapFilter(scorer=p["scorer"], threshold=p["threshold"], model_path=model_path)
    if kind == "normalize":
        return NormalizeFormatter(**p)
    if kind == "length_filter":
        return LengthFilter(**p)
    if kind == "pii":
        return PIIScrubber(**p)
    if kind == "gopher_quality":
        from datatrove.pipeline.filters import GopherQualityFilter

        return GopherQualityFilter(
            min_doc_words=p["min_doc_words"] or None,
            max_doc_words=p["max_doc_words"],
            min_avg_word_length=p["min_avg_word_length"] or None,
            max_avg_word_length=p["max_avg_word_length"],
            max_symbol_word_ratio=p["max_symbol_word_ratio"],
            max_bullet_lines_ratio=p["max_bullet_lines_ratio"],
            max_ellipsis_lines_ratio=p["max_ellipsis_lines_ratio"],
            max_non_alpha_words_ratio=p["min_alpha_words_ratio"] or None,
            min_stop_words=p["min_stop_words"] or None,
        )
    if kind == "gopher_repetition":
        from datatrove.pipeline.filters import GopherRepetitionFilter

        return GopherRepetitionFilter(
            dup_line_frac=p["dup_line_frac"],
            dup_para_frac=p["dup_para_frac"],
            dup_line_char_frac=p["dup_line_char_frac"],
            dup_para_char_frac=p["dup_para_char_frac"],
            top_n_grams=tuple((n, p[f"top_{n}_gram_frac"]) for n in (2, 3, 4)),
            dup_n_grams=tuple((n, p[f"dup_{n}_gram_frac"]) for n in range(5, 11)),
        )
    if kind == "c4_lines":
        from datatrove.pipeline.filters import C4QualityFilter

        return C4QualityFilter(
            filter_no_terminal_punct=p["filter_no_terminal_punct"],
            min_words_per_line=p["min_words_per_line"] or -1,
            min_num_sentences=p["min_num_sentences"] or -1,
            max_word_length=p["max_word_length"] or -1,
            filter_lorem_ipsum=p["filter_lorem_ipsum"],
            filter_javascript=p["filter_javascript"],
            filter_curly_bracket=p["filter_curly_bracket"],
            filter_policy=p["filter_policy"],
            remove_citations=p["remove_citations"],
        )
    raise ValueError(f"{kind} is not a per-document step")


# Content getters must be module functions with a return annotation (datatrove inspects it).
def _exact_text(doc: Document) -> str:
    return doc.text


def _normalized_text(doc: Document) -> str:
    return simplify_text(doc.text)


def exact_dedup_config(params: dict) -> ExactDedupConfig:
    return ExactDedupConfig(content_getter=_normalized_text if params.get("normalized")
                            else _exact_text)


# -- counting -------------------------------------------------------------------------------
def write_record(stats_dir: str, index: int | str, part: str, rank: int, record: dict) -> None:
    path = Path(stats_dir) / f"step-{index}.{part}.r{rank:05d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


class CountedStep(PipelineStep):
    """Runs `inner` and records its funnel for this rank: documents and UTF-8 bytes in and out,
    dropped documents by reason, a few samples of dropped or changed documents, and the seconds
    spent in the step itself (upstream steps excluded).

    Dropped documents are found by identity (filters yield the objects they keep, in order);
    reasons come from the filter's own result. `terminal` steps (tokenize) consume everything."""

    type = "📊 - COUNT"

    def __init__(self, inner: PipelineStep, *, index: int, step_type: str, stats_dir: str,
                 part: str = "main", drop_reason: str | None = None, terminal: bool = False,
                 change_reason: str = "changed", sample_after_only: bool = False):
        self.name = f"{step_type} (step {index})"
        super().__init__()
        self.inner = inner
        self.index = index
        self.step_type = step_type
        self.stats_dir = stats_dir
        self.part = part
        self.drop_reason = drop_reason
        self.terminal = terminal
        self.change_reason = change_reason
        self.sample_after_only = sample_after_only

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        counts = {"docs_in": 0, "docs_out": 0, "bytes_in": 0, "bytes_out": 0, "changed": 0}
        dropped: dict[str, int] = {}
        samples: dict[str, list[dict]] = {}
        reasons: dict[int, str] = {}
        pending: deque = deque()
        upstream = 0.0
        terminal = self.terminal

        inner = self.inner
        if isinstance(inner, BaseFilter):
            original = inner.filter

            def remember_reason(doc: Document):
                result = original(doc)
                if isinstance(result, tuple) and not result[0] and result[1]:
                    reasons[id(doc)] = result[1]
                return result

            inner.filter = remember_reason

        def feed():
            nonlocal upstream
            if data is None:
                return
            source = iter(data)
            while True:
                started = perf_counter()
                doc = next(source, None)
                upstream += perf_counter() - started
                if doc is None:
                    return
                size = utf8_len(doc.text)
                counts["docs_in"] += 1
                counts["bytes_in"] += size
                if not terminal:
                    pending.append((doc, doc.text, size))
                yield doc

        def sample(reason: str, doc: Document, before: str, after: str | None) -> None:
            bucket = samples.setdefault(reason, [])
            if len(bucket) >= SAMPLES_PER_REASON:
                return
            if after is None:
                item = {"reason": reason, "id": doc.id, "text": before[:SAMPLE_CHARS]}
            elif self.sample_after_only:
                item = {"reason": reason, "id": doc.id, "text": after[:SAMPLE_CHARS]}
            else:
                item = {"reason": reason, "id": doc.id, "text": before[:SAMPLE_CHARS],
                        "after": after[:SAMPLE_CHARS]}
            bucket.append(item)

        def drop(doc: Document, before: str) -> None:
            reason = reasons.pop(id(doc), None) or self.drop_reason or "filtered"
            dropped[reason] = dropped.get(reason, 0) + 1
            sample(reason, doc, before, None)

        started = perf_counter()
        output = inner.run(feed(), rank, world_size)  # sinks (tokenizer, signatures) work here
        inside = perf_counter() - started
        if output is not None:
            output = iter(output)
            while True:
                started = perf_counter()
                doc = next(output, None)
                inside += perf_counter() - started
                if doc is None:
                    break
                # documents before this one that the step did not yield were dropped (the
                # platform's steps yield input documents in order and never create new ones)
                before, size = None, None
                while pending:
                    candidate, text, text_size = pending.popleft()
                    if candidate is doc:
                        before, size = text, text_size
                        break
                    drop(candidate, text)
                if before is None or doc.text is not before:
                    size = utf8_len(doc.text)
                    if before is not None and doc.text != before:
                        counts["changed"] += 1
                        sample(self.change_reason, doc, before, doc.text)
                counts["docs_out"] += 1
                counts["bytes_out"] += size
                yield doc
        while pending:
            candidate, text, _ = pending.popleft()
            drop(candidate, text)
        if terminal:
            counts["docs_out"] = counts["docs_in"]
            counts["bytes_out"] = counts["bytes_in"]
        record = dict(counts, dropped=dropped, seconds=max(inside - upstream, 0.0),
                      samples=[item for bucket in samples.values() for item in bucket])
        write_record(self.stats_dir, self.index, self.part, rank, record)


class PositionRecorder(PipelineStep):
    """Saves the input position of each document reaching a dedup signature, in order, so the
    global dedup stage can keep the earliest document of each group."""

    type = "📊 - COUNT"
    name = "positions"

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        positions: list[int] = []
        for doc in data:
            positions.append(doc.metadata.get(POSITION_KEY, 0))
            yield doc
        path = Path(self.folder) / f"{rank:05d}.u64"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.asarray(positions, dtype="<u8").tofile(path)


class OutputStats(PipelineStep):
    """Counts what reaches the output and a histogram of document lengths (characters)."""

    type = "📊 - COUNT"
    name = "output stats"
    EDGES = [0, *(2**k for k in range(4, 21))]  # 0, 16, 32, ... 1 Mi characters, then more

    def __init__(self, stats_dir: str):
        super().__init__()
        self.stats_dir = stats_dir

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        counts = [0] * len(self.EDGES)
        documents = size = 0
        edges = np.asarray(self.EDGES)
        for doc in data:
            documents += 1
            size += utf8_len(doc.text)
            counts[int(np.searchsorted(edges, len(doc.text), side="right")) - 1] += 1
            yield doc
        write_record(self.stats_dir, "output", "main", rank,
                     {"documents": documents, "bytes": size, "histogram": counts})


def _document_tokenizer():
    from datatrove.pipeline.tokens import DocumentTokenizer

    return DocumentTokenizer


class RankSeededTokenizer(PipelineStep):
    """datatrove's DocumentTokenizer shuffling with `seed + rank`: the seed is set when the task
    runs, not when the step is built, so one pipeline object serves every task (as the Ray
    executor ships it) and shuffles as a replica built for its own rank would."""

    type = "🔢 - TOKENIZER"
    name = "✍️ Writer"

    def __init__(self, *args, seed: int = 0, **kwargs):
        super().__init__()
        self.inner = _document_tokenizer()(*args, seed=seed, **kwargs)
        self.seed = seed

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        self.inner.rand = np.random.default_rng(self.seed + rank)
        return self.inner.run(data, rank, world_size)


class BucketShare(PipelineStep):
    """A one-bucket-per-task stage (datatrove's MinhashDedupBuckets) as N tasks: task r of N runs
    a contiguous share of the `buckets`, one after another, as replica r of N does. (Datatrove's
    Ray executor would run several tasks of one Ray job as a pool forked inside its actor, which
    can deadlock.)"""

    type = "🫂 - DEDUPS"
    name = "bucket share"

    def __init__(self, inner: PipelineStep, buckets: int):
        super().__init__()
        self.inner = inner
        self.buckets = buckets

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        share, extra = divmod(self.buckets, world_size)
        first = rank * share + min(rank, extra)
        for bucket in range(first, first + share + (1 if rank < extra else 0)):
            output = self.inner.run(None, bucket, self.buckets)
            if output is not None:
                deque(output, maxlen=0)
        yield from ()


# -- global dedup stages --------------------------------------------------------------------
def _load_positions(folder: str, stem: int | str) -> np.ndarray:
    path = Path(folder) / f"{int(stem):05d}.u64"
    return np.fromfile(path, dtype="<u8") if path.exists() else np.zeros(0, dtype="<u8")


class GlobalExactFind(PipelineStep):
    """Exact dedup, stage 2 (one task, all replicas' signatures): within each group of equal
    hashes keeps the document that came first in the input and marks the others, in the files
    datatrove's ExactDedupFilter reads."""

    type = "🫂 - DEDUPS"
    name = "💥 exact-deduplication find (keep first)"

    def __init__(self, sig_folder: str, output_folder: str, positions_folder: str,
                 config: ExactDedupConfig):
        super().__init__()
        self.sig_folder = sig_folder
        self.output_folder = output_folder
        self.positions_folder = positions_folder
        self.config = config

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        dtype = get_sig_dtype(self.config.hash_config)
        ext = ExtensionHelperSD.stage_1_signature
        files = sorted(Path(self.sig_folder).glob(f"*/*{ext}"))
        hashes, docs, owners, positions, stems = [], [], [], [], []
        with self.track_time():
            for owner, path in enumerate(files):
                stem = path.name.removesuffix(ext)
                sigs = np.fromfile(path, dtype=dtype)
                where = _load_positions(self.positions_folder, stem)
                stems.append(stem)
                hashes.append(sigs["hash"])
                docs.append(sigs["doc"].astype(np.int64))
                owners.append(np.full(len(sigs), owner, dtype=np.int64))
                positions.append(where[sigs["doc"]] if len(sigs) else where[:0])
            out = Path(self.output_folder) / f"{rank:05d}"
            out.mkdir(parents=True, exist_ok=True)
            if not files:
                return
            hash_all = np.concatenate(hashes)
            doc_all = np.concatenate(docs)
            owner_all = np.concatenate(owners)
            pos_all = np.concatenate(positions)
            order = np.lexsort((doc_all, owner_all, pos_all, hash_all))
            sorted_hashes = hash_all[order]
            first = np.ones(len(order), dtype=bool)
            first[1:] = sorted_hashes[1:] != sorted_hashes[:-1]
            duplicate = order[~first]
            self.stat_update("duplicates", value=len(duplicate))
            # group sizes of the kept documents (datatrove's duplicate_count metadata)
            starts = np.flatnonzero(first)
            sizes = np.diff(np.append(starts, len(order)))
            keepers = order[starts[sizes > 1]]
            kept_counts = sizes[sizes > 1] - 1
            for owner, stem in enumerate(stems):
                mine = np.sort(doc_all[duplicate[owner_all[duplicate] == owner]])
                if len(mine):
                    mine.astype("<u4").tofile(out / f"{stem}{ExtensionHelperSD.stage_2_duplicates}")
                is_mine = owner_all[keepers] == owner
                if is_mine.any():
                    pairs = np.empty(int(is_mine.sum()), dtype=[("doc", "<u4"), ("count", "<u4")])
                    pairs["doc"] = doc_all[keepers[is_mine]]
                    pairs["count"] = kept_counts[is_mine]
                    pairs.sort(order="doc")
                    pairs.tofile(out / f"{stem}{ExtensionHelperSD.stage_2_counts}")


class EarliestMinhashCluster(MinhashDedupCluster):
    """MinHash stage 3 that keeps, of each cluster, the document that came first in the input
    (datatrove keeps the union-find root, which depends on how the input was split)."""

    name = "🎯 MinHash stage 3 (keep first)"

    def __init__(self, input_folder: str, output_folder: str, positions_folder: str, config):
        super().__init__(input_folder, output_folder, config=config)
        self.positions_folder = positions_folder

    def run(self, data: DocumentsPipeline = None, _: int = 0, world_size: int = 1):
        assert world_size == 1, "clustering runs as one task"
        parent_of: dict[tuple[int, int], tuple[int, int]] = {}

        def find(node):
            root = node
            while parent_of.setdefault(root, root) != root:
                root = parent_of[root]
            while parent_of[node] != root:  # path compression
                parent_of[node], node = root, parent_of[node]
            return root

        with self.track_time():
            for dup_file in self.input_folder.list_files(glob_pattern="*.dups"):
                with self.input_folder.open(dup_file, "rb") as handle:
                    for f1, d1, f2, d2 in read_tuples_from_file(handle, "4I", lines_to_buffer=-1):
                        if f1 == SENTINEL:
                            continue  # matches against an index are not used here
                        a, b = find((f1, d1)), find((f2, d2))
                        if a != b:
                            parent_of[max(a, b)] = min(a, b)

            positions: dict[int, np.ndarray] = {}

            def position(node):
                file_id, doc = node
                if file_id not in positions:
                    positions[file_id] = _load_positions(self.positions_folder, file_id)
                known = positions[file_id]
                return (int(known[doc]) if doc < len(known) else 2**64, node)

            best: dict[tuple[int, int], tuple] = {}
            for node in parent_of:
                root = find(node)
                key = position(node)
                if root not in best or key < best[root]:
                    best[root] = key
            removals: dict[int, list[int]] = {}
            for node in parent_of:
                self.stat_update("duplicates")
                if best[find(node)][1] != node:
                    removals.setdefault(node[0], []).append(node[1])
                    self.stat_update("to_remove")
            out = Path(self.output_folder.path)
            out.mkdir(parents=True, exist_ok=True)
            for file_id, docs in removals.items():
                np.asarray(sorted(docs), dtype="<u4").tofile(out / f"{file_id:06d}.remove")

