"""Retrieval benchmarks, scored without lm-eval for `mmodel.runners.evaluate`: every passage and
query of a benchmark is encoded by an embedding model, passages are ranked for each query by
cosine similarity, and each query scores by where its relevant passages land.

The model is a sentence-transformers folder (`sentence-transformers`: `{"folder", "device"}`)
or a deployment's OpenAI-compatible `/v1/embeddings` (`openai-embeddings`: `{"model",
"base_url", "timeout", "max_retries"}`, its key from OPENAI_API_KEY, as lm-eval's
local-completions reads it). Metrics, each with the standard error of its per-query values:
`recall@1` and `recall@5` (the share of a query's relevant passages among the first k),
`mrr` (the mean of 1 / the rank of the first relevant passage). Passages that score alike rank
in file order.
Imports no Django: the platform compiles the tasks at launch, the runner reads them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MODEL_TYPES = ("sentence-transformers", "openai-embeddings")
METRICS = ("recall@1", "recall@5", "mrr")
TOP_K = 5
KIND = "retrieval"
REQUIRED = ("run", "model", "model_args", "tasks")
BATCH_SIZE = 32  # texts a model call encodes (sentence-transformers' own default)
REQUEST_TEXTS = 64  # texts a request to an endpoint carries
QUERY_ROWS = 256  # queries ranked at once: similarities are queries x passages floats
MAX_QUERY_CHARS = 2000
MAX_PASSAGE_CHARS = 200  # of each passage a sample shows
KEY_ENV = "OPENAI_API_KEY"


def task_name(benchmark_id: int) -> str:
    return f"ogai_b{benchmark_id}"


def retrieval_tasks(benchmarks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the runner needs of each benchmark ({"id", "data_file" (absolute), "metrics"}):
    [{"task", "benchmark", "kind", "filter", "data_file", "metrics"}], like lm_tasks'."""
    return [{"task": task_name(b["id"]), "benchmark": b["id"], "kind": KIND, "filter": "none",
             "data_file": str(Path(b["data_file"]).resolve()),
             "metrics": list(b["metrics"])}
            for b in benchmarks]


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    missing = [key for key in REQUIRED if key not in spec]
    if missing:
        raise ValueError(f"the spec lacks {', '.join(missing)}")
    args = spec["model_args"]
    needed = ("folder",) if spec["model"] == "sentence-transformers" else ("model", "base_url")
    if not isinstance(args, dict) or any(key not in args for key in needed):
        raise ValueError(f"model_args of {spec['model']} need {', '.join(needed)}")
    if not spec["tasks"]:
        raise ValueError("the spec names no tasks")
    for task in spec["tasks"]:
        if task.get("kind") != KIND or "data_file" not in task:
            raise ValueError(f"task {task.get('task')!r} is not a retrieval task with a "
                             "data_file")
    return spec


# -- the benchmark's file ------------------------------------------------------------------------

@dataclass
class Corpus:
    """A retrieval benchmark as read from its file: passages (ids and texts, in file order) and
    queries (text and relevant ids, in file order)."""

    ids: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    queries: list[tuple[str, list[Any]]] = field(default_factory=list)


def read_corpus(path: str | Path, limit: int | None = None) -> Corpus:
    """Every passage, and the first `limit` queries (all without one). The platform checked the
    file at upload; what is wrong with it still fails here in words."""
    corpus = Corpus()
    with Path(path).open("rb") as stream:
        for line, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"{path} line {line}: not a JSON object")
            if "query" in doc:
                if not isinstance(doc.get("relevant"), list):
                    raise ValueError(f"{path} line {line}: a query without a list of relevant "
                                     "passage ids")
                if limit is None or len(corpus.queries) < limit:
                    corpus.queries.append((str(doc["query"]), list(doc["relevant"])))
            elif "text" in doc and "id" in doc:
                corpus.ids.append(doc["id"])
                corpus.texts.append(str(doc["text"]))
            else:
                raise ValueError(f"{path} line {line}: neither a passage nor a query")
    if not corpus.ids or not corpus.queries:
        raise ValueError(f"{path} holds {len(corpus.ids)} passages and "
                         f"{len(corpus.queries)} queries; it needs both")
    known = set(corpus.ids)
    for query, relevant in corpus.queries:
        missing = [value for value in relevant if value not in known]
        if missing:
            raise ValueError(f"{path}: the query {query[:80]!r} names no passage {missing[0]!r}")
    return corpus


# -- encoders ------------------------------------------------------------------------------------

Encode = Callable[[list[str]], np.ndarray]


