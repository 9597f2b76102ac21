"""Checking an uploaded benchmark (JSONL documents and the templates that prompt and score
them) the way lm-eval will read it, so that a mistake is a 400 naming the field and the line
now rather than a failed job later.

A retrieval benchmark has no templates: its lines are passages `{"id": …, "text": …}` and
queries `{"query": …, "relevant": [passage ids]}`, in any order; its documents are its queries,
and each relevant id must name a passage of the same file.

Templates are Jinja over a document's fields, as lm-eval takes them: a template that is
exactly a field's name reads that field; anything else is rendered (undefined names are
errors). They are rendered here in Jinja's sandbox: the platform renders what users wrote.
"""

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from mmodel.choices import BenchmarkKind
from ogai import json_input

MAX_BENCHMARK_BYTES = 64 * 2**20
MAX_DOCUMENTS = 200_000
MAX_LINE_BYTES = 4 * 2**20
PREVIEW_DOCUMENTS = 3

# What a benchmark of each kind is prompted and scored with unless its author says otherwise.
DEFAULTS: dict[str, dict[str, Any]] = {
    BenchmarkKind.MULTIPLE_CHOICE: {
        "prompt_template": "Question: {{question}}\nAnswer:",
        "target_template": "{{answer}}",
        "choices_template": "{{choices}}",
        "metrics": ["acc", "acc_norm"],
    },
    BenchmarkKind.GENERATION: {
        "prompt_template": "Question: {{question}}\nAnswer:",
        "target_template": "{{answer}}",
        "metrics": ["exact_match"],
        # Greedy, so answers are reproducible and cacheable; one line is one answer.
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 32, "do_sample": False},
    },
    BenchmarkKind.PERPLEXITY: {
        "text_field": "text",
        "metrics": ["word_perplexity", "byte_perplexity", "bits_per_byte"],
    },
    # Scored by mmodel.runners.retrieval (passages ranked by cosine similarity), not lm-eval.
    BenchmarkKind.RETRIEVAL: {
        "metrics": ["recall@1", "recall@5", "mrr"],
    },
}
METRICS = {kind: tuple(values["metrics"]) for kind, values in DEFAULTS.items()}
MAX_GEN_TOKS = 4096
PASSAGE_SHAPE = '{"id": …, "text": …}'
QUERY_SHAPE = '{"query": …, "relevant": [passage ids]}'


class BenchmarkError(ValueError):
    """A problem with one field of a benchmark (`field`), in words a person can act on."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def _regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    # lm-eval's own filter, so templates using it validate here too.
    return re.sub(pattern, repl, string, count=count)


# A template is rendered for every document while the upload is checked (in the request) and
# again for previews: it must not be able to run long or build huge strings.
MAX_TEMPLATE_CHARS = 4000
MAX_LOOPS = 1  # one loop, over the document's own data (e.g. its choices): no range()
MAX_PRODUCT = 100_000


class _BoundedSandbox(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" or any(isinstance(v, str | list | tuple) for v in (left, right)):
            size = max(len(v) if isinstance(v, str | list | tuple) else abs(v)
                       for v in (left, right) if isinstance(v, str | list | tuple | int | float))
            other = right if isinstance(left, str | list | tuple) else left
            if operator == "**" or (isinstance(other, int) and size * other > MAX_PRODUCT):
                raise SecurityError("templates may not raise to powers or repeat text "
                                    "into something huge")
        return super().call_binop(context, operator, left, right)


_env = _BoundedSandbox(undefined=StrictUndefined, keep_trailing_newline=True,
                       autoescape=False)  # prompts are text, not HTML
_env.globals.pop("range", None)
_env.filters["regex_replace"] = _regex_replace


def _check_template(template: str) -> None:
    """Refuse what could run away before rendering anything (SecurityError)."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise SecurityError(f"a template may have at most {MAX_TEMPLATE_CHARS} characters")
    loops = sum(1 for _ in _env.parse(template).find_all(nodes.For))
    if loops > MAX_LOOPS:
        raise SecurityError(f"a template may have at most {MAX_LOOPS} loop (over the "
                            "document's own fields)")


