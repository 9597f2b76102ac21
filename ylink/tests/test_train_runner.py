"""The training runner (`python -m ylink.runners.train`) on tiny models, CPU only.

A corpus is generated, a tokenizer trained on it by the runner, the corpus packed into token
shards with datatrove's DocumentTokenizer (as the `tokenize` pipeline step does), a model well
under a million parameters pretrained on them, then fine-tuned with LoRA. Events are read from
the `OGAI-EVENT {json}` lines the runner prints.
"""

import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ylink.runners import train
from ylink.runners.samples import (
    sample_corpus,
    sample_instructions,
    write_jsonl,
    write_token_dataset,
)
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.data import (
    IGNORE_INDEX,
    SampleOrder,
    collate_instructions,
    encode_instruction,
    rank_counters,
)

REPO = Path(__file__).resolve().parents[2]
CONTEXT = 64


def events_of(text: str) -> list[dict]:
    return [json.loads(line[len("OGAI-EVENT "):]) for line in text.splitlines()
            if line.startswith("OGAI-EVENT ")]


def of_kind(events: list[dict], kind: str) -> list[dict]:
    return [event["data"] for event in events if event["kind"] == kind]


def child_env(checkpoints: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OGAI_URL", "OGAI_RUN_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({"OGAI_CHECKPOINT_DIR": str(checkpoints), "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1", **extra})
    return env


def run_in_process(spec: dict, work: Path, checkpoints: Path) -> tuple[int, list[dict]]:
    """The runner's main() in this process (saves ~5 s of imports per run)."""
    spec_path = work / f"spec-{spec['run']}.json"
    spec_path.write_text(json.dumps(spec))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        for name in ("OGAI_URL", "OGAI_RUN_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            patch.delenv(name, raising=False)
        patch.setenv("OGAI_CHECKPOINT_DIR", str(checkpoints))
        code = train.main(["--spec", str(spec_path)])
    return code, events_of(out.getvalue())


def pretrain_spec(tokens: Path, output: Path, run: int = 1, **training) -> dict:
    return {
        "run": run, "kind": "pretrain", "data": {"path": str(tokens), "format": "tokens"},
        "output_dir": str(output),
        "model": {"preset": "tiny", "architecture": "gpt2", "context_length": CONTEXT},
        "training": {"max_steps": 60, "batch_size": 8, "lr": 3e-3, "warmup_steps": 5,
                     "checkpoint_every": 20, "log_every": 5, **training},
    }


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Runs in this process use one thread, as the subprocesses do: tiny models gain nothing
    from more, and two threads on two shared cores stall each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    return write_jsonl(work / "corpus", sample_corpus(300, seed=3))


@pytest.fixture(scope="module")
def tokenizer_run(work, corpus):
    spec = {"run": 10, "kind": "tokenizer", "data": {"path": str(corpus), "format": "jsonl"},
            "output_dir": str(work / "tokenizer"),
            "tokenizer": {"vocab_size": 512, "min_frequency": 2}}
    code, events = run_in_process(spec, work, work / "tokenizer-checkpoints")
    assert code == 0, events
    return work / "tokenizer", events


@pytest.fixture(scope="module")
def tokens(work, tokenizer_run) -> Path:
    texts = [json.loads(line)["text"]
             for line in (work / "corpus" / "part-00000.jsonl").read_text().splitlines()]
    write_token_dataset(texts, work / "tokens", seq_len=CONTEXT,
                        tokenizer_json=tokenizer_run[0] / "tokenizer.json")
    return work / "tokens"


@pytest.fixture(scope="module")
def pretrained(work, tokens):
    code, events = run_in_process(pretrain_spec(tokens, work / "model"), work,
                                  work / "model-checkpoints")
    assert code == 0, events
    return work / "model", events


def test_tokenizer_kind_trains_and_round_trips_text(tokenizer_run):
    from transformers import AutoTokenizer

    directory, events = tokenizer_run
    done = of_kind(events, "done")[-1]["output"]
    assert done["artifact"] == "tokenizer" and done["path"] == str(directory.resolve())
    assert 300 < done["vocab_size"] <= 512 and done["documents"] == 300
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    text = "The old man paints a warm coat near the school. Ünïcödé — 日本語 ok?\n  tabs\t."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    # Merges learnt from the corpus: its words take fewer tokens than bytes.
    common = "the teacher cleans the blue car before dinner."
    assert len(tokenizer.encode(common, add_special_tokens=False)) < len(common) / 2
    assert tokenizer.eos_token == "<|endoftext|>"


def test_pretraining_loss_decreases_and_the_model_loads_and_generates(pretrained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, events = pretrained
    started = of_kind(events, "started")[0]
    assert started["resumed_from_step"] is None and started["world_size"] == 1
    assert started["parameters"] < 1_000_000
    metrics = of_kind(events, "metric")
    assert [m["step"] for m in metrics] == list(range(5, 61, 5))
    losses = [m["loss"] for m in metrics]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert metrics[-1]["tokens"] == 60 * 8 * CONTEXT
    assert [c["step"] for c in of_kind(events, "checkpoint")] == [20, 40, 60]
    done = of_kind(events, "done")[-1]["output"]
    assert done["artifact"] == "model" and done["steps"] == 60
    assert done["final_loss"] == pytest.approx(losses[-1], rel=1e-4)

    model = AutoModelForCausalLM.from_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert model.num_parameters() == done["parameters"] < 1_000_000
    prompt = tokenizer("The cat", return_tensors="pt").input_ids
    generated = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert generated.shape[1] > prompt.shape[1]
    assert tokenizer.decode(generated[0]).startswith("The cat")


def test_sigkill_mid_run_resumes_from_the_newest_checkpoint(work, tokens):
    checkpoints = work / "kill-checkpoints"
    spec = pretrain_spec(tokens, work / "killed", run=2, max_steps=150, batch_size=8,
                         checkpoint_every=10, log_every=1, keep_checkpoints=2)
    spec_path = work / "spec-kill.json"
    spec_path.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "ylink.runners.train", "--spec", str(spec_path)]

    first = subprocess.Popen(command, cwd=REPO, env=child_env(checkpoints, OGAI_ATTEMPT="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in first.stdout],
                     daemon=True).start()
    first_events, checkpointed = [], None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        first_events += events_of(line)
        if checkpointed is None and of_kind(first_events, "checkpoint"):
            checkpointed = of_kind(first_events, "checkpoint")[0]["step"]
        metrics = of_kind(first_events, "metric")
        if checkpointed and metrics and metrics[-1]["step"] >= checkpointed + 3:
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=30)
    time.sleep(0.2)
    while not lines.empty():
        first_events += events_of(lines.get())
    assert first.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not of_kind(first_events, "done")
    newest = CheckpointStore(checkpoints).latest()
    assert newest is not None and newest[0] >= checkpointed
    assert len(CheckpointStore(checkpoints).complete()) <= 2

    second = subprocess.run(command, cwd=REPO, env=child_env(checkpoints, OGAI_ATTEMPT="2"),
                            capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr[-2000:]
    second_events = events_of(second.stdout)
    started = of_kind(second_events, "started")[0]
    assert started["attempt"] == 2 and started["resumed_from_step"] == newest[0]
    second_steps = [m["step"] for m in of_kind(second_events, "metric")]
    assert second_steps == list(range(newest[0] + 1, 151))  # no step reported twice
    first_steps = [m["step"] for m in of_kind(first_events, "metric")]
    assert set(first_steps) | set(second_steps) == set(range(1, 151))
    assert of_kind(second_events, "done")[-1]["output"]["steps"] == 150
    assert of_kind(second_events, "progress")[-1]["step"] == 150
    # Resumed exactly: the steps trained again after the checkpoint give the same losses, and
    # the token count continues.
    first_losses = {m["step"]: m for m in of_kind(first_events, "metric")}
    for metric in of_kind(second_events, "metric"):
        if metric["step"] in first_losses:
            again = first_losses[metric["step"]]
            assert metric["loss"] == pytest.approx(again["loss"], rel=1e-4)
            assert metric["lr"] == pytest.approx(again["lr"])
            assert metric["tokens"] == again["tokens"]


def test_sigterm_saves_a_checkpoint_of_the_last_step_and_exits_143(work, tokens):
    checkpoints = work / "term-checkpoints"
    spec = pretrain_spec(tokens, work / "stopped", run=7, max_steps=5000, checkpoint_every=1000,
                         log_every=1)
    spec_path = work / "spec-term.json"
    spec_path.write_text(json.dumps(spec))
    process = subprocess.Popen(
        [sys.executable, "-m", "ylink.runners.train", "--spec", str(spec_path)], cwd=REPO,
        env=child_env(checkpoints), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    seen = []
    for line in process.stdout:
        seen += events_of(line)
        if len(of_kind(seen, "metric")) >= 5:
            process.send_signal(signal.SIGTERM)
            break
    rest, _ = process.communicate(timeout=60)
    seen += events_of(rest)
    assert process.returncode == 143
    last_step = of_kind(seen, "metric")[-1]["step"]
    assert 5 <= last_step < 1000
    assert [c["step"] for c in of_kind(seen, "checkpoint")] == [last_step]
    assert CheckpointStore(checkpoints).latest()[0] == last_step
    assert not of_kind(seen, "done") and not of_kind(seen, "failed")


def test_lora_on_the_pretrained_model_saves_an_adapter_that_loads_and_generates(
        work, pretrained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = pretrained[0]
    instructions = write_jsonl(work / "instructions", sample_instructions(80, seed=1))
    spec = {"run": 3, "kind": "lora", "data": {"path": str(instructions), "format": "jsonl"},
            "output_dir": str(work / "adapter"), "base_model_path": str(base_dir),
            "lora": {"r": 4, "alpha": 8},
            "training": {"max_steps": 24, "batch_size": 8, "lr": 1e-2, "warmup_steps": 2,
                         "checkpoint_every": 12, "log_every": 4}}
    code, events = run_in_process(spec, work, work / "adapter-checkpoints")
    assert code == 0, events
    done = of_kind(events, "done")[-1]["output"]
    assert done["artifact"] == "adapter" and done["steps"] == 24
    started = of_kind(events, "started")[0]
    assert 0 < started["trainable_parameters"] < started["parameters"] / 10
    losses = [m["loss"] for m in of_kind(events, "metric")]
    assert losses[-1] < losses[0], losses

    adapter_dir = work / "adapter"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["target_modules"] == ["c_attn"] and config["fan_in_fan_out"] is True
    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir))
    prompt = tokenizer("What is 3 plus 4?\n", return_tensors="pt").input_ids
    with torch.no_grad():
        base_logits = base(prompt).logits
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    with torch.no_grad():
        tuned_logits = model(prompt).logits
    assert not torch.allclose(base_logits, tuned_logits)  # the adapter changes the model
    generated = model.generate(prompt, max_new_tokens=10, do_sample=False)
    assert generated.shape[1] > prompt.shape[1]


def test_prompt_tokens_are_masked_and_eos_is_learnt(tokenizer_run):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_run[0]))
    eos = tokenizer.eos_token_id
    ids, labels = encode_instruction(tokenizer, "What is 2 plus 2?", "4.", eos, 64)
    prompt_len = len(tokenizer.encode("What is 2 plus 2?\n", add_special_tokens=False))
    assert labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert labels[prompt_len:] == ids[prompt_len:] and ids[-1] == eos
    assert tokenizer.decode(ids[prompt_len:-1]) == "4."
    # Too long: the prompt is cut from the left, the response kept.
    long_ids, long_labels = encode_instruction(tokenizer, "word " * 100, "4.", eos, 16)
    assert len(long_ids) == 16 and long_labels[-1] == eos and long_labels[0] == IGNORE_INDEX

    batch = collate_instructions([(ids, labels), (ids[:5], labels[:5])], pad_id=eos)
    assert batch.input_ids.shape == batch.labels.shape == (2, len(ids) - 1)
    # Targets are the next tokens; prompt and padding positions carry no loss.
    assert batch.labels[0].tolist() == labels[1:]
    assert (batch.labels[1, 4:] == IGNORE_INDEX).all()
    assert batch.tokens == len(ids) - 1 + 4


def test_two_ddp_processes_train_the_same_steps_as_one_with_the_whole_batch(work, tokens):
    """A gang of 2 (gloo, CPU) with batch 4 each reads disjoint halves of what one process with
    batch 8 reads, so every step's loss matches."""
    spec = pretrain_spec(tokens, work / "ddp", run=4, max_steps=4, batch_size=4, log_every=1,
                         checkpoint_every=2)
    spec["model"]["architecture"] = "llama"
    spec_path = work / "spec-ddp.json"
    spec_path.write_text(json.dumps(spec))
    gang = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", "-m", "ylink.runners.train", "--spec", str(spec_path)],
        cwd=REPO, env=child_env(work / "ddp-checkpoints"), capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert gang.returncode == 0, gang.stderr[-3000:]
    gang_events = events_of(gang.stdout)
    assert of_kind(gang_events, "started")[0]["world_size"] == 2
    assert of_kind(gang_events, "started")[0]["distributed"] == "ddp"
    assert len(of_kind(gang_events, "started")) == 1  # only rank 0 reports

    single = pretrain_spec(tokens, work / "single", run=5, max_steps=4, batch_size=8,
                           log_every=1, checkpoint_every=4)
    single["model"]["architecture"] = "llama"
    code, single_events = run_in_process(single, work, work / "single-checkpoints")
    assert code == 0
    gang_metrics, single_metrics = of_kind(gang_events, "metric"), of_kind(single_events,
                                                                           "metric")
    assert [m["step"] for m in gang_metrics] == [1, 2, 3, 4]
    for ours, theirs in zip(gang_metrics, single_metrics, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
        assert ours["tokens"] == theirs["tokens"]


def test_a_bad_spec_exits_2_with_one_clear_line_and_a_failed_event(work):
    spec_path = work / "spec-bad.json"
    spec_path.write_text(json.dumps(pretrain_spec(work / "tokens", work / "bad", lr=7)))
    result = subprocess.run([sys.executable, "-m", "ylink.runners.train", "--spec",
                             str(spec_path)], cwd=REPO, env=child_env(work / "bad-ckpt"),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.lr: must be between" in lines[0]
    failed = of_kind(events_of(result.stdout), "failed")
    assert failed and "training.lr" in failed[0]["message"]
    assert not (work / "bad").exists()


def test_a_context_longer_than_the_shards_is_refused(work, tokens):
    spec = pretrain_spec(tokens, work / "too-long", run=6)
    spec["model"]["context_length"] = CONTEXT * 2
    code, events = run_in_process(spec, work, work / "too-long-checkpoints")
    assert code == 2
    assert "seq_len 64" in of_kind(events, "failed")[0]["message"]


def test_checkpoint_store_never_takes_a_partial_save_for_a_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    store = CheckpointStore(root, keep=2)

    def write(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(b"x" * 10)

    def crash(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(b"half")
        raise OSError("disk full")

    for step in (5, 10, 15):
        path, size = store.save(step, write, {"kind": "pretrain"})
        assert path.name == f"step-{step}" and size > 10
    with pytest.raises(OSError):
        store.save(20, crash, {"kind": "pretrain"})
    assert [step for step, _ in store.complete()] == [10, 15]  # keeps the newest two
    assert store.latest()[0] == 15
    assert any(p.name.startswith(".tmp-step-20") for p in root.iterdir())
    store.remove_partial()
    assert sorted(p.name for p in root.iterdir()) == ["step-10", "step-15"]


def test_each_replica_reads_a_disjoint_share_and_epochs_cover_every_window():
    shares = [rank_counters(96, rank=r, world_size=3, batch_size=4, grad_accum=2)
              for r in range(3)]
    flat = [c for share in shares for micro in share for c in micro]
    assert sorted(flat) == list(range(96, 96 + 24))  # disjoint, together the whole step
    order = SampleOrder(50, seed=1)
    first_epoch = [order(i) for i in range(50)]
    second_epoch = [order(i) for i in range(50, 100)]
    assert sorted(first_epoch) == sorted(second_epoch) == list(range(50))
    assert first_epoch != second_epoch and first_epoch != list(range(50))