def weights_encoder(args: dict[str, Any]) -> Encode:
    """The folder's model, encoding as sentence-transformers does, unit-length vectors."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args["folder"], device=args.get("device", "cpu"),
                                local_files_only=True)
    batch_size = int(args.get("batch_size", BATCH_SIZE))

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                            normalize_embeddings=True, show_progress_bar=False)

    return encode


def endpoint_encoder(args: dict[str, Any]) -> Encode:
    """A deployment's /v1/embeddings (OpenAI's shape), REQUEST_TEXTS texts a request; a
    refused request fails the run with the server's words, a lost one is tried again."""
    import httpx

    key = os.environ.get(KEY_ENV, "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    retries = int(args.get("max_retries", 3))
    client = httpx.Client(timeout=float(args.get("timeout", 300)), headers=headers)

    def request(texts: list[str]) -> httpx.Response:
        attempt = 0
        while True:
            try:
                answer = client.post(args["base_url"], json={"model": args["model"],
                                                             "input": texts})
                if answer.status_code < 500 or attempt == retries:
                    return answer
            except httpx.TransportError:
                if attempt == retries:
                    raise
            attempt += 1
            time.sleep(min(2 ** attempt, 30))

    def post(texts: list[str]) -> list[list[float]]:
        answer = request(texts)
        if answer.status_code != 200:
            raise RuntimeError(f"{args['base_url']} answered {answer.status_code}: "
                               f"{answer.text[:500]}")
        data = sorted(answer.json()["data"], key=lambda item: item["index"])
        if len(data) != len(texts):
            raise RuntimeError(f"{args['base_url']} returned {len(data)} vectors for "
                               f"{len(texts)} texts")
        return [item["embedding"] for item in data]

    def encode(texts: list[str]) -> np.ndarray:
        vectors = np.asarray([vector for start in range(0, len(texts), REQUEST_TEXTS)
                              for vector in post(texts[start:start + REQUEST_TEXTS])],
                             dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)

    return encode


def encoder(spec: dict[str, Any]) -> Encode:
    if spec["model"] == "sentence-transformers":
        return weights_encoder(spec["model_args"])
    return endpoint_encoder(spec["model_args"])


# -- scoring -------------------------------------------------------------------------------------

@dataclass
class Scored:
    """A benchmark's metrics ({name: {"value", "stderr"}}), how many queries they are over,
    the per-query samples, and how many texts were encoded."""

    metrics: dict[str, dict[str, float | None]]
    count: int
    samples: list[dict[str, Any]]
    texts: int


def mean_and_stderr(values: list[float]) -> dict[str, float | None]:
    """The mean and its standard error (sample standard deviation over √n; none for one)."""
    array = np.asarray(values, dtype=np.float64)
    stderr = float(array.std(ddof=1) / math.sqrt(len(array))) if len(array) > 1 else None
    return {"value": float(array.mean()), "stderr": stderr}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _listing(corpus: Corpus, indexes: list[int]) -> str:
    """One line a passage: its id and the start of its text."""
    return "\n".join(f"{corpus.ids[i]}: "
                     f"{_cut(' '.join(corpus.texts[i].split()), MAX_PASSAGE_CHARS)}"
                     for i in indexes)


def rank_queries(queries: np.ndarray, passages: np.ndarray,
                 relevant: list[list[int]]) -> list[tuple[list[int], list[float], int]]:
    """Per query: the first TOP_K passages (indexes, similarities) and the rank (from 1) of its
    best-placed relevant passage, over the whole corpus, ties in file order."""
    ranked = []
    for start in range(0, len(queries), QUERY_ROWS):
        similarities = queries[start:start + QUERY_ROWS] @ passages.T
        order = np.argsort(-similarities, axis=1, kind="stable")[:, :TOP_K]
        for row, top, wanted in zip(similarities, order, relevant[start:start + QUERY_ROWS],
                                    strict=True):
            best = min(wanted, key=lambda i: (-row[i], i))
            rank = int((row > row[best]).sum() + (row[:best] == row[best]).sum()) + 1
            ranked.append(([int(i) for i in top], [float(row[i]) for i in top], rank))
    return ranked


def score(corpus: Corpus, encode: Encode, metrics: list[str]) -> Scored:
    """Encode, rank and score one benchmark."""
    passages = encode(corpus.texts)
    queries = encode([text for text, _ in corpus.queries])
    position = {value: index for index, value in enumerate(corpus.ids)}
    relevant = [[position[value] for value in wanted] for _, wanted in corpus.queries]
    per_query: dict[str, list[float]] = {name: [] for name in METRICS}
    samples = []
    for index, ((text, wanted), indexes, (top, similarities, rank)) in enumerate(zip(
            corpus.queries, relevant, rank_queries(queries, passages, relevant), strict=True)):
        values = {"recall@1": len(set(top[:1]) & set(indexes)) / len(indexes),
                  "recall@5": len(set(top[:5]) & set(indexes)) / len(indexes),
                  "mrr": 1.0 / rank}
        for name, value in values.items():
            per_query[name].append(value)
        samples.append({
            "index": index, "prompt": _cut(text, MAX_QUERY_CHARS),
            "target": _listing(corpus, indexes), "output": _listing(corpus, top),
            "correct": top[0] in indexes,
            "scores": {"rank": rank, "reciprocal_rank": values["mrr"],
                       "recall@1": values["recall@1"], "recall@5": values["recall@5"],
                       "relevant": list(wanted), "top5": [corpus.ids[i] for i in top],
                       "similarities": similarities},
        })
    return Scored(metrics={name: mean_and_stderr(per_query[name]) for name in metrics},
                  count=len(corpus.queries), samples=samples,
                  texts=len(corpus.texts) + len(corpus.queries))