@dataclass
class Definition:
    """How a benchmark prompts and scores its documents (defaults filled in)."""

    kind: str
    prompt_template: str = ""
    target_template: str = ""
    choices_template: str = ""
    text_field: str = ""
    few_shot: int = 0
    metrics: list[str] = field(default_factory=list)
    generation_kwargs: dict = field(default_factory=dict)

    @classmethod
    def build(cls, *, kind: str, prompt_template: str = "", target_template: str = "",
              choices_template: str = "", text_field: str = "", few_shot: int = 0,
              metrics: list[str] | None = None,
              generation_kwargs: dict | None = None) -> "Definition":
        if kind not in BenchmarkKind.values:
            raise BenchmarkError("kind", f"Unknown kind {kind!r}; use one of "
                                 f"{', '.join(BenchmarkKind.values)}.")
        defaults = DEFAULTS[kind]
        definition = cls(
            kind=kind,
            prompt_template=prompt_template or defaults.get("prompt_template", ""),
            target_template=target_template or defaults.get("target_template", ""),
            choices_template=choices_template or defaults.get("choices_template", ""),
            text_field=text_field or defaults.get("text_field", ""),
            few_shot=few_shot,
            metrics=list(metrics or defaults["metrics"]),
            generation_kwargs={**defaults.get("generation_kwargs", {}),
                               **(generation_kwargs or {})},
        )
        definition.check()
        return definition

    def check(self) -> None:
        """What can be checked without documents."""
        if not 0 <= self.few_shot <= 32:
            raise BenchmarkError("few_shot", "Use 0 to 32 examples.")
        unknown = [m for m in self.metrics if m not in METRICS[self.kind]]
        if unknown or not self.metrics:
            raise BenchmarkError("metrics", f"A {self.kind} benchmark reports "
                                 f"{', '.join(METRICS[self.kind])}; not {', '.join(unknown)}.")
        if self.kind == BenchmarkKind.PERPLEXITY:
            if self.few_shot:
                raise BenchmarkError("few_shot", "Perplexity reads each text alone: no "
                                     "few-shot examples.")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", self.text_field):
                raise BenchmarkError("text_field", "Name the documents' field holding the "
                                     "text (letters, digits, '_').")
            return
        if self.kind == BenchmarkKind.RETRIEVAL:
            self._check_retrieval()
            return
        self._check_generation_kwargs()
        for name in self.template_fields():
            try:
                _check_template(getattr(self, name))
            except TemplateSyntaxError as error:
                raise BenchmarkError(name, f"Not a valid Jinja template: {error.message} "
                                     f"(template line {error.lineno}).") from None
            except SecurityError as error:
                raise BenchmarkError(name, f"Not allowed in a template: {error}.") from None

    def _check_retrieval(self) -> None:
        if self.few_shot:
            raise BenchmarkError("few_shot", "A retrieval benchmark ranks passages for each "
                                 "query: no few-shot examples.")
        for name in ("prompt_template", "target_template", "choices_template", "text_field"):
            if getattr(self, name):
                raise BenchmarkError(name, "A retrieval benchmark takes no templates: its "
                                     f"lines are passages {PASSAGE_SHAPE} and queries "
                                     f"{QUERY_SHAPE}.")
        if self.generation_kwargs:
            raise BenchmarkError("generation_kwargs", "A retrieval benchmark generates no "
                                 "text: no generation_kwargs.")

    def _check_generation_kwargs(self) -> None:
        if self.kind != BenchmarkKind.GENERATION:
            return
        kwargs = self.generation_kwargs
        allowed = {"until", "max_gen_toks", "do_sample", "temperature"}
        if set(kwargs) - allowed:
            raise BenchmarkError("generation_kwargs", "Use only "
                                 f"{', '.join(sorted(allowed))}.")
        until = kwargs.get("until", [])
        if not isinstance(until, list) or not all(isinstance(s, str) and s for s in until):
            raise BenchmarkError("generation_kwargs", "until: a list of stop strings.")
        tokens = kwargs.get("max_gen_toks", 32)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or \
                not 1 <= tokens <= MAX_GEN_TOKS:
            raise BenchmarkError("generation_kwargs", f"max_gen_toks: 1 to {MAX_GEN_TOKS}.")

    def template_fields(self) -> list[str]:
        if self.kind == BenchmarkKind.MULTIPLE_CHOICE:
            return ["prompt_template", "target_template", "choices_template"]
        if self.kind == BenchmarkKind.GENERATION:
            return ["prompt_template", "target_template"]
        return []

    def as_dict(self) -> dict:
        return {"kind": self.kind, "prompt_template": self.prompt_template,
                "target_template": self.target_template,
                "choices_template": self.choices_template, "text_field": self.text_field,
                "few_shot": self.few_shot, "metrics": self.metrics,
                "generation_kwargs": self.generation_kwargs}


