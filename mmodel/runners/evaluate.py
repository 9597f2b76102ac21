"""Evaluation runner: `python -m mmodel.runners.evaluate --spec PATH`, inside a job.

Runs lm-eval (`simple_evaluate`) on the tasks the platform compiled (`mmodel.runners.lm_tasks`)
against a model folder (`hf`) or a deployment's OpenAI-compatible server
(`local-completions`), with its requests cached in a file kept per model version, and reports
to the platform: `started`, `result` (per benchmark: metrics with value and stderr, sample
count), `samples` (per document: prompt, target, output, correct, scores), then `finished`
(how many requests the cache answered) or `failed`. An embedding model (`sentence-transformers`
or `openai-embeddings`) is scored on retrieval benchmarks by `mmodel.runners.retrieval`
instead, with the same events (a query is a document; `finished` counts the texts encoded).
Exit codes: 0 done, 1 failed, 2 bad spec.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from mmodel.runners import retrieval
from ylink.runners.report import Reporter

EVENTS_PATH = "/api/v1/mmodel/runner/events/"
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
REQUIRED = ("run", "model", "model_args", "tasks_dir", "tasks")
# Sample events are sized so that a batch of them stays well under the platform's request
# body limit (1 MiB by default): fields are cut, and an event holds at most this many bytes.
MAX_FIELD_CHARS = 2000
SAMPLE_EVENT_BYTES = 150_000
REPORTER_BATCH = 4
CACHE_LINE = re.compile(r"Cached requests: (\d+), Requests remaining: (\d+)")


class CacheCounter(logging.Handler):
    """Adds up lm-eval's own account of its request cache ("Cached requests: N, Requests
    remaining: M", logged once per request type)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.cached = 0
        self.total = 0

    def emit(self, record: logging.LogRecord) -> None:
        found = CACHE_LINE.search(record.getMessage())
        if found:
            cached, remaining = int(found[1]), int(found[2])
            self.cached += cached
            self.total += cached + remaining


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def task_metrics(task_result: dict[str, Any], filter_name: str) -> dict[str, dict]:
    """{"acc": {"value", "stderr"}} out of lm-eval's {"acc,none": …, "acc_stderr,none": …}."""
    metrics: dict[str, dict] = {}
    for key, value in task_result.items():
        name, _, key_filter = key.partition(",")
        if key_filter != filter_name or name.endswith("_stderr"):
            continue
        if _number(value) is None:
            continue
        metrics[name] = {"value": float(value),
                         "stderr": _number(task_result.get(f"{name}_stderr,{filter_name}"))}
    return metrics


def _cut(text: Any, keep_end: bool = False) -> str:
    text = "" if text is None else str(text)
    if len(text) <= MAX_FIELD_CHARS:
        return text
    return "…" + text[-MAX_FIELD_CHARS:] if keep_end else text[:MAX_FIELD_CHARS] + "…"


def _sample(kind: str, entry: dict[str, Any]) -> dict[str, Any]:
    arguments = entry.get("arguments") or []
    if kind == "multiple_choice":
        choices = [arg[1] for arg in arguments]
        loglikelihoods = [float(resp[0]) for resp in entry.get("filtered_resps") or []]
        best = max(range(len(loglikelihoods)), key=loglikelihoods.__getitem__, default=None)
        target = entry.get("target")
        if isinstance(target, int) and 0 <= target < len(choices):
            target = choices[target]
        return {
            # The prompt ends with the question asked; few-shot examples come before it.
            "prompt": _cut(arguments[0][0] if arguments else "", keep_end=True),
            "target": _cut(str(target).strip()),
            "output": _cut(choices[best].strip() if best is not None else ""),
            "correct": bool(entry.get("acc") == 1.0),
            "scores": {"acc": entry.get("acc"), "acc_norm": entry.get("acc_norm"),
                       "loglikelihoods": loglikelihoods},
        }
    if kind == "generation":
        filtered = entry.get("filtered_resps")
        raw = (entry.get("resps") or [[""]])[0]
        return {
            "prompt": _cut(arguments[0][0] if arguments else "", keep_end=True),
            "target": _cut(entry.get("target")),
            "output": _cut(raw[0] if isinstance(raw, list) and raw else raw),
            "correct": bool(entry.get("exact_match") == 1.0),
            "scores": {"exact_match": entry.get("exact_match"),
                       "compared": _cut(filtered[0] if isinstance(filtered, list) and filtered
                                        else filtered)},
        }
    loglikelihood = (entry.get("filtered_resps") or [None])[0]
    words = (entry.get("word_perplexity") or [None, None])[1]
    size = (entry.get("byte_perplexity") or [None, None])[1]
    return {"prompt": "", "target": _cut(entry.get("target")), "output": "", "correct": None,
            "scores": {"loglikelihood": _number(loglikelihood), "words": words, "bytes": size}}


