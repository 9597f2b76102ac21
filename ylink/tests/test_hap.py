"""The `hap` step: sentence splitting, the three scorers, its parameters, the runner dropping what
the labelled fixture marks abusive, and a registry model's folder reaching the runner."""

import json
from pathlib import Path

import pytest

from ylink.runners.hap import (
    ClassifierScorer,
    ModelScorer,
    WordListScorer,
    hap_label_index,
    split_sentences,
)
from ylink.steps import StepError, validate_steps
from ylink.tests.test_data_runner import events, finish, read_output, start

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hap_labelled.jsonl"


def fixture_records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def test_the_fixture_is_a_labelled_dataset():
    records = fixture_records()
    assert len(records) >= 100 and len({r["id"] for r in records}) == len(records)
    labels = [r["metadata"]["hap"] for r in records]
    assert all(isinstance(label, bool) for label in labels)
    assert 0.3 < sum(labels) / len(labels) < 0.7


def test_sentences_end_at_terminal_punctuation_and_line_breaks():
    text = "First one. Second one!  Third?\nA line without an end\n\nv1.2 stays whole. Last"
    assert split_sentences(text) == ["First one.", "Second one!", "Third?",
                                     "A line without an end", "v1.2 stays whole.", "Last"]
    assert split_sentences("  \n ") == []


def test_the_word_list_is_better_profanitys_matched_as_tokens_and_phrases():
    scorer = WordListScorer()
    assert len(scorer.words) > 800, "the list shipped in the wheel is read"
    for text in ("What the FUCK.", "this is bullshit", "sh1t happens", "a son-of-a-bitch",
                 "total blow job", "s.h.i.t.", "Clean start.\nYou asshole"):
        assert scorer.score_text(text) == 1.0, text
    for text in ("The assistant checked the class list in Scunthorpe.", "Hello there!",
                 "", "grasshopper passes"):
        assert scorer.score_text(text) == 0.0, text
    assert WordListScorer(["darn", "dang it"]).score_documents(
        ["Oh darn.", "dang   it", "dangit", "fine"]) == [1.0, 1.0, 0.0, 0.0]


def test_the_classifier_scores_the_worst_sentence():
    scorer = ClassifierScorer()
    clean = "The library opens at nine. We water the garden on Sundays."
    mixed = clean + "\nYou are a stupid fucking idiot."
    [clean_score, mixed_score] = scorer.score_documents([clean, mixed])
    assert clean_score < 0.5 < mixed_score
    assert mixed_score == pytest.approx(max(scorer.score_sentences(split_sentences(mixed))))
    assert scorer.score_documents([""]) == [0.0]


@pytest.mark.parametrize(("id2label", "index"), [
    ({0: "LABEL_0", 1: "LABEL_1"}, 1),
    ({"0": "not_hap", "1": "clean"}, 0),
    ({0: "neutral", 1: "toxic", 2: "positive"}, 1),
    ({0: "Hate", 1: "Normal"}, 0),
])
def test_the_hap_label_comes_from_the_config(id2label, index):
    assert hap_label_index(id2label) == index


def test_a_config_without_a_hap_label_is_refused():
    with pytest.raises(ValueError, match="cannot tell which label"):
        hap_label_index({0: "positive", 1: "negative", 2: "neutral"})


def step_errors(params: dict) -> dict[str, str]:
    with pytest.raises(StepError) as caught:
        validate_steps([{"type": "hap", "params": params}])
    return caught.value.errors


def test_hap_parameters_are_checked_with_clear_errors():
    assert validate_steps([{"type": "hap"}])[0]["params"] == {
        "scorer": "wordlist", "threshold": 0.5, "model": ""}
    assert step_errors({"scorer": "detoxify"}) == {
        "steps[0].params.scorer": "must be one of: wordlist, classifier, model"}
    assert step_errors({"threshold": 1.5}) == {
        "steps[0].params.threshold": "must be between 0 and 1"}
    assert "required with scorer 'model'" in step_errors({"scorer": "model"})[
        "steps[0].params.model"]
    assert "is not a model version; write name:vN" in step_errors(
        {"scorer": "model", "model": "granite-guardian-hap-38m"})["steps[0].params.model"]
    assert "only scorer 'model' uses a model" in step_errors(
        {"scorer": "classifier", "model": "hap:v1"})["steps[0].params.model"]
    ok = validate_steps([{"type": "hap", "params": {"scorer": "model",
                                                    "model": "granite-guardian-hap-38m:v2"}}])
    assert ok[0]["params"]["model"] == "granite-guardian-hap-38m:v2"