def _render(template: str, doc: dict) -> Any:
    """A template's value for a document, as lm-eval computes it."""
    if template in doc:
        return doc[template]
    return _env.from_string(template).render(**doc)


def _apply(name: str, template: str, doc: dict, line: int) -> Any:
    try:
        return _render(template, doc)
    except UndefinedError as error:
        raise BenchmarkError(name, f"line {line}: {error.message} (the document has "
                             f"{', '.join(sorted(doc)) or 'no fields'}).") from None
    except SecurityError as error:
        raise BenchmarkError(name, f"line {line}: not allowed in a template: {error}") from None
    except TemplateError as error:
        raise BenchmarkError(name, f"line {line}: {error}") from None
    except Exception as error:  # a filter's own error (a bad regex, a wrong type)
        raise BenchmarkError(name, f"line {line}: {type(error).__name__}: {error}") from None


def _choices(definition: Definition, doc: dict, line: int) -> list[str]:
    value = _apply("choices_template", definition.choices_template, doc, line)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise BenchmarkError("choices_template", f"line {line}: the choices must be a "
                                 f"list of strings; the template gave {value[:200]!r}.") from None
    if not isinstance(value, list) or len(value) < 2 or \
            not all(isinstance(c, str) and c.strip() for c in value):
        raise BenchmarkError("choices_template", f"line {line}: the choices must be a list of "
                             "at least two non-empty strings.")
    return value


def _target_index(definition: Definition, doc: dict, choices: list[str], line: int) -> int:
    value = _apply("target_template", definition.target_template, doc, line)
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value.strip())
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        if not 0 <= value < len(choices):
            raise BenchmarkError("target_template", f"line {line}: answer index {value} is "
                                 f"outside the {len(choices)} choices (0 to "
                                 f"{len(choices) - 1}).")
        return value
    if isinstance(value, str) and value in choices:
        return choices.index(value)
    raise BenchmarkError("target_template", f"line {line}: the answer must be the index of a "
                         f"choice or one of the choices; got {str(value)[:200]!r}.")


def _is_passage_id(value: Any) -> bool:
    return (isinstance(value, str) and bool(value.strip())) or \
        (isinstance(value, int) and not isinstance(value, bool))


