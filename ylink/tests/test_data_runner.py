"""The data runner end to end on a generated corpus with planted duplicates, PII and junk, with
one and with two replicas; tokenize round trips; bad input."""

import io
import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ylink.runners.data_steps import PIIScrubber
from ylink.runners.report import Reporter
from ylink.runners.samples import synthetic_corpus, write_corpus
from ylink.steps import DEFAULT_PIPELINE

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = [step for step in DEFAULT_PIPELINE if step["type"] != "tokenize"]


def runner_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in {"OGAI_URL", "OGAI_RUN_TOKEN", "RANK", "WORLD_SIZE", "OGAI_ATTEMPT"}}
    env.update(extra)
    return env


def write_spec(path: Path, input_dir: Path, out: Path, work: Path, steps, tokenizer=None) -> Path:
    path.write_text(json.dumps({
        "run": 1, "input": {"path": str(input_dir), "format": "jsonl"},
        "output_dir": str(out), "work_dir": str(work), "steps": steps,
        "tokenizer_path": str(tokenizer) if tokenizer else None,
    }))
    return path


def start(spec: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ylink.runners.data", "--spec", str(spec)],
                            cwd=ROOT, env=runner_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def events(stdout: str) -> list[dict]:
    prefix = "OGAI-EVENT "
    return [json.loads(line[len(prefix):]) for line in stdout.splitlines()
            if line.startswith(prefix)]


def read_output(directory: Path) -> dict[str, str]:
    docs = {}
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert set(record) == {"id", "text", "metadata"}
            assert record["id"] not in docs
            docs[record["id"]] = record["text"]
    return docs


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """One corpus, run with 1 replica and with 2 replicas (all three processes at once)."""
    base = tmp_path_factory.mktemp("planted")
    records = synthetic_corpus(150, seed=7, exact_dups=12, near_dups=24, pii=12, junk=15,
                               js_lines=6)
    write_corpus(records, base / "input", files=3)
    one = write_spec(base / "one.json", base / "input", base / "out1", base / "work1", PIPELINE)
    two = write_spec(base / "two.json", base / "input", base / "out2", base / "work2", PIPELINE)
    processes = [start(one), start(two, RANK="0", WORLD_SIZE="2"),
                 start(two, RANK="1", WORLD_SIZE="2")]
    results = [finish(p) for p in processes]
    for code, _, err in results:
        assert code == 0, err
    return {"records": {r["id"]: r for r in records}, "base": base, "one": results[0],
            "two": results[1], "two_rank1": results[2]}


def test_pipeline_keeps_clean_drops_planted_and_scrubs_pii(planted):
    records = planted["records"]
    out = read_output(planted["base"] / "out1")
    by_kind: dict[str, list[dict]] = {}
    for record in records.values():
        by_kind.setdefault(record["metadata"]["kind"], []).append(record)

    for record in by_kind["clean"]:  # every clean original, unchanged
        assert out.get(record["id"]) == record["text"]
    for kind in ("exact_dup", "junk"):
        kept = [r["id"] for r in by_kind[kind] if r["id"] in out]
        assert kept == [], f"planted {kind} kept: {kept}"
    near = by_kind["near_dup"]
    recall = sum(r["id"] not in out for r in near) / len(near)
    assert recall >= 0.9
    all_text = "\n".join(out.values())
    for record in by_kind["pii"]:
        assert record["id"] in out
        for secret in record["metadata"]["secrets"]:
            assert secret not in all_text
        assert "<PHONE>" in out[record["id"]]
    for record in by_kind["js_line"]:  # the javascript notice line is gone, the rest kept
        assert out[record["id"]] == record["metadata"]["clean"]


def test_step_counts_add_up(planted):
    _code, stdout, _ = planted["one"]
    all_events = events(stdout)
    assert all_events[0]["kind"] == "started" and all_events[-1]["kind"] == "done"
    steps = [e["data"] for e in all_events if e["kind"] == "data_step"]
    assert [s["type"] for s in steps] == [s["type"] for s in PIPELINE]
    assert [s["index"] for s in steps] == list(range(len(PIPELINE)))
    done = all_events[-1]["data"]["output"]
    records = planted["records"]
    assert steps[0]["docs_in"] == len(records) == done["stats"]["input_documents"]
    for before, after in itertools.pairwise(steps):
        assert before["docs_out"] == after["docs_in"]
        assert before["bytes_out"] == after["bytes_in"]
    for step in steps:
        assert step["docs_in"] - step["docs_out"] == sum(step["dropped"].values()), step
        assert len(step["samples"]) <= 5
        assert all(len(sample["text"]) <= 500 for sample in step["samples"])
    assert steps[-1]["docs_out"] == done["documents"] == len(read_output(planted["base"] / "out1"))
    by_type = {s["type"]: s for s in steps}
    planted_kinds = Counter(r["metadata"]["kind"] for r in records.values())
    assert by_type["exact_dedup"]["dropped"] == {"exact_duplicate": planted_kinds["exact_dup"]}
    assert by_type["minhash_dedup"]["dropped"]["near_duplicate"] >= 0.9 * planted_kinds["near_dup"]
    assert by_type["pii"]["changed"] == planted_kinds["pii"]
    # the PII step's samples show the scrubbed text, never the planted values
    secrets = [s for r in records.values() for s in r["metadata"].get("secrets", [])]
    for sample in by_type["pii"]["samples"]:
        assert sample["reason"] == "scrubbed"
        assert not any(secret in sample["text"] for secret in secrets)
    assert sum(by_type["c4_lines"]["dropped"].values()) >= 1
    assert done["format"] == "jsonl" and done["content_hash"].startswith("sha256:")
    assert done["stats"]["length_histogram"]["counts"]
    assert sum(done["stats"]["length_histogram"]["counts"]) == done["documents"]


def test_two_replicas_give_the_same_dataset(planted):
    one = read_output(planted["base"] / "out1")
    two = read_output(planted["base"] / "out2")
    assert set(two.values()) == set(one.values())
    assert two == one  # the same documents (the first of each duplicate group) survive
    assert sorted(p.name for p in (planted["base"] / "out2").glob("*.jsonl")) == [
        "00000.jsonl", "00001.jsonl"]

    steps_one = [e["data"] for e in events(planted["one"][1]) if e["kind"] == "data_step"]
    steps_two = [e["data"] for e in events(planted["two"][1]) if e["kind"] == "data_step"]
    strip = ("seconds", "samples")
    assert [{k: v for k, v in s.items() if k not in strip} for s in steps_two] == [
        {k: v for k, v in s.items() if k not in strip} for s in steps_one]
    done = events(planted["two"][1])[-1]
    assert done["kind"] == "done" and done["data"]["output"]["stats"]["world_size"] == 2
    assert events(planted["two_rank1"][1]) == []  # only rank 0 reports


def run_in_process(spec: Path) -> dict:
    out = io.StringIO()
    from ylink.runners import data

    result = data.run(spec, reporter=Reporter(stdout=out))
    return {"output": result, "events": events(out.getvalue())}


def test_tokenize_round_trip_with_bytes(tmp_path, monkeypatch):
    from ylink.runners.shards import decode_documents, iter_shard_documents, load_meta

    for name in ("RANK", "WORLD_SIZE", "OGAI_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    texts = [r["text"] for r in synthetic_corpus(30, seed=3)]
    texts += ["Ünïcödé — naïve café, 日本語のテキスト 🙂.\n\nTwo  spaces\tand a tab.", "x"]
    write_corpus([{"id": str(i), "text": t} for i, t in enumerate(texts)], tmp_path / "in", 2)
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", tmp_path / "out",
                      tmp_path / "work", [{"type": "tokenize", "params": {"seq_len": 64}}])
    result = run_in_process(spec)

    assert Counter(decode_documents(tmp_path / "out")) == Counter(texts)
    meta = load_meta(tmp_path / "out")
    documents = list(iter_shard_documents(tmp_path / "out"))
    assert all(doc[-1] == meta["eos_id"] == 256 for doc in documents)
    assert meta["documents"] == len(texts) == result["output"]["documents"]
    assert meta["tokens"] == sum(map(len, documents)) == result["output"]["tokens"]
    assert meta["tokens"] == sum(len(t.encode()) + 1 for t in texts)  # one token per byte
    assert (meta["seq_len"], meta["vocab_size"], meta["token_size"]) == (64, 257, 2)
    assert result["output"]["format"] == "tokens"
    step = next(e["data"] for e in result["events"] if e["kind"] == "data_step")
    assert step["docs_in"] == step["docs_out"] == len(texts)


def test_tokenize_round_trip_with_a_trained_bpe(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ylink.runners.shards import decode_documents, load_meta

    for name in ("RANK", "WORLD_SIZE", "OGAI_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    texts = [r["text"] for r in synthetic_corpus(40, seed=5)] + ["Ünïcödé — ok 🙂."]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(tmp_path / "tokenizer.json"))

    write_corpus([{"id": str(i), "text": t} for i, t in enumerate(texts)], tmp_path / "in", 1)
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", tmp_path / "out",
                      tmp_path / "work", [{"type": "tokenize", "params": {"shuffle": False}}],
                      tokenizer=tmp_path)
    result = run_in_process(spec)
    assert list(decode_documents(tmp_path / "out")) == texts  # unshuffled: input order
    meta = load_meta(tmp_path / "out")
    assert meta["vocab_size"] == tokenizer.get_vocab_size() == 600
    assert meta["eos_id"] == tokenizer.token_to_id("<|endoftext|>")
    assert meta["tokens"] < sum(len(t.encode()) for t in texts) / 2  # merges were used
    assert result["output"]["tokens"] == meta["tokens"]


def test_missing_input_directory_fails_with_one_line(tmp_path):
    spec = write_spec(tmp_path / "spec.json", tmp_path / "nowhere", tmp_path / "out",
                      tmp_path / "work", PIPELINE)
    code, out, err = finish(start(spec), timeout=60)
    assert code != 0
    assert err.strip().splitlines() == [
        f"error: input.path: directory {tmp_path / 'nowhere'} does not exist"]
    failed = [e for e in events(out) if e["kind"] == "failed"]
    assert failed and "does not exist" in failed[0]["data"]["message"]


def test_bad_steps_fail_before_any_work(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello"}\n')
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", tmp_path / "out",
                      tmp_path / "work", [{"type": "minhash_dedup", "params": {"n_gram": 3}}])
    code, _, err = finish(start(spec), timeout=60)
    assert code != 0
    assert err.strip() == ("error: steps[0].params.n_gram: unknown parameter 'n_gram'; known: "
                           "n_grams, num_buckets, hashes_per_bucket, seed")
    assert not (tmp_path / "out").exists()


def test_unreadable_jsonl_line_names_file_and_line(tmp_path):
    records = [{"id": str(i), "text": t["text"]} for i, t in enumerate(synthetic_corpus(8))]
    paths = write_corpus(records, tmp_path / "in", files=2)
    lines = paths[1].read_text().splitlines()
    lines.insert(2, '{"id": "broken", "text": "unterminated')
    paths[1].write_text("\n".join(lines) + "\n")
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", tmp_path / "out",
                      tmp_path / "work", [{"type": "normalize"}, {"type": "exact_dedup"}])
    # two replicas: rank 1 reads the broken file, rank 0 learns it at the next barrier
    rank0, rank1 = start(spec, RANK="0", WORLD_SIZE="2"), start(spec, RANK="1", WORLD_SIZE="2")
    (code0, out0, err0), (code1, out1, err1) = finish(rank0), finish(rank1)
    assert code1 != 0 and code0 != 0
    assert len(err1.strip().splitlines()) == 1
    assert err1.strip().startswith(f"error: {paths[1]}: line 3: not valid JSON")
    assert [e["data"]["message"] for e in events(out1) if e["kind"] == "failed"] == [
        err1.strip()[len("error: "):]]
    assert err0.strip().splitlines() == [f"error: replica 1 failed: {err1.strip()[7:]}"]
    assert [e["kind"] for e in events(out0)] == ["started"]  # rank 0 neither done nor failed
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-written left behind


def test_a_failure_while_writing_leaves_no_output(tmp_path):
    records = [{"id": str(i), "text": t["text"]} for i, t in enumerate(synthetic_corpus(6))]
    paths = write_corpus(records, tmp_path / "in", files=2)
    paths[1].write_text(paths[1].read_text() + '["not", "an", "object"]\n')
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", tmp_path / "out",
                      tmp_path / "work", [{"type": "normalize"}])
    code, out, err = finish(start(spec), timeout=60)
    assert code != 0
    assert err.strip() == f"error: {paths[1]}: line 4: expected a JSON object, got list"
    assert [e["kind"] for e in events(out)] == ["started", "failed"]
    assert list((tmp_path / "out").iterdir()) == []  # the 3 documents of file 0 are gone too