def task_samples(kind: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per document, in document order (the first filter's entry when there are several)."""
    seen: dict[int, dict] = {}
    for entry in entries:
        index = int(entry["doc_id"])
        if index not in seen:
            seen[index] = {"index": index, **_sample(kind, entry)}
    return [seen[i] for i in sorted(seen)]


def sample_batches(samples: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    batches: list[list[dict]] = []
    current: list[dict] = []
    size = 0
    for sample in samples:
        length = len(json.dumps(sample, ensure_ascii=False, default=str).encode())
        if current and size + length > SAMPLE_EVENT_BYTES:
            batches.append(current)
            current, size = [], 0
        current.append(sample)
        size += length
    if current:
        batches.append(current)
    return batches


def check_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ValueError("the spec is not a JSON object")
    if spec.get("model") in retrieval.MODEL_TYPES:
        return retrieval.check_spec(spec)
    missing = [key for key in REQUIRED if key not in spec]
    if missing:
        raise ValueError(f"the spec lacks {', '.join(missing)}")
    if spec["model"] not in ("hf", "local-completions"):
        raise ValueError(f"unknown model type {spec['model']!r}")
    if not spec["tasks"]:
        raise ValueError("the spec names no tasks")
    return spec


def evaluate(spec: dict[str, Any], reporter: Any) -> dict[str, int]:
    """Run lm-eval on the spec's tasks and report; the request counts."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    counter = CacheCounter()
    model_logger = logging.getLogger("lm_eval.api.model")
    model_logger.addHandler(counter)
    model_logger.setLevel(logging.INFO)
    try:
        reporter.send("progress", stage="evaluating",
                      tasks=[t["task"] for t in spec["tasks"]])
        output = lm_eval.simple_evaluate(
            model=spec["model"], model_args=spec["model_args"],
            tasks=[t["task"] for t in spec["tasks"]],
            task_manager=TaskManager(include_path=spec["tasks_dir"], include_defaults=False),
            use_cache=spec.get("cache"), limit=spec.get("limit"),
            batch_size=spec.get("batch_size", 1),
            bootstrap_iters=spec.get("bootstrap_iters", 1000),
            log_samples=True,
        )
    finally:
        model_logger.removeHandler(counter)
    if output is None:
        raise RuntimeError("lm-eval returned no results")
    for task in spec["tasks"]:
        name = task["task"]
        result = output["results"].get(name)
        if result is None:
            raise RuntimeError(f"lm-eval reported nothing for {name}")
        count = (output.get("n-samples") or {}).get(name, {}).get("effective")
        reporter.send("result", benchmark=task["benchmark"], task=name,
                      metrics=task_metrics(result, task["filter"]),
                      samples=int(count if count is not None else result.get("sample_len", 0)))
        samples = task_samples(task["kind"], (output.get("samples") or {}).get(name, []))
        for batch in sample_batches(samples):
            reporter.send("samples", benchmark=task["benchmark"], samples=batch)
    return {"cached_requests": counter.cached, "total_requests": counter.total}


def evaluate_retrieval(spec: dict[str, Any], reporter: Any) -> dict[str, int]:
    """Score the spec's retrieval benchmarks with its embedding model and report; the texts
    encoded (none come from a cache)."""
    reporter.send("progress", stage="loading", model=spec["model"])
    encode = retrieval.encoder(spec)
    texts = 0
    for task in spec["tasks"]:
        reporter.send("progress", stage="encoding", task=task["task"])
        corpus = retrieval.read_corpus(task["data_file"], spec.get("limit"))
        scored = retrieval.score(corpus, encode, task["metrics"])
        texts += scored.texts
        reporter.send("result", benchmark=task["benchmark"], task=task["task"],
                      metrics=scored.metrics, samples=scored.count)
        for batch in sample_batches(scored.samples):
            reporter.send("samples", benchmark=task["benchmark"], samples=batch)
    return {"cached_requests": 0, "total_requests": texts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmodel.runners.evaluate")
    parser.add_argument("--spec", required=True, help="The run's spec.json.")
    args = parser.parse_args(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    reporter = Reporter.from_env(path=EVENTS_PATH, batch_size=REPORTER_BATCH)
    try:
        spec = check_spec(json.loads(Path(args.spec).read_text()))
    except (OSError, ValueError) as error:
        message = f"bad spec {args.spec}: {error}"
        print(f"mmodel.runners.evaluate: {message}", file=sys.stderr, flush=True)
        reporter.send("failed", message=message)
        reporter.close()
        return EXIT_BAD_SPEC
    # The datasets library keeps its Arrow copies beside the run, not in a shared home.
    os.environ.setdefault("HF_DATASETS_CACHE", str(Path(args.spec).parent / "hf-datasets"))
    reporter.send("started", attempt=int(os.environ.get("OGAI_ATTEMPT", "1") or 1),
                  tasks=len(spec["tasks"]))
    try:
        counts = evaluate_retrieval(spec, reporter) \
            if spec["model"] in retrieval.MODEL_TYPES else evaluate(spec, reporter)
    except Exception as error:
        traceback.print_exc()
        message = " ".join(f"{type(error).__name__}: {error}".split())[:2000]
        reporter.send("failed", message=message)
        reporter.close()
        return EXIT_FAILED
    reporter.send("finished", **counts)
    reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
