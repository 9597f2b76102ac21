"""Prompt tuning and multi-task prompt tuning through the training runner, CPU only.

The base is a tiny GPT-2 built here from a preset with a word-level tokenizer (no download, no
pretraining: a frozen random model is enough for a prompt to steer). Two toy tasks answer the
same prompts differently, so only the task's prompt can tell which answer is wanted.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from ylink import storage
from ylink.presets import (
    PRESETS,
    SpecError,
    estimate_prompt_tuning_parameters,
    validate_train_spec,
)
from ylink.runners.samples import write_jsonl
from ylink.runners.training.checkpoints import CheckpointStore
from ylink.runners.training.prompt_tuning import TASKS_FILE
from ylink.tests.test_train_runner import of_kind, run_in_process

CONTEXT = 48
WIDTH = PRESETS["tiny"]["gpt2"]["n_embd"]
ANSWERS = {"colour": ["red", "green", "blue"], "animal": ["cat", "dog", "bird"]}
CUED = 0.5  # the share of the base's examples whose context names the task's kind of answer
WORDS = ["red", "green", "blue", "cat", "dog", "bird", "one", "two", "three", "yes", "no",
         "small", "big", "say", "is", "it", "?"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prompt-tuning")


@pytest.fixture(scope="module")
def base(work) -> Path:
    """A random tiny GPT-2 and its tokenizer, saved as a fine-tune's base."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2LMHeadModel

    from ylink.runners.training.common import build_config, save_tokenizer_files

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = work / "base"
    save_tokenizer_files(tokenizer, folder, eos_id=0, model_max_length=CONTEXT)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(build_config("gpt2", "tiny", len(vocab), CONTEXT, 0))
    _learn_the_format(model, folder)
    model.save_pretrained(str(folder))
    return folder


def _learn_the_format(model, folder: Path) -> None:
    """Full steps on both tasks mixed: the base learns the answers' format, not which task is
    asked (the prompts do not say): that is left for the tuned prompts. A random prefix of 0-6
    words makes text after a prefix (and so a prompt) familiar, and in half the examples one
    of them is a word of the task's answers: the base learns that context can steer, as a
    pretrained model knows, so a prompt has something to find (without it a frozen model this
    small steers on some machines' arithmetic and not on others')."""
    import random

    from transformers import AutoTokenizer

    from ylink.runners.training.data import IGNORE_INDEX, collate_instructions, encode_instruction

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    records = two_tasks(64, seed=9)
    examples = [encode_instruction(tokenizer, r["metadata"]["prompt"], r["metadata"]["response"],
                                   0, CONTEXT) for r in records]
    rng = random.Random(4)  # noqa: S311 - sample data
    for index, (ids, labels) in enumerate(examples):
        prefix = [rng.randrange(2, len(tokenizer)) for _ in range(rng.randint(0, 6))]
        if rng.random() < CUED:  # a word of the task's answers somewhere in the context
            cue = tokenizer.convert_tokens_to_ids(
                rng.choice(ANSWERS[records[index]["metadata"]["task"]]))
            prefix.insert(rng.randint(0, len(prefix)), cue)
        examples[index] = ([*prefix, *ids], [IGNORE_INDEX] * len(prefix) + labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(120):
        batch = collate_instructions(examples[(step * 16) % 64:][:16], 0)
        logits = model(input_ids=batch.input_ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1),
            ignore_index=IGNORE_INDEX)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def two_tasks(count: int, seed: int = 0, tasks=("colour", "animal")) -> list[dict]:
    """The same questions; task colour answers with colours, task animal with animals."""
    import random

    rng = random.Random(seed)  # noqa: S311 - sample data
    records = []
    for index in range(count):
        task = tasks[index % len(tasks)]
        prompt = f"say {rng.choice(['one', 'two', 'three'])} {rng.choice(['small', 'big'])} ?"
        response = " ".join(rng.choice(ANSWERS[task]) for _ in range(3))
        records.append({"id": f"r{index}", "text": f"{prompt}\n{response}",
                        "metadata": {"prompt": prompt, "response": response, "task": task}})
    return records