# -- the runner on the fixture ------------------------------------------------------------------
def run_hap(base: Path, params: dict, models: dict | None = None) -> tuple[dict, dict]:
    """Runs [normalize, hap] on the fixture; returns (kept id -> text, the hap step's funnel)."""
    input_dir = base / "input"
    input_dir.mkdir(parents=True)
    (input_dir / "part-000.jsonl").write_text(FIXTURE.read_text())
    spec = base / "spec.json"
    spec.write_text(json.dumps({
        "run": 1, "input": {"path": str(input_dir), "format": "jsonl"},
        "output_dir": str(base / "out"), "work_dir": str(base / "work"),
        "steps": [{"type": "normalize"}, {"type": "hap", "params": params}],
        "tokenizer_path": None, **({"models": models} if models is not None else {}),
    }))
    code, stdout, err = finish(start(spec))
    assert code == 0, err
    steps = [e["data"] for e in events(stdout) if e["kind"] == "data_step"]
    return read_output(base / "out"), steps[1]


def assert_drops_exactly_above_threshold(kept: dict, funnel: dict, scores: dict[str, float],
                                         threshold: float) -> None:
    above = {doc_id for doc_id, score in scores.items() if score > threshold}
    assert set(kept) == set(scores) - above
    assert funnel["docs_in"] == len(scores)
    assert funnel["dropped"] == ({"hap": len(above)} if above else {})
    assert funnel["samples"] and all(s["reason"] == "hap" and s["id"] in above
                                     for s in funnel["samples"])


@pytest.mark.parametrize(("scorer", "least_recall", "least_precision"), [
    ("wordlist", 0.6, 0.85),
    ("classifier", 0.9, 0.9),
])
def test_the_hap_step_drops_what_the_fixture_labels_abusive(tmp_path, scorer, least_recall,
                                                             least_precision):
    records = fixture_records()
    kept, funnel = run_hap(tmp_path, {"scorer": scorer})
    scoring = WordListScorer() if scorer == "wordlist" else ClassifierScorer()
    scores = dict(zip([r["id"] for r in records],
                      scoring.score_documents([r["text"] for r in records]), strict=True))
    assert_drops_exactly_above_threshold(kept, funnel, scores, 0.5)
    abusive = {r["id"] for r in records if r["metadata"]["hap"]}
    dropped = set(scores) - set(kept)
    assert len(abusive & dropped) / len(abusive) >= least_recall
    assert len(abusive & dropped) / len(dropped) >= least_precision
    for record in records:  # what is kept is kept unchanged (the fixture is normalised text)
        if record["id"] in kept:
            assert kept[record["id"]] == record["text"]


def test_the_threshold_decides_what_is_dropped(tmp_path):
    records = fixture_records()
    scores = dict(zip([r["id"] for r in records], ClassifierScorer().score_documents(
        [r["text"] for r in records]), strict=True))
    kept, funnel = run_hap(tmp_path, {"scorer": "classifier", "threshold": 0.99})
    assert_drops_exactly_above_threshold(kept, funnel, scores, 0.99)
    assert len(kept) > sum(score <= 0.5 for score in scores.values())


@pytest.fixture(scope="module")
def tiny_hap_model(tmp_path_factory) -> Path:
    """A tiny BERT sequence classifier (LABEL_0 clean, LABEL_1 HAP, as granite-guardian-hap-38m)
    with a word-level tokenizer, trained for a few seconds on the fixture and saved like a
    registry version's folder."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.trainers import WordLevelTrainer
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    records = fixture_records()
    texts = [r["text"] for r in records]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, WordLevelTrainer(
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]",
                                   unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   model_max_length=128)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, max_position_embeddings=128,
        num_labels=2))
    assert model.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = fast(texts, padding=True, truncation=True, return_tensors="pt")
    labels = torch.tensor([int(r["metadata"]["hap"]) for r in records])
    model.train()
    for _ in range(60):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("tiny-hap")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def test_the_model_scorer_runs_a_registry_folder(tmp_path, tiny_hap_model):
    records = fixture_records()
    scorer = ModelScorer(str(tiny_hap_model), batch_size=16)
    assert scorer.label == 1
    scores = dict(zip([r["id"] for r in records],
                      scorer.score_documents([r["text"] for r in records]), strict=True))
    kept, funnel = run_hap(tmp_path, {"scorer": "model", "model": "tiny-hap:v1"},
                           models={"tiny-hap:v1": str(tiny_hap_model)})
    assert_drops_exactly_above_threshold(kept, funnel, scores, 0.5)
    abusive = {r["id"] for r in records if r["metadata"]["hap"]}
    assert len(abusive - set(kept)) / len(abusive) >= 0.8


def test_the_runner_needs_the_models_folder(tmp_path):
    input_dir = tmp_path / "input"
    input_dir.mkdir()
    (input_dir / "part-000.jsonl").write_text(FIXTURE.read_text())
    spec = tmp_path / "spec.json"
    base = {"run": 1, "input": {"path": str(input_dir), "format": "jsonl"},
            "output_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "steps": [{"type": "hap", "params": {"scorer": "model", "model": "m:v1"}}]}
    for models, message in (
        (None, "steps[0].params.model: the spec gives no local folder for m:v1"),
        ({"m:v1": "relative/dir"}, "models.m:v1: must be an absolute path"),
        ({"m:v1": str(tmp_path / "missing")}, "does not exist"),
    ):
        spec.write_text(json.dumps({**base, "models": models}))
        code, _, err = finish(start(spec))
        assert code == 1 and message in err, err