def _show_id(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _retrieval_line(doc: dict, line: int) -> dict:
    """One line of a retrieval benchmark checked alone: a query's {"query", "relevant"} or a
    passage's {"id", "text"}."""
    if "query" in doc:
        if "text" in doc:
            raise BenchmarkError("file", f'line {line}: a line is a passage or a query, not '
                                 'both: this one has "text" and "query".')
        query, relevant = doc["query"], doc.get("relevant")
        if not isinstance(query, str) or not query.strip():
            raise BenchmarkError("file", f'line {line}: the query is empty; "query" must be '
                                 "non-empty text.")
        if not isinstance(relevant, list) or not relevant or \
                not all(_is_passage_id(value) for value in relevant):
            raise BenchmarkError("file", f'line {line}: "relevant" must be a non-empty list of '
                                 "passage ids (non-empty strings or integers).")
        seen: set = set()
        for value in relevant:
            if value in seen:
                raise BenchmarkError("file", f'line {line}: "relevant" lists passage id '
                                     f"{_show_id(value)} twice.")
            seen.add(value)
        return {"query": query, "relevant": relevant}
    if "text" in doc or "id" in doc:
        if "relevant" in doc:
            raise BenchmarkError("file", f'line {line}: a passage has no "relevant" ids; a '
                                 f"query is {QUERY_SHAPE}.")
        if not _is_passage_id(doc.get("id")):
            raise BenchmarkError("file", f'line {line}: a passage needs an "id": a non-empty '
                                 "string or an integer.")
        text = doc.get("text")
        if not isinstance(text, str) or not text.strip():
            raise BenchmarkError("file", f"line {line}: passage {_show_id(doc['id'])} has no "
                                 'text; "text" must be non-empty text.')
        return {"id": doc["id"], "text": text}
    raise BenchmarkError("file", f"line {line}: each line of a retrieval benchmark is a "
                         f"passage {PASSAGE_SHAPE} or a query {QUERY_SHAPE}; this one has "
                         f"{', '.join(sorted(doc)) or 'no fields'}.")


class _Corpus:
    """What the lines of a retrieval benchmark add up to: its passage ids (each with its line)
    and the ids its queries name, checked once every line is read (passages may come last)."""

    def __init__(self) -> None:
        self.passages: dict[Any, int] = {}
        self.queries: list[tuple[int, list]] = []

    def add(self, doc: dict, line: int) -> dict | None:
        """A query as the model is asked it; None for a passage."""
        found = _retrieval_line(doc, line)
        if "id" in found:
            first = self.passages.setdefault(found["id"], line)
            if first != line:
                raise BenchmarkError("file", f"line {line}: passage id {_show_id(found['id'])} "
                                     f"is already the id of line {first}.")
            if len(self.passages) > MAX_DOCUMENTS:
                raise BenchmarkError("file", f"At most {MAX_DOCUMENTS} passages.")
            return None
        self.queries.append((line, found["relevant"]))
        return {"prompt": found["query"], "target": ", ".join(map(str, found["relevant"]))}

    def finish(self) -> None:
        if not self.passages:
            raise BenchmarkError("file", f"The file holds {len(self.queries)} queries but no "
                                 f"passages {PASSAGE_SHAPE} to rank.")
        if not self.queries:
            raise BenchmarkError("file", f"The file holds {len(self.passages)} passages but "
                                 f"no queries {QUERY_SHAPE}.")
        for line, relevant in self.queries:
            for value in relevant:
                if value not in self.passages:
                    raise BenchmarkError("file", f"line {line}: relevant id {_show_id(value)} "
                                         f"names no passage of the file{self._hint(value)}.")

    def _hint(self, value: Any) -> str:
        """Where the id is there as the other JSON type (3 and "3")."""
        other = str(value) if isinstance(value, int) else \
            int(value) if value.isdecimal() else None
        return f" (there is a passage {_show_id(other)})" if other in self.passages else ""


def render(definition: Definition, doc: dict, line: int) -> dict:
    """One document as the model sees it: {"prompt", "target", "choices"?}; raises
    BenchmarkError naming the field and line. A retrieval query's target is its relevant
    passage ids; a passage is its text."""
    if definition.kind == BenchmarkKind.RETRIEVAL:
        found = _retrieval_line(doc, line)
        if "id" in found:
            return {"prompt": "", "target": found["text"]}
        return {"prompt": found["query"], "target": ", ".join(map(str, found["relevant"]))}
    if definition.kind == BenchmarkKind.PERPLEXITY:
        text = doc.get(definition.text_field)
        if not isinstance(text, str) or not text.strip():
            raise BenchmarkError("text_field", f"line {line}: no non-empty text in field "
                                 f"{definition.text_field!r}.")
        return {"prompt": "", "target": text}
    prompt = _apply("prompt_template", definition.prompt_template, doc, line)
    if not str(prompt).strip():
        raise BenchmarkError("prompt_template", f"line {line}: the prompt is empty.")
    if definition.kind == BenchmarkKind.MULTIPLE_CHOICE:
        choices = _choices(definition, doc, line)
        index = _target_index(definition, doc, choices, line)
        return {"prompt": str(prompt), "target": choices[index], "choices": choices,
                "answer": index}
    target = _apply("target_template", definition.target_template, doc, line)
    if not str(target).strip():
        raise BenchmarkError("target_template", f"line {line}: the expected answer is empty.")
    return {"prompt": str(prompt), "target": str(target)}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "object"


@dataclass
class Scan:
    documents: int
    content_hash: str
    previews: list[dict]


def _lines(data: bytes | IO[bytes] | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(data, bytes):
        yield from data.splitlines()
        return
    yield from data  # files iterate by line, in binary mode


def scan(definition: Definition, data: bytes | IO[bytes] | Iterable[bytes],
         out: IO[bytes] | None = None) -> Scan:
    """Check every document (JSON object per line; what the templates need present, an answer
    within its choices, nothing empty; each field of one JSON type throughout, as the dataset
    reader needs); write the non-blank lines to `out`. Raises BenchmarkError. A retrieval
    benchmark's documents are its queries (its passages are checked, not counted)."""
    corpus = _Corpus() if definition.kind == BenchmarkKind.RETRIEVAL else None
    digest = hashlib.sha256()
    documents = size = 0
    types: dict[str, tuple[str, int]] = {}
    previews: list[dict] = []
    for line, raw in enumerate(_lines(data), start=1):
        size += len(raw)
        if size > MAX_BENCHMARK_BYTES:
            raise BenchmarkError("file", f"Benchmarks are limited to "
                                 f"{MAX_BENCHMARK_BYTES // 2**20} MiB.")
        if len(raw) > MAX_LINE_BYTES:
            raise BenchmarkError("file", f"line {line}: longer than "
                                 f"{MAX_LINE_BYTES // 2**20} MiB.")
        if not raw.strip():
            continue
        try:
            doc = json_input.loads(raw)
        except ValueError as error:
            raise BenchmarkError("file", f"line {line}: not valid JSON ({error}).") from None
        if not isinstance(doc, dict):
            raise BenchmarkError("file", f"line {line}: each line must be a JSON object, not "
                                 f"{_json_type(doc)}.")
        for key, value in doc.items():
            kind = _json_type(value)
            first = types.setdefault(key, (kind, line))
            if kind != "null" and first[0] == "null":
                types[key] = (kind, line)
            elif kind not in ("null", first[0]):
                raise BenchmarkError("file", f"line {line}: field {key!r} is a {kind} here but "
                                     f"a {first[0]} on line {first[1]}.")
        rendered = corpus.add(doc, line) if corpus is not None else \
            render(definition, doc, line)
        if rendered is not None:
            documents += 1
            if documents > MAX_DOCUMENTS:
                raise BenchmarkError("file", f"At most {MAX_DOCUMENTS} documents.")
            if len(previews) < PREVIEW_DOCUMENTS:
                previews.append({"index": documents - 1, **rendered})
        clean = raw.rstrip(b"\r\n") + b"\n"
        digest.update(clean)
        if out is not None:
            out.write(clean)
    if not documents and not (corpus is not None and corpus.passages):
        raise BenchmarkError("file", "The file holds no documents.")
    if corpus is not None:
        corpus.finish()
    if definition.few_shot and definition.few_shot >= documents:
        raise BenchmarkError("few_shot", f"{definition.few_shot} examples need more than "
                             f"{documents} documents (each is shown with others as examples).")
    return Scan(documents=documents, content_hash=digest.hexdigest(), previews=previews)


def preview(definition: Definition, lines: Iterable[bytes], count: int) -> list[dict]:
    """The first `count` documents rendered as prompts (of a stored, checked file); of a
    retrieval benchmark, its first queries."""
    shown: list[dict] = []
    for line, raw in enumerate(lines, start=1):
        if len(shown) >= count:
            break
        if raw.strip():
            doc = json.loads(raw)
            if definition.kind == BenchmarkKind.RETRIEVAL and "query" not in doc:
                continue  # a passage
            shown.append({"index": len(shown), "document": doc,
                          **render(definition, doc, line)})
    return shown