def fell(losses: list[float]) -> float:
    """The last five logged losses' mean over the first three's (each one batch: noisy). On
    these tasks it cannot fall far: each answer word is drawn from three, so a prompt that
    names the task takes the loss per token from at most (ln 6 + 2 ln 3) / 4 to 3 ln 3 / 4,
    0.82 of it; `answer_share` is what shows a prompt steering."""
    return (sum(losses[-5:]) / 5) / (sum(losses[:3]) / 3)


def spec_of(kind: str, data: Path, output: Path, base: Path, run: int, *, prompt=None,
            **training) -> dict:
    return {"run": run, "kind": kind, "data": {"path": str(data), "format": "jsonl"},
            "output_dir": str(output), "base_model_path": str(base),
            "prompt_tuning": {"num_virtual_tokens": 4, **(prompt or {})},
            "training": {"max_steps": 30, "batch_size": 8, "lr": 0.1, "warmup_steps": 2,
                         "weight_decay": 0.0, "checkpoint_every": 30, "log_every": 5,
                         **training}}


@pytest.fixture(scope="module")
def data(work) -> Path:
    return write_jsonl(work / "two-tasks", two_tasks(96))


@pytest.fixture(scope="module")
def multitask(work, data, base):
    spec = spec_of("multitask_prompt_tuning", data, work / "mpt", base, 1,
                   prompt={"num_ranks": 2}, log_every=1)
    code, events = run_in_process(spec, work, work / "mpt-checkpoints")
    assert code == 0, events
    return work / "mpt", events


def answer_share(model, tokenizer, task: str, **extra) -> float:
    """The share of `task`'s answers in the next-word probability both tasks' answers get
    after each question the data asks (their mean)."""
    vocab = tokenizer.get_vocab()
    shares = []
    for count in ("one", "two", "three"):
        for size in ("small", "big"):
            ids = tokenizer(f"say {count} {size} ?\n", return_tensors="pt").input_ids
            with torch.no_grad():
                probs = model(input_ids=ids, **extra).logits[0, -1].softmax(-1)
            mass = {name: float(sum(probs[vocab[word]] for word in words))
                    for name, words in ANSWERS.items()}
            shares.append(mass[task] / sum(mass.values()))
    return sum(shares) / len(shares)


def test_prompt_tuning_trains_as_many_parameters_as_peft_formula_and_loss_falls(
        work, data, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    # The task the base leans away from (by its machine's arithmetic it may lean either way):
    # only a prompt that learnt can steer it there.
    plain = AutoModelForCausalLM.from_pretrained(str(base)).eval()
    task = min(ANSWERS, key=lambda name: answer_share(plain, tokenizer, name))
    assert answer_share(plain, tokenizer, task) <= 0.5
    examples = write_jsonl(work / task, two_tasks(64, seed=2, tasks=(task,)))
    spec = spec_of("prompt_tuning", examples, work / "pt", base, 2, lr=0.3, log_every=1)
    code, events = run_in_process(spec, work, work / "pt-checkpoints")
    assert code == 0, events
    started = of_kind(events, "started")[0]
    # PromptEmbedding: virtual tokens x token dim x transformer submodules (1 for causal LMs).
    assert started["trainable_parameters"] == 4 * WIDTH * 1
    assert estimate_prompt_tuning_parameters("gpt2", "tiny", 4) == 4 * WIDTH
    losses = [m["loss"] for m in of_kind(events, "metric")]
    assert fell(losses) < 1, losses
    done = of_kind(events, "done")[-1]["output"]
    assert done["artifact"] == "adapter" and done["parameters"] == 4 * WIDTH
    config = json.loads((work / "pt" / "adapter_config.json").read_text())
    assert config["peft_type"] == "PROMPT_TUNING" and config["num_virtual_tokens"] == 4
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)),
                                      str(work / "pt")).eval()
    assert answer_share(tuned, tokenizer, task) > 0.9  # the prompt steers to its task


def test_multitask_counts_the_shared_prompt_and_each_task_rank_factors(multitask):
    folder, events = multitask
    tasks, tokens, ranks = 2, 4, 2
    shared = tokens * WIDTH  # embedding: virtual tokens x token dim
    cols = tasks * tokens * ranks  # prefix_task_cols: tasks x virtual tokens x ranks
    rows = tasks * ranks * WIDTH  # prefix_task_rows: tasks x ranks x token dim
    started = of_kind(events, "started")[0]
    assert started["trainable_parameters"] == shared + cols + rows
    assert estimate_prompt_tuning_parameters("gpt2", "tiny", tokens, num_tasks=tasks,
                                             num_ranks=ranks) == shared + cols + rows
    done = of_kind(events, "done")[-1]["output"]
    assert done["tasks"] == ["animal", "colour"]
    assert json.loads((folder / TASKS_FILE).read_text())["tasks"] == ["animal", "colour"]


