"""Uploading benchmarks: every document checked the way lm-eval will read it, mistakes refused
as a 400 naming the field and the line; stored content-addressed; the shipped suites; what
lm-eval itself makes of a compiled benchmark."""

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from mmodel import storage
from mmodel.models import Benchmark
from mmodel.runners.lm_tasks import write_tasks
from mmodel.services.evaluation import (
    benchmark_create,
    benchmark_preview,
    benchmarks_seed_builtin,
)
from mmodel.tests import evaluation_fixtures
from mmodel.tests.evaluation_fixtures import GEN_DOCS, MC_DOCS, PPL_DOCS, jsonl

URL = "/api/v1/mmodel/benchmarks/"

_own_data_dir = evaluation_fixtures._own_data_dir


def upload(api, user, docs, *, name="quiz", kind="multiple_choice", raw=None, **fields):
    content = raw if raw is not None else jsonl(docs)
    return api.as_user(user).post(URL, {
        "name": name, "kind": kind,
        "file": SimpleUploadedFile(f"{name}.jsonl", content), **fields,
    }, format="multipart")


def test_upload_stores_the_checked_file_by_content_and_previews_prompts(world, api, settings):
    response = upload(api, world.alpha_member, MC_DOCS, few_shot=1,
                      description="A first quiz.")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["documents"] == len(MC_DOCS) and body["tenant"] == "alpha"
    assert body["shared"] is False and body["metrics"] == ["acc", "acc_norm"]
    benchmark = Benchmark.objects.get(pk=body["id"])
    path = storage.absolute(benchmark.data_path)
    assert path == Path(settings.DATA_DIR) / "mmodel" / "benchmarks" / "alpha" / \
        f"quiz-{benchmark.content_hash[:12]}.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == MC_DOCS
    first = body["preview"][0]
    assert first["prompt"] == "Question: What is the capital of France?\nAnswer:"
    assert first["choices"] == ["Paris", "Rome", "Oslo"]
    assert first["target"] == "Paris" and first["answer"] == 0

    detail = api.as_user(world.alpha_viewer).get(f"{URL}{benchmark.pk}/").json()
    assert len(detail["preview"]) == 3 and detail["preview"][1]["target"] == "2"


@pytest.mark.parametrize(("lines", "fields", "field", "words"), [
    (b'{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"question": \n',
     {}, "file", ["line 2", "not valid JSON"]),
    (b'{"question": "q", "choices": ["a", "b"], "answer": 0}\n["a list"]\n',
     {}, "file", ["line 2", "JSON object"]),
    (jsonl([MC_DOCS[0], MC_DOCS[1], {"choices": ["a", "b"], "answer": 0}]),
     {}, "prompt_template", ["line 3", "'question' is undefined"]),
    (jsonl([MC_DOCS[0], {"question": "q", "choices": ["a", "b", "c"], "answer": 5}]),
     {}, "target_template", ["line 2", "answer index 5", "3 choices"]),
    (jsonl([{"question": "q", "choices": "just one", "answer": 0}]),
     {}, "choices_template", ["line 1", "list"]),
    (jsonl(MC_DOCS), {"prompt_template": "Question: {{ question }"},
     "prompt_template", ["Not a valid Jinja template"]),
    (jsonl(MC_DOCS), {"prompt_template": "{{ question.__class__.__mro__ }}"},
     "prompt_template", ["line 1", "not allowed"]),
    # What would hold a web worker for hours or fill its memory, refused before rendering.
    (jsonl(MC_DOCS), {"prompt_template": "{{ question * 10000000000 }}"},
     "prompt_template", ["line 1", "not allowed", "huge"]),
    (jsonl(MC_DOCS), {"prompt_template": "{% for a in choices %}{% for b in choices %}"
                      "{{ a }}{% endfor %}{% endfor %}"},
     "prompt_template", ["Not allowed", "at most 1 loop"]),
    (jsonl(MC_DOCS), {"prompt_template": "{% for i in range(100000) %}.{% endfor %}"},
     "prompt_template", ["line 1", "'range' is undefined"]),
    (jsonl([MC_DOCS[0], {**MC_DOCS[1], "answer": "1"}]),
     {}, "file", ["line 2", "'answer'", "string", "number on line 1"]),
    (b"\n  \n", {}, "file", ["no documents"]),
])
def test_upload_mistakes_are_400s_naming_field_and_line(world, api, lines, fields, field,
                                                        words):
    response = upload(api, world.alpha_member, None, raw=lines, **fields)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid" and field in body["fields"], body
    message = body["fields"][field][0]
    for word in words:
        assert word in message, message
    assert not Benchmark.objects.exists()
    assert not list((storage.data_root() / "mmodel" / "benchmarks").rglob("*.jsonl"))


