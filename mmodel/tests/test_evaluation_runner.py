"""The evaluation runner's own parts, without a job: lm-eval's results read into metrics, its
samples into bounded events, its cache account, a bad spec refused."""

import json
import logging

from mmodel.runners import evaluate


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