def test_phone_email_and_ip_scrubbing():
    scrub = PIIScrubber()
    for phone in ["(555) 123-4567", "555-123-4567", "+1 555 123 4567", "555.123.4567",
                  "+44 20 7946 0958", "+33 1 42 68 53 00"]:
        assert scrub.format(f"Call {phone} today.") == "Call <PHONE> today.", phone
    for kept in ["Version 1.2.3 of 2023-10-12", "order 1234567890", "10.5 kg at 3.30 pm"]:
        assert scrub.format(kept) == kept
    text = scrub.format("Mail ann.lee@corp.example.com from 192.168.1.20 or 8.8.8.8.")
    assert "ann.lee" not in text and "192.168.1.20" not in text and "8.8.8.8" not in text
    # the placeholder depends on the address only, not on what was scrubbed before (so the
    # output does not depend on how documents were split over replicas)
    first = PIIScrubber().format("ann@corp.example.com 8.8.8.8")
    other = PIIScrubber()
    other.format("bob@x.org carl@y.org 1.1.1.1 9.9.9.9")
    assert other.format("ann@corp.example.com 8.8.8.8") == first
    public_only = PIIScrubber(only_public_ips=True)
    assert "192.168.1.20" in public_only.format("host 192.168.1.20 and 8.8.8.8")


def test_pii_scrubbing_reaches_the_prompt_and_response_fine_tunes_train_on():
    from datatrove.data import Document

    doc = Document(text="Mail ann@example.org\nCall +1 415 555 0100", id="1",
                   metadata={"prompt": "Mail ann@example.org", "response": "Call +1 415 555 0100"})
    [scrubbed] = PIIScrubber().run(iter([doc]))
    for text in (scrubbed.text, scrubbed.metadata["prompt"], scrubbed.metadata["response"]):
        assert "ann@example.org" not in text and "555 0100" not in text