def test_generation_and_perplexity_documents_are_checked_for_their_fields(world):
    actor = world.alpha_member
    with pytest.raises(Exception) as error:
        benchmark_create(actor=actor, tenant=world.alpha, name="g", kind="generation",
                         data=jsonl([GEN_DOCS[0], {"question": "What is 2 + 2?", "answer": ""}]))
    assert error.value.message_dict == {"target_template": [
        "line 2: the expected answer is empty."]}
    with pytest.raises(Exception) as error:
        benchmark_create(actor=actor, tenant=world.alpha, name="p", kind="perplexity",
                         data=jsonl([*PPL_DOCS, {"body": "text in the wrong field"}]))
    assert "line 4" in error.value.message_dict["text_field"][0]
    with pytest.raises(Exception) as error:
        benchmark_create(actor=actor, tenant=world.alpha, name="p", kind="perplexity",
                         data=jsonl(PPL_DOCS), few_shot=2)
    assert "few_shot" in error.value.message_dict
    stored = benchmark_create(actor=actor, tenant=world.alpha, name="p", kind="perplexity",
                              data=jsonl(PPL_DOCS))
    assert stored.documents == 3 and stored.metrics == [
        "word_perplexity", "byte_perplexity", "bits_per_byte"]
    assert benchmark_preview(stored)[0]["target"] == PPL_DOCS[0]["text"]


def test_names_are_unique_per_tenant_and_against_shared_ones(world, api):
    assert upload(api, world.alpha_member, MC_DOCS).status_code == 201
    again = upload(api, world.alpha_member, MC_DOCS)
    assert again.status_code == 400 and "already has" in again.json()["fields"]["name"][0]
    assert upload(api, world.beta_member, MC_DOCS).status_code == 201  # another tenant
    shared = upload(api, world.operator, MC_DOCS, name="common", shared="true")
    assert shared.status_code == 201 and shared.json()["tenant"] is None
    clash = upload(api, world.alpha_member, MC_DOCS, name="common")
    assert clash.status_code == 400 and "shared" in clash.json()["fields"]["name"][0]
    refused = upload(api, world.alpha_admin, MC_DOCS, name="mine", shared="true")
    assert refused.status_code == 400 and "shared" in refused.json()["fields"]
    viewer = upload(api, world.alpha_viewer, MC_DOCS, name="viewer")
    assert viewer.status_code == 403


def test_tenants_see_their_own_and_the_shared_benchmarks_only(world, api):
    alpha = upload(api, world.alpha_member, MC_DOCS, name="alpha-quiz").json()
    upload(api, world.beta_member, MC_DOCS, name="beta-quiz")
    benchmarks_seed_builtin()
    names = {b["name"] for b in api.as_user(world.beta_viewer).get(URL).json()["results"]}
    assert names == {"beta-quiz", "basic-facts-mc", "arithmetic-em", "python-docs-ppl",
                     "everyday-retrieval"}
    assert api.as_user(world.beta_member).get(f"{URL}{alpha['id']}/").status_code == 404
    shared = Benchmark.objects.get(name="basic-facts-mc")
    assert api.as_user(world.beta_viewer).get(f"{URL}{shared.pk}/").status_code == 200
    mine = api.as_user(world.alpha_member).get(URL, {"shared": "false"}).json()["results"]
    assert [b["name"] for b in mine] == ["alpha-quiz"]


