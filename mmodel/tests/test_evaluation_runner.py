"""The evaluation runner's own parts, without a job: lm-eval's results read into metrics, its
samples into bounded events, its cache account, a bad spec refused; retrieval's ranking and
scores on vectors made by hand, its file read with a limit."""

import json
import logging

import numpy as np
import pytest

from mmodel.runners import evaluate, retrieval
from mmodel.tests.evaluation_fixtures import RETRIEVAL_DOCS, jsonl


def test_metrics_are_read_per_filter_with_their_stderr():
    result = {"alias": "ogai_b1", "sample_len": 4, "acc,none": 0.25, "acc_stderr,none": 0.25,
              "exact_match,strip": 0.5, "exact_match_stderr,strip": 0.2,
              "word_perplexity,none": 812.0, "word_perplexity_stderr,none": "N/A"}
    assert evaluate.task_metrics(result, "none") == {
        "acc": {"value": 0.25, "stderr": 0.25},
        "word_perplexity": {"value": 812.0, "stderr": None}}
    assert evaluate.task_metrics(result, "strip") == {
        "exact_match": {"value": 0.5, "stderr": 0.2}}


def test_samples_are_read_per_kind_and_sent_in_bounded_events():
    choice = {"doc_id": 0, "target": 1, "acc": 1.0, "acc_norm": 0.0,
              "arguments": [["Q: x\nA:", " a"], ["Q: x\nA:", " b"]],
              "filtered_resps": [[-3.0, False], [-1.0, False]]}
    (sample,) = evaluate.task_samples("multiple_choice", [choice])
    assert sample["target"] == "b" and sample["output"] == "b" and sample["correct"] is True
    assert sample["scores"]["loglikelihoods"] == [-3.0, -1.0]
    answer = {"doc_id": 3, "target": "7", "exact_match": 0.0, "arguments": [["3 + 4 =", {}]],
              "resps": [[" 7 apples"]], "filtered_resps": ["7apples"]}
    (generated,) = evaluate.task_samples("generation", [answer, {**answer, "filter": "other"}])
    assert generated["index"] == 3 and generated["output"] == " 7 apples"
    assert generated["correct"] is False and generated["scores"]["compared"] == "7apples"

    long_prompt = "word " * 5000
    many = evaluate.task_samples("generation", [
        {**answer, "doc_id": i, "arguments": [[long_prompt + f"question {i}", {}]]}
        for i in range(400)])
    assert many[0]["prompt"].endswith("question 0") and many[0]["prompt"].startswith("…")
    batches = evaluate.sample_batches(many)
    assert sum(len(b) for b in batches) == 400 and len(batches) > 1
    for batch in batches:
        assert len(json.dumps(batch, ensure_ascii=False).encode()) <= \
            evaluate.SAMPLE_EVENT_BYTES + 2 * evaluate.MAX_FIELD_CHARS * 4


def test_the_cache_account_is_read_from_lm_evals_own_log_lines():
    counter = evaluate.CacheCounter()
    logger = logging.getLogger("lm_eval.api.model")
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    try:
        logger.info("Cached requests: %d, Requests remaining: %d", 12, 0)
        logger.info("Cached requests: 3, Requests remaining: 4")
        logger.info("Loading 'loglikelihood' responses from cache where possible...")
    finally:
        logger.removeHandler(counter)
    assert (counter.cached, counter.total) == (15, 19)


def test_a_bad_spec_is_reported_and_exits_2(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run": 1, "model": "hf"}))
    monkeypatch.delenv("OGAI_URL", raising=False)
    assert evaluate.main(["--spec", str(spec)]) == evaluate.EXIT_BAD_SPEC
    printed = capsys.readouterr().out
    event = json.loads(printed.strip().splitlines()[-1].removeprefix("OGAI-EVENT "))
    assert event["kind"] == "failed" and "lacks model_args, tasks_dir, tasks" in \
        event["data"]["message"]


def test_retrieval_ranks_ties_in_file_order_and_scores_every_relevant_passage(tmp_path):
    """Three queries over four passages, their vectors made by hand: the first finds its passage
    first; the second's passage ties with an earlier one and ranks after it (3rd); the third
    has two relevant passages and finds one of them first (recall@1 0.5, recall@5 1)."""
    path = tmp_path / "ret.jsonl"
    path.write_bytes(jsonl(RETRIEVAL_DOCS))
    corpus = retrieval.read_corpus(path)
    assert corpus.ids == ["gpu", "nccl", "cat", "lr"] and len(corpus.queries) == 3
    vectors = {
        "The GPU ran out of memory while loading the checkpoint.": [1, 0, 0],
        "NCCL timed out waiting for rank 3 during all-reduce.": [0, 1, 0],
        "A cat sat on the mat in the sun.": [0, 0.6, 0.8],
        "The learning rate decays with a cosine schedule after warm-up.": [0, 1, 0],
        "CUDA out of memory": [1, 0, 0],
        "collective communication hangs": [0, 0, 1],
        "a pet resting on a rug": [0, 0.6, 0.8],
    }

    def encode(texts):
        return np.asarray([vectors[text] for text in texts], dtype=np.float32)

    scored = retrieval.score(corpus, encode, list(retrieval.METRICS))
    first, second, third = scored.samples
    assert first["scores"]["top5"][0] == "gpu" and first["correct"] is True
    # "collective…" is nearest the cat (0.8), then gpu/nccl/lr at 0: nccl after gpu.
    assert second["scores"]["top5"] == ["cat", "gpu", "nccl", "lr"]
    assert second["scores"]["rank"] == 3 and second["correct"] is False
    # "a pet…": cat (1.0) first, then nccl and lr tie (0.6) in file order.
    assert third["scores"]["top5"] == ["cat", "nccl", "lr", "gpu"]
    assert third["scores"]["recall@1"] == 0.5 and third["scores"]["recall@5"] == 1.0
    assert third["correct"] is True and third["scores"]["rank"] == 1
    assert scored.metrics["recall@1"]["value"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert scored.metrics["mrr"]["value"] == pytest.approx((1 + 1 / 3 + 1) / 3)
    assert scored.metrics["mrr"]["stderr"] == pytest.approx(
        np.std([1, 1 / 3, 1], ddof=1) / np.sqrt(3))
    assert scored.count == 3 and scored.texts == 7
    assert third["target"] == "cat: A cat sat on the mat in the sun.\n" \
        "lr: The learning rate decays with a cosine schedule after warm-up."
    assert retrieval.read_corpus(path, limit=2).queries == corpus.queries[:2]
    only = retrieval.score(corpus, encode, ["mrr"]).metrics
    assert set(only) == {"mrr"}


def test_a_bad_retrieval_spec_is_reported_and_exits_2(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run": 1, "model": "sentence-transformers",
                                "model_args": {"device": "cpu"}, "tasks": []}))
    monkeypatch.delenv("OGAI_URL", raising=False)
    assert evaluate.main(["--spec", str(spec)]) == evaluate.EXIT_BAD_SPEC
    event = json.loads(capsys.readouterr().out.strip().splitlines()[-1]
                       .removeprefix("OGAI-EVENT "))
    assert event["kind"] == "failed" and "model_args of sentence-transformers need folder" \
        in event["data"]["message"]
