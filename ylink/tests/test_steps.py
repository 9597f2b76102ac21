"""The step catalogue and validate_steps (pure Python), and that the runner builds every step."""

import json

import pytest

from ylink.steps import DEFAULT_PIPELINE, STEP_TYPES, StepError, catalogue, validate_steps


def errors_of(steps) -> dict[str, str]:
    with pytest.raises(StepError) as caught:
        validate_steps(steps)
    return caught.value.errors


def test_defaults_are_filled_in():
    steps = validate_steps([{"type": "minhash_dedup"}, {"type": "length_filter",
                                                         "params": {"min_chars": 10}}])
    assert steps[0] == {"type": "minhash_dedup", "params": {
        "n_grams": 4, "num_buckets": 20, "hashes_per_bucket": 5, "seed": 1}}
    assert steps[1]["params"] == {"min_chars": 10, "max_chars": 1_000_000, "min_words": 0}


def test_default_pipeline_is_valid_and_ends_with_tokenize():
    steps = validate_steps(DEFAULT_PIPELINE)
    assert [s["type"] for s in steps][-1] == "tokenize"
    # every step but the opt-in hap filter (it drops text a corpus may need)
    assert {s["type"] for s in steps} == set(STEP_TYPES) - {"hap"}


def test_unknown_step_type_names_the_known_ones():
    errors = errors_of([{"type": "normalize"}, {"type": "language_id"}])
    assert list(errors) == ["steps[1].type"]
    message = errors["steps[1].type"]
    assert "unknown step type 'language_id'" in message
    assert "normalize" in message and "minhash_dedup" in message


def test_unknown_parameter_lists_the_known_ones():
    errors = errors_of([{"type": "length_filter", "params": {"min_len": 5}}])
    assert errors == {"steps[0].params.min_len":
                      "unknown parameter 'min_len'; known: min_chars, max_chars, min_words"}


@pytest.mark.parametrize(("step", "place", "message"), [
    ({"type": "gopher_repetition", "params": {"dup_line_frac": 1.5}},
     "steps[0].params.dup_line_frac", "must be between 0 and 1"),
    ({"type": "minhash_dedup", "params": {"num_buckets": 0}},
     "steps[0].params.num_buckets", "must be between 1 and 256"),
    ({"type": "tokenize", "params": {"seq_len": 4}},
     "steps[0].params.seq_len", "must be between 8 and 1048576"),
    ({"type": "length_filter", "params": {"min_chars": 500, "max_chars": 100}},
     "steps[0].params.max_chars", "must be at least min_chars (500)"),
])
def test_out_of_range_values(step, place, message):
    assert errors_of([step]) == {place: message}


@pytest.mark.parametrize(("value", "message"), [
    ("5", "must be an integer"),
    (True, "must be an integer"),
    (2.5, "must be an integer"),
    (None, "must be an integer"),
])
def test_wrong_type_for_an_integer(value, message):
    errors = errors_of([{"type": "c4_lines", "params": {"min_words_per_line": value}}])
    assert errors == {"steps[0].params.min_words_per_line": message}


def test_wrong_types_for_other_kinds():
    errors = errors_of([
        {"type": "pii", "params": {"emails": "yes", "phone_replacement": 7}},
        {"type": "normalize", "params": {"unicode_form": "NFD"}},
        {"type": "gopher_quality", "params": {"max_symbol_word_ratio": "0.1"}},
    ])
    assert errors == {
        "steps[0].params.emails": "must be true or false",
        "steps[0].params.phone_replacement": "must be a string",
        "steps[1].params.unicode_form": "must be one of: NFC, NFKC, none",
        "steps[2].params.max_symbol_word_ratio": "must be a number",
    }


def test_integral_float_is_accepted_for_an_integer():
    assert validate_steps([{"type": "tokenize", "params": {"seq_len": 128.0}}])[0]["params"][
        "seq_len"] == 128


def test_tokenize_must_be_last_and_single():
    errors = errors_of([{"type": "tokenize"}, {"type": "normalize"}])
    assert errors == {"steps[0].type": "tokenize must be the last step"}
    errors = errors_of([{"type": "exact_dedup"}, {"type": "exact_dedup"}])
    assert errors == {"steps[1].type": "at most one exact_dedup step (already at steps[0])"}


def test_malformed_steps():
    assert errors_of("normalize") == {"steps": "must be a list of steps"}
    assert errors_of([]) == {"steps": "add at least one step"}
    errors = errors_of(["normalize", {"params": {}}, {"type": "pii", "params": [1]},
                        {"type": "pii", "when": "always"}])
    assert set(errors) == {"steps[0]", "steps[1].type", "steps[2].params", "steps[3].when"}
    assert "unknown key 'when'" in errors["steps[3].when"]


def test_several_errors_are_reported_together_by_place():
    errors = errors_of([{"type": "length_filter", "params": {"min_chars": -1}},
                        {"type": "nope"}])
    assert set(errors) == {"steps[0].params.min_chars", "steps[1].type"}
    assert str(StepError(errors)).startswith("steps[0].params.min_chars: must be between")


def test_catalogue_is_json_and_describes_every_parameter():
    described = json.loads(json.dumps(catalogue()))
    assert [step["type"] for step in described] == list(STEP_TYPES)
    for step in described:
        assert step["description"] and step["title"]
        for name, param in step["params"].items():
            assert param["type"] in {"int", "float", "bool", "str", "choice"}, name
            assert param["help"], name
            if param["type"] in {"int", "float"}:
                assert param["min"] <= param["default"] <= param["max"], name
            if param["type"] == "choice":
                assert param["default"] in param["choices"], name


def _extreme(param):
    if param.kind == "bool":
        return not param.default
    if param.kind in ("int", "float"):
        return param.max if param.default != param.max else param.min
    if param.kind == "choice":
        return param.choices[-1]
    return "x"


def test_the_runner_builds_every_per_document_step_with_any_valid_parameters():
    from datatrove.data import Document

    from ylink.runners.data_steps import build_step

    for name, step_type in STEP_TYPES.items():
        if name in ("exact_dedup", "minhash_dedup", "tokenize"):
            continue
        for params in ({}, {p: _extreme(param) for p, param in step_type.params.items()}):
            try:
                step = validate_steps([{"type": name, "params": params}])[0]
            except StepError:  # extremes can break a cross-field rule: keep the defaults
                continue
            built = build_step(step)
            list(built.run(iter([Document(text="Some text. " * 30, id="a")])))
