"""The data-pipeline step catalogue.

Pure Python (no Django, no datatrove): the runner, the API's validation and the console's pipeline
builder all read the same description of each step type and its parameters.
"""

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_PIPELINE",
    "EXECUTORS",
    "STEP_TYPES",
    "Param",
    "StepError",
    "StepType",
    "catalogue",
    "validate_steps",
]

MAX_STEPS = 32
# How a pipeline run executes its steps: "local", a gang of plain replicas (each a datatrove
# task); "ray", datatrove's RayPipelineExecutor on a Ray cluster job (ylink.runners.data).
EXECUTORS = ("local", "ray")


class StepError(ValueError):
    """Invalid pipeline steps. `errors` maps a place ("steps[2].params.threshold") to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{place}: {message}" for place, message in self.errors.items()))


@dataclass(frozen=True)
class Param:
    kind: str  # "int" | "float" | "bool" | "str" | "choice"
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()

    def describe(self) -> dict:
        data: dict[str, Any] = {"type": self.kind, "default": self.default, "help": self.help}
        if self.min is not None:
            data["min"] = self.min
        if self.max is not None:
            data["max"] = self.max
        if self.choices:
            data["choices"] = list(self.choices)
        return data


@dataclass(frozen=True)
class StepType:
    name: str
    title: str
    description: str
    params: dict[str, Param] = field(default_factory=dict)
    # Drops documents (so its funnel shows reasons) or only rewrites text.
    drops: bool = True

    def describe(self) -> dict:
        return {
            "type": self.name,
            "title": self.title,
            "description": self.description,
            "drops": self.drops,
            "params": {name: param.describe() for name, param in self.params.items()},
        }


HAP_SCORERS = ("wordlist", "classifier", "model")
# A model version of the registry: its model's name (mmodel's rule), ":v", its number.
MODEL_VERSION_REFERENCE = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,98}[a-z0-9])?:v[1-9][0-9]{0,8}")


def _frac(default: float, help_text: str) -> Param:
    return Param("float", default, help_text, min=0.0, max=1.0)


_STEPS = [
    StepType(
        "normalize",
        "Normalise text",
        "Unicode normalisation and whitespace clean-up: trailing spaces, runs of spaces and "
        "of blank lines. Drops nothing.",
        {
            "unicode_form": Param(
                "choice", "NFC", "Unicode normal form to apply ('none' keeps the text as is).",
                choices=("NFC", "NFKC", "none"),
            ),
            "fix_encoding": Param(
                "bool", False, "Repair mojibake and broken Unicode with ftfy (slower)."
            ),
            "collapse_whitespace": Param(
                "bool", True, "Collapse runs of spaces and tabs, strip line ends, keep at most "
                "one blank line between paragraphs.",
            ),
        },
        drops=False,
    ),
    StepType(
        "length_filter",
        "Length bounds",
        "Drops documents that are too short or too long.",
        {
            "min_chars": Param("int", 200, "Fewest characters a document may have.", 0, 10**8),
            "max_chars": Param("int", 1_000_000, "Most characters a document may have.", 1, 10**9),
            "min_words": Param(
                "int", 0, "Fewest whitespace-separated words (0 = no bound).", 0, 10**7
            ),
        },
    ),
    StepType(
        "gopher_quality",
        "Gopher quality rules",
        "Gopher's quality heuristics: document length in words, mean word length, symbol and "
        "bullet ratios, share of alphabetic words, presence of stop words (English).",
        {
            "min_doc_words": Param("int", 50, "Fewest words.", 0, 10**7),
            "max_doc_words": Param("int", 100_000, "Most words.", 1, 10**8),
            "min_avg_word_length": Param("float", 3.0, "Shortest mean word length.", 0, 100),
            "max_avg_word_length": Param("float", 10.0, "Longest mean word length.", 1, 1000),
            "max_symbol_word_ratio": _frac(0.1, "Most '#' or '...' per word."),
            "max_bullet_lines_ratio": _frac(0.9, "Most share of lines starting with a bullet."),
            "max_ellipsis_lines_ratio": _frac(0.3, "Most share of lines ending with '...'."),
            "min_alpha_words_ratio": _frac(
                0.8, "Least share of words containing a letter."
            ),
            "min_stop_words": Param(
                "int", 2, "Fewest distinct English stop words (the, be, to, of, and, that, "
                "have, with).", 0, 8,
            ),
        },
    ),
    StepType(
        "gopher_repetition",
        "Gopher repetition rules",
        "Gopher's repetition heuristics: duplicated lines and paragraphs, most frequent "
        "n-grams, duplicated n-grams.",
        {
            "dup_line_frac": _frac(0.3, "Most share of duplicated lines."),
            "dup_para_frac": _frac(0.3, "Most share of duplicated paragraphs."),
            "dup_line_char_frac": _frac(0.2, "Most share of characters in duplicated lines."),
            "dup_para_char_frac": _frac(
                0.2, "Most share of characters in duplicated paragraphs."
            ),
            "top_2_gram_frac": _frac(0.2, "Most share of characters in the top 2-gram."),
            "top_3_gram_frac": _frac(0.18, "Most share of characters in the top 3-gram."),
            "top_4_gram_frac": _frac(0.16, "Most share of characters in the top 4-gram."),
            "dup_5_gram_frac": _frac(0.15, "Most share of characters in duplicated 5-grams."),
            "dup_6_gram_frac": _frac(0.14, "Most share of characters in duplicated 6-grams."),
            "dup_7_gram_frac": _frac(0.13, "Most share of characters in duplicated 7-grams."),
            "dup_8_gram_frac": _frac(0.12, "Most share of characters in duplicated 8-grams."),
            "dup_9_gram_frac": _frac(0.11, "Most share of characters in duplicated 9-grams."),
            "dup_10_gram_frac": _frac(0.10, "Most share of characters in duplicated 10-grams."),
        },
    ),
    StepType(
        "c4_lines",
        "C4 line rules",
        "C4's rules: removes lines without terminal punctuation, with too few words, mentioning "
        "javascript or cookie/terms policies; drops documents with 'lorem ipsum', a curly "
        "bracket, or too few sentences left.",
        {
            "filter_no_terminal_punct": Param(
                "bool", True, "Remove lines that do not end in . ! ? or a quote."
            ),
            "min_words_per_line": Param("int", 3, "Remove lines with fewer words.", 0, 1000),
            "min_num_sentences": Param(
                "int", 5, "Drop documents with fewer sentences left (0 = no bound).", 0, 10**6
            ),
            "max_word_length": Param(
                "int", 1000, "Remove lines with a longer word (0 = no bound).", 0, 10**7
            ),
            "filter_lorem_ipsum": Param("bool", True, "Drop documents containing 'lorem ipsum'."),
            "filter_javascript": Param("bool", True, "Remove lines mentioning javascript."),
            "filter_curly_bracket": Param("bool", True, "Drop documents containing '{'."),
            "filter_policy": Param(
                "bool", True, "Remove lines about cookies, terms of use or privacy policies."
            ),
            "remove_citations": Param(
                "bool", True, "Remove Wikipedia-style citation marks like [1] or [edit]."
            ),
        },
    ),
    StepType(
        "pii",
        "PII scrubbing",
        "Replaces email addresses, IPv4 addresses and phone numbers with placeholders. "
        "Drops nothing.",
        {
            "emails": Param("bool", True, "Replace email addresses."),
            "ip_addresses": Param("bool", True, "Replace IPv4 addresses."),
            "only_public_ips": Param(
                "bool", False, "Replace only public IP addresses (keep 10.x, 192.168.x, ...)."
            ),
            "phones": Param(
                "bool", True, "Replace phone numbers (North American and +country formats)."
            ),
            "phone_replacement": Param("str", "<PHONE>", "Text put in place of a phone number."),
        },
        drops=False,
    ),
    StepType(
        "hap",
        "Hate, abuse, profanity",
        "Splits each document into sentences (after . ! ? and at line breaks), scores each "
        "sentence from 0 to 1 and drops documents whose highest sentence score is above the "
        "threshold (the contract of IBM data-prep-kit's HAP transform). Scorers: 'wordlist' "
        "(better-profanity's word list: 1 for a sentence with a listed word), 'classifier' "
        "(alt-profanity-check's linear SVM: the probability the sentence is offensive), "
        "'model' (a sequence classifier from the model registry, e.g. IBM's "
        "granite-guardian-hap-38m: the probability of its HAP label). Not in the default "
        "pipeline.",
        {
            "scorer": Param(
                "choice", "wordlist", "How sentences are scored: a word list, a small "
                "classifier (both offline), or a registry model.",
                choices=HAP_SCORERS,
            ),
            "threshold": _frac(
                0.5, "Drop documents scoring above this. 0.5 is each scorer's own decision: "
                "any listed word; the classifier's or model's more likely class.",
            ),
            "model": Param(
                "str", "", "The registry model version the 'model' scorer uses, as name:vN "
                "(e.g. granite-guardian-hap-38m:v1); empty for the other scorers.",
            ),
        },
    ),
    StepType(
        "exact_dedup",
        "Exact dedup",
        "Keeps the first occurrence of each exact text across the whole dataset (all "
        "replicas).",
        {
            "normalized": Param(
                "bool", False, "Compare texts after lower-casing and removing punctuation, "
                "digits and extra whitespace.",
            ),
        },
    ),
    StepType(
        "minhash_dedup",
        "MinHash near-dedup",
        "Finds near-duplicates with MinHash LSH on word n-grams and keeps the first document "
        "of each cluster, across the whole dataset. Documents are compared when they share all "
        "hashes of at least one bucket; the similarity at which that happens half the time is "
        "about (1/num_buckets)^(1/hashes_per_bucket) (about 0.55 with the defaults: documents "
        "differing by a few percent of their words are caught).",
        {
            "n_grams": Param("int", 4, "Words per shingle.", 1, 32),
            "num_buckets": Param("int", 20, "LSH bands.", 1, 256),
            "hashes_per_bucket": Param("int", 5, "Hashes per band.", 1, 64),
            "seed": Param("int", 1, "Seed of the hash functions.", 0, 2**31 - 1),
        },
    ),
    StepType(
        "tokenize",
        "Tokenize and pack",
        "Tokenizes each document (the trained tokenizer given to the run, or raw bytes), ends "
        "it with <|endoftext|> and writes token shards that training reads back to back in "
        "windows of seq_len + 1 tokens. Must be the last step.",
        {
            "seq_len": Param("int", 256, "Training context length recorded with the shards.",
                             8, 1_048_576),
            "shuffle": Param("bool", True, "Shuffle documents inside each shard."),
            "seed": Param("int", 0, "Seed for the shuffle.", 0, 2**31 - 1),
        },
        drops=False,
    ),
]

STEP_TYPES: dict[str, StepType] = {step.name: step for step in _STEPS}
DEDUP_STEPS = ("exact_dedup", "minhash_dedup")

DEFAULT_PIPELINE: list[dict] = [
    {"type": "normalize", "params": {}},
    {"type": "length_filter", "params": {}},
    {"type": "gopher_repetition", "params": {}},
    {"type": "gopher_quality", "params": {}},
    {"type": "c4_lines", "params": {}},
    {"type": "pii", "params": {}},
    {"type": "exact_dedup", "params": {}},
    {"type": "minhash_dedup", "params": {}},
    {"type": "tokenize", "params": {}},
]


def catalogue() -> list[dict]:
    """Every step type with its parameters, JSON-ready (for the API and the console)."""
    return [step.describe() for step in _STEPS]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _check_value(param: Param, value: Any) -> tuple[Any, str | None]:
    """Returns (value converted, None) or (None, message)."""
    kind = param.kind
    if kind == "bool":
        if not isinstance(value, bool):
            return None, "must be true or false"
        return value, None
    if kind == "str":
        if not isinstance(value, str):
            return None, "must be a string"
        if len(value) > 200:
            return None, "must be at most 200 characters"
        return value, None
    if kind == "choice":
        if not isinstance(value, str) or value not in param.choices:
            return None, f"must be one of: {', '.join(param.choices)}"
        return value, None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, "must be an integer"
        if isinstance(value, float):
            if not value.is_integer():
                return None, "must be an integer"
            value = int(value)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, "must be a number"
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            return None, "must be a finite number"
    else:  # pragma: no cover - catalogue error
        raise AssertionError(f"unknown parameter kind {kind}")
    low, high = param.min, param.max
    if low is not None and high is not None and not low <= value <= high:
        return None, f"must be between {_number(low)} and {_number(high)}"
    if low is not None and value < low:
        return None, f"must be at least {_number(low)}"
    if high is not None and value > high:
        return None, f"must be at most {_number(high)}"
    return value, None


def _cross_checks(step_type: str, params: dict, place: str, errors: dict[str, str]) -> None:
    if step_type == "length_filter" and params["min_chars"] > params["max_chars"]:
        errors[f"{place}.params.max_chars"] = (
            f"must be at least min_chars ({params['min_chars']})"
        )
    if step_type == "gopher_quality":
        if params["min_doc_words"] > params["max_doc_words"]:
            errors[f"{place}.params.max_doc_words"] = (
                f"must be at least min_doc_words ({params['min_doc_words']})"
            )
        if params["min_avg_word_length"] > params["max_avg_word_length"]:
            errors[f"{place}.params.max_avg_word_length"] = (
                f"must be at least min_avg_word_length ({params['min_avg_word_length']})"
            )
    if step_type == "hap":
        model = params["model"]
        if params["scorer"] == "model":
            if not model:
                errors[f"{place}.params.model"] = (
                    "required with scorer 'model': a registry model version as name:vN, "
                    "e.g. granite-guardian-hap-38m:v1"
                )
            elif not MODEL_VERSION_REFERENCE.fullmatch(model):
                errors[f"{place}.params.model"] = (
                    f"'{model}' is not a model version; write name:vN, "
                    "e.g. granite-guardian-hap-38m:v1"
                )
        elif model:
            errors[f"{place}.params.model"] = (
                f"only scorer 'model' uses a model; set scorer to 'model' or leave model empty "
                f"(scorer is '{params['scorer']}')"
            )
    if step_type == "minhash_dedup":
        hashes = params["num_buckets"] * params["hashes_per_bucket"]
        if hashes > 2048:
            errors[f"{place}.params.hashes_per_bucket"] = (
                f"num_buckets * hashes_per_bucket must be at most 2048 (is {hashes})"
            )


def validate_steps(steps: Any) -> list[dict]:
    """Checks a pipeline's steps and returns them as [{"type", "params"}] with every parameter
    filled in. Raises StepError naming each wrong place and what to fix."""
    errors: dict[str, str] = {}
    if not isinstance(steps, list):
        raise StepError({"steps": "must be a list of steps"})
    if not steps:
        raise StepError({"steps": "add at least one step"})
    if len(steps) > MAX_STEPS:
        raise StepError({"steps": f"at most {MAX_STEPS} steps"})

    known_types = ", ".join(STEP_TYPES)
    result: list[dict] = []
    seen: dict[str, int] = {}
    for index, step in enumerate(steps):
        place = f"steps[{index}]"
        if not isinstance(step, dict):
            errors[place] = "must be an object like {\"type\": ..., \"params\": {...}}"
            continue
        extra = sorted(set(step) - {"type", "params"})
        if extra:
            errors[f"{place}.{extra[0]}"] = (
                f"unknown key '{extra[0]}'; a step has only 'type' and 'params'"
            )
        step_type = step.get("type")
        if not isinstance(step_type, str) or not step_type:
            errors[f"{place}.type"] = f"required; one of: {known_types}"
            continue
        spec = STEP_TYPES.get(step_type)
        if spec is None:
            errors[f"{place}.type"] = f"unknown step type '{step_type}'; known: {known_types}"
            continue
        params = step.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            errors[f"{place}.params"] = "must be an object of parameter names to values"
            continue

        filled: dict[str, Any] = {}
        ok = True
        for name in params:
            if name not in spec.params:
                known = ", ".join(spec.params) or "(none)"
                errors[f"{place}.params.{name}"] = f"unknown parameter '{name}'; known: {known}"
                ok = False
        for name, param in spec.params.items():
            if name not in params:
                filled[name] = param.default
                continue
            value, message = _check_value(param, params[name])
            if message:
                errors[f"{place}.params.{name}"] = message
                ok = False
            else:
                filled[name] = value
        if ok:
            _cross_checks(step_type, filled, place, errors)

        if step_type in ("tokenize", *DEDUP_STEPS):
            if step_type in seen:
                errors[f"{place}.type"] = (
                    f"at most one {step_type} step (already at steps[{seen[step_type]}])"
                )
            else:
                seen[step_type] = index
        if step_type == "tokenize" and index != len(steps) - 1:
            errors[f"{place}.type"] = "tokenize must be the last step"
        result.append({"type": step_type, "params": filled})

    if errors:
        raise StepError(errors)
    return result