def test_multitask_loss_falls_on_two_toy_tasks(multitask):
    losses = [m["loss"] for m in of_kind(multitask[1], "metric")]
    assert fell(losses) < 1, losses


def test_a_different_task_id_changes_the_output(multitask, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = multitask[0]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)),
                                      str(folder))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer("say two big ?\n", return_tensors="pt").input_ids
    with torch.no_grad():
        animal = model(input_ids=ids, task_ids=torch.tensor([0])).logits
        colour = model(input_ids=ids, task_ids=torch.tensor([1])).logits
        again = model(input_ids=ids, task_ids=torch.tensor([0])).logits
    assert not torch.allclose(animal, colour)
    assert torch.equal(animal, again)
    # Each task's prompt learnt its own answers: both ways, which no lean of the base can give.
    assert answer_share(model, tokenizer, "animal", task_ids=torch.tensor([0])) > 0.9
    assert answer_share(model, tokenizer, "colour", task_ids=torch.tensor([1])) > 0.9


def test_resume_is_exact(work, data, base):
    """Resumed from its step-4 checkpoint, a run trains steps 5-8 with the same losses and
    ends with the same prompt as the run that was never interrupted."""
    from safetensors.torch import load_file

    def spec(output: str, run: int) -> dict:
        return spec_of("multitask_prompt_tuning", data, work / output, base, run,
                       prompt={"num_ranks": 2}, max_steps=8, checkpoint_every=2, log_every=1,
                       keep_checkpoints=10)

    code, whole = run_in_process(spec("whole", 3), work, work / "whole-checkpoints")
    assert code == 0, whole
    resumed_dir = work / "resumed-checkpoints"
    resumed_dir.mkdir()
    shutil.copytree(work / "whole-checkpoints" / "step-4", resumed_dir / "step-4")
    assert CheckpointStore(resumed_dir).latest()[0] == 4
    code, resumed = run_in_process(spec("resumed", 4), work, resumed_dir)
    assert code == 0, resumed
    assert of_kind(resumed, "started")[0]["resumed_from_step"] == 4
    before = {m["step"]: m for m in of_kind(whole, "metric")}
    after = of_kind(resumed, "metric")
    assert [m["step"] for m in after] == list(range(5, 9))
    for metric in after:
        assert metric["loss"] == before[metric["step"]]["loss"]
        assert metric["lr"] == before[metric["step"]]["lr"]
        assert metric["tokens"] == before[metric["step"]]["tokens"]
    one = load_file(str(work / "whole" / "adapter_model.safetensors"))
    two = load_file(str(work / "resumed" / "adapter_model.safetensors"))
    assert one.keys() == two.keys()
    assert all(torch.equal(one[name], two[name]) for name in one)