def test_the_shipped_suites_seed_once_and_hold_what_they_say(world):
    first = benchmarks_seed_builtin()
    again = benchmarks_seed_builtin()
    assert [b.pk for b in first] == [b.pk for b in again]
    assert Benchmark.objects.count() == 4
    by_name = {b.name: b for b in first}
    assert all(b.tenant is None for b in first)
    assert by_name["basic-facts-mc"].kind == "multiple_choice"
    assert by_name["arithmetic-em"].few_shot == 3
    assert all(b.documents >= 30 for b in first), {b.name: b.documents for b in first}
    facts = benchmark_preview(by_name["basic-facts-mc"])[0]
    assert facts["prompt"] == "Question: What is the capital of France?\nAnswer:"
    assert facts["target"] == "Paris"
    assert benchmark_preview(by_name["arithmetic-em"])[0]["target"].lstrip("-").isdigit()
    text = benchmark_preview(by_name["python-docs-ppl"])[0]["target"]
    assert len(text) > 200 and "::=" not in text
    # Retrieval: its documents are its queries, each naming the one passage that answers it.
    everyday = by_name["everyday-retrieval"]
    assert everyday.kind == "retrieval" and everyday.metrics == ["recall@1", "recall@5", "mrr"]
    lines = [json.loads(line) for line in
             storage.absolute(everyday.data_path).read_text().splitlines()]
    passages = {line["id"]: line["text"] for line in lines if "id" in line}
    queries = [line for line in lines if "query" in line]
    assert everyday.documents == len(queries) == 30 and len(passages) >= 30
    assert all(len(q["relevant"]) == 1 and q["relevant"][0] in passages for q in queries)
    # Asked in other words than the passage's: no query shares most of its words with it.
    for query in queries:
        words = set(query["query"].lower().split())
        answer = set(passages[query["relevant"][0]].lower().split())
        assert len(words & answer) < len(words) / 2, query
    first = benchmark_preview(everyday)[0]
    assert first["prompt"] == queries[0]["query"] and first["target"] == "p01"


def test_lm_eval_reads_a_compiled_benchmark_as_the_preview_shows_it(world, tmp_path):
    """The platform's checks and preview agree with lm-eval's own reading of the YAML."""
    from lm_eval.tasks import TaskManager

    actor = world.alpha_member
    made = [
        benchmark_create(actor=actor, tenant=world.alpha, name="mc", kind="multiple_choice",
                         data=jsonl(MC_DOCS), few_shot=1),
        benchmark_create(actor=actor, tenant=world.alpha, name="sums", kind="generation",
                         data=jsonl(GEN_DOCS), prompt_template="Q: {{question}}\nA:"),
        benchmark_create(actor=actor, tenant=world.alpha, name="prose", kind="perplexity",
                         data=jsonl(PPL_DOCS)),
    ]
    tasks = write_tasks([{
        "id": b.pk, "kind": b.kind, "data_file": str(storage.absolute(b.data_path)),
        "prompt_template": b.prompt_template, "target_template": b.target_template,
        "choices_template": b.choices_template, "text_field": b.text_field,
        "few_shot": b.few_shot, "metrics": b.metrics, "generation_kwargs": b.generation_kwargs,
    } for b in made], tmp_path / "tasks")
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    loaded = manager.load([t["task"] for t in tasks])["tasks"]
    for benchmark, task in zip(made, tasks, strict=True):
        lm_task = loaded[task["task"]]
        docs = list(lm_task.test_docs())
        assert len(docs) == benchmark.documents
        shown = benchmark_preview(benchmark, count=2)
        for doc, preview in zip(docs, shown, strict=False):
            if benchmark.kind == "perplexity":
                assert lm_task.doc_to_target(doc) == preview["target"]
                continue
            assert lm_task.doc_to_text(doc) == preview["prompt"]
            if benchmark.kind == "multiple_choice":
                assert lm_task.doc_to_choice(doc) == preview["choices"]
                assert lm_task.doc_to_target(doc) == preview["answer"]
            else:
                assert lm_task.doc_to_target(doc) == preview["target"]
    assert loaded[tasks[0]["task"]].config.num_fewshot == 1


def test_few_shot_examples_never_give_away_the_document_asked(world, tmp_path):
    from lm_eval.tasks import TaskManager

    quiz = benchmark_create(actor=world.alpha_member, tenant=world.alpha, name="quiz",
                            kind="multiple_choice", data=jsonl(MC_DOCS),
                            few_shot=len(MC_DOCS) - 1)
    (task,) = write_tasks([{
        "id": quiz.pk, "kind": quiz.kind, "data_file": str(storage.absolute(quiz.data_path)),
        "prompt_template": quiz.prompt_template, "target_template": quiz.target_template,
        "choices_template": quiz.choices_template, "text_field": "", "few_shot": quiz.few_shot,
        "metrics": quiz.metrics, "generation_kwargs": {},
    }], tmp_path / "tasks")
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    lm_task = manager.load([task["task"]])["tasks"][task["task"]]
    for doc in lm_task.test_docs():
        context = lm_task.fewshot_context(doc, quiz.few_shot)
        # Every other document once as an example, the one asked only at the end.
        assert all(context.count(other["question"]) == 1 for other in MC_DOCS), context
        assert context.endswith(f"Question: {doc['question']}\nAnswer:")