def test_stage_two_starts_a_target_task_from_the_source_prompt(work, base, multitask):
    """The recipe's second stage: the target task's prompt starts as the average of the source
    tasks'; the saved adapter no longer needs the source folder."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    source = work / "source-copy"
    shutil.copytree(multitask[0], source)
    target = write_jsonl(work / "target", two_tasks(32, seed=5, tasks=("colour",)))
    spec = spec_of("multitask_prompt_tuning", target, work / "target-prompt", base, 5,
                   prompt={"init": "average_source_tasks", "source_adapter_path": str(source),
                           "num_virtual_tokens": 99}, max_steps=1, lr=1e-8)
    code, events = run_in_process(spec, work, work / "target-checkpoints")
    assert code == 0, events
    out = work / "target-prompt"
    trained = load_file(str(out / "adapter_model.safetensors"))
    origin = load_file(str(source / "adapter_model.safetensors"))
    assert trained["prompt_embeddings"].shape == origin["prompt_embeddings"].shape  # 4 tokens
    assert torch.allclose(trained["prefix_task_cols"][0], origin["prefix_task_cols"].mean(0),
                          atol=1e-5)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["prompt_tuning_init"] == "RANDOM"
    assert config["prompt_tuning_init_state_dict_path"] is None and config["num_tasks"] == 1
    about = json.loads((out / TASKS_FILE).read_text())
    assert about["init"] == "average_source_tasks" and about["tasks"] == ["colour"]
    assert about["source"]["tasks"] == ["animal", "colour"]
    shutil.rmtree(source)  # the target loads without it
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(out))
    assert model(input_ids=torch.tensor([[2, 3]]), task_ids=torch.tensor([0])).logits.shape[1] \
        == 2 + 4


def test_specs_say_which_inits_need_what():
    common = {"data": {"path": "/d", "format": "jsonl"}, "output_dir": "/o",
              "base_model_path": "/b"}
    spec = validate_train_spec({**common, "kind": "prompt_tuning"})
    assert spec["prompt_tuning"]["num_virtual_tokens"] == 8 and "lora" not in spec
    cases = [
        ("prompt_tuning", {"init": "average_source_tasks"}, "prompt_tuning.init"),
        ("prompt_tuning", {"tasks": ["a"]}, "prompt_tuning.tasks"),
        ("prompt_tuning", {"init": "text"}, "prompt_tuning.init_text"),
        ("multitask_prompt_tuning", {"init": "average_source_tasks"},
         "prompt_tuning.source_adapter_path"),
        ("multitask_prompt_tuning", {"init": "exact_source_task",
                                     "source_adapter_path": "/s"}, "prompt_tuning.source_task"),
        ("multitask_prompt_tuning", {"init": "sample_vocab"}, "prompt_tuning.init"),
    ]
    for kind, settings, field in cases:
        with pytest.raises(SpecError) as raised:
            validate_train_spec({**common, "kind": kind, "prompt_tuning": settings})
        assert field in raised.value.errors, (kind, settings, raised.value.errors)
    with pytest.raises(SpecError) as raised:
        validate_train_spec({**common, "kind": "prompt_tuning",
                             "training": {"distributed": "fsdp"}})
    assert "training.distributed" in raised.value.errors


# The two-stage preset ----------------------------------------------------------------------


def _instructions(*tasks: str) -> bytes:
    return "".join(json.dumps({"prompt": "q", "response": "a", "task": task}) + "\n"
                   for task in tasks).encode()


RECIPE = "/api/v1/ylink/training-runs/multitask-prompt-tuning/"


@pytest.fixture
def recipe_inputs(farm, make_version, settings):
    """Two instruction datasets of alpha (source tasks a and b; target task t) and a finished
    pretraining run to tune."""
    from ylink.models import TrainingRun

    world = farm.world
    source_data = make_version("sources", _instructions("a", "b"), kind="instruction")
    record = json.loads(next(storage.absolute(source_data.path).glob("*.jsonl"))
                        .read_text().splitlines()[0])
    assert record["metadata"]["task"] == "a"  # the upload keeps the task column
    make_version("target", _instructions("t"), kind="instruction")
    base_run = TrainingRun.objects.create(
        tenant=world.alpha, created_by=world.alpha_member, name="base", kind="pretrain",
        dataset_version=source_data, spec={"model": {"preset": "tiny"}}, succeeded=True,
        artifact="model", output_path=str(Path(settings.DATA_DIR) / "base"),
        parameters=100_000)
    (Path(settings.DATA_DIR) / "base").mkdir()
    return {"tenant": "alpha", "name": "mpt", "base_run": base_run.pk,
            "source": {"dataset_version": source_data.pk}, "target": {"dataset": "target"},
            "prompt_tuning": {"num_virtual_tokens": 4, "num_ranks": 2},
            "source_training": {"max_steps": 10}}


@pytest.fixture
def recipe(api, farm, recipe_inputs):
    """The preset started through the API: a source run on two tasks, a target run waiting
    for it."""
    from ylink.models import TrainingRun

    response = api.as_user(farm.world.alpha_member).post(RECIPE, recipe_inputs, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["target"]["after_run"] == body["source"]["id"]
    assert [body[stage]["name"] for stage in ("source", "target")] == ["mpt-source",
                                                                       "mpt-target"]
    return (TrainingRun.objects.get(pk=body["source"]["id"]),
            TrainingRun.objects.get(pk=body["target"]["id"]))


@pytest.mark.django_db
@pytest.mark.parametrize(("changes", "field"), [
    ({"source": {"dataset": "nothing"}}, "source.dataset"),
    ({"target": {}}, "target.dataset_version"),
    ({"base_run": 10**6}, "base_run"),
    ({"target_init": "exact_source_task"}, "source_task"),
    ({"target_init": "guess"}, "target_init"),
    ({"prompt_tuning": {"num_virtual_tokens": 0}}, "prompt_tuning.num_virtual_tokens"),
])
def test_a_bad_recipe_is_a_400_naming_the_field_and_starts_nothing(
        api, farm, recipe_inputs, changes, field):
    from ylink.models import TrainingRun

    response = api.as_user(farm.world.alpha_member).post(
        RECIPE, {**recipe_inputs, **changes}, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["fields"]
    assert any(name == field or name.startswith(f"{field}.") for name in fields), fields
    assert list(TrainingRun.objects.values_list("name", flat=True)) == ["base"]


@pytest.mark.django_db
def test_another_tenant_cannot_tune_this_tenants_model_or_data(api, farm, recipe_inputs):
    from django.core.files.base import ContentFile

    from ylink.models import TrainingRun
    from ylink.services.datasets import dataset_create, dataset_upload

    world = farm.world
    beta = api.as_user(world.beta_member)
    # alpha's datasets are unknown to beta, by id or by name
    response = beta.post(RECIPE, {**recipe_inputs, "tenant": "beta"}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["fields"]["source.dataset_version"] == ["No such version."]
    response = beta.post(RECIPE, {**recipe_inputs, "tenant": "beta",
                                  "source": {"dataset": "sources"}}, format="json")
    assert response.json()["fields"]["source.dataset"] == ["No such dataset version."]
    # and so is alpha's base model, with beta's own data
    own = dataset_create(actor=world.beta_member, tenant=world.beta, name="mine",
                         kind="instruction")
    dataset_upload(actor=world.beta_member, dataset=own,
                   upload=ContentFile(_instructions("a", "t"), name="mine.jsonl"))
    response = beta.post(RECIPE, {**recipe_inputs, "tenant": "beta", "source": {
        "dataset": "mine"}, "target": {"dataset": "mine"}}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["fields"]["base_run"] == ["No such training run."]
    assert list(TrainingRun.objects.values_list("name", flat=True)) == ["base"]


@pytest.mark.django_db
def test_the_recipe_is_two_runs_the_target_starting_from_the_source(recipe):
    source, target = recipe
    assert source.job is not None and source.spec["kind"] == "multitask_prompt_tuning"
    assert target.job is None and target.after_run == source and target.state == "queued"
    settings = target.spec["prompt_tuning"]
    assert settings["init"] == "average_source_tasks"
    assert settings["source_adapter_path"] == source.spec["output_dir"]
    assert (settings["num_virtual_tokens"], settings["num_ranks"]) == (4, 2)
    assert target.spec["training"]["max_steps"] == 10


@pytest.mark.django_db
def test_the_target_starts_when_the_source_succeeds_and_reads_its_adapter(recipe):
    from ylink.models import TrainingRun
    from ylink.services.runner_events import runner_events_apply

    source, target = recipe
    runner_events_apply(job=source.job, events=[
        {"kind": "done", "data": {"output": {"artifact": "adapter", "steps": 10}}}])
    target = TrainingRun.objects.get(pk=target.pk)
    assert target.job is not None and target.state == "queued"
    spec = json.loads((Path(target.job.command[-1])).read_text())
    assert spec["prompt_tuning"]["source_adapter_path"] == source.spec["output_dir"]
    # Its job sees the source's adapter folder.
    assert any(mount["path"] == source.spec["output_dir"] and mount["read_only"]
               for mount in target.job.mounts), target.job.mounts


@pytest.mark.django_db
def test_the_target_fails_with_its_source(recipe):
    from aistation.services.transitions import job_transition

    source, target = recipe
    job_transition(source.job, "failed", reason="broken")
    source.job.refresh_from_db()
    target.refresh_from_db()
    assert target.state == "failed" and target.job is None
