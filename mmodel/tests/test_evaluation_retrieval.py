"""Retrieval benchmarks for embedding models: their passages and queries checked at upload (a
mistake is a 400 naming the line), the runner's scores on all-MiniLM-L6-v2 equal to what
sentence-transformers gives when computed here by hand (on the version's weights, and through a
deployment's /v1/embeddings with its key), a run through the service and a real job reaching
the leaderboard, kinds that do not fit the model refused in words, and another tenant kept away
from a tenant's private retrieval benchmark."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from aistation.choices import JobState
from aistation.models import Job
from mmodel import storage
from mmodel.models import (
    Benchmark,
    Deployment,
    DeploymentReplica,
    EvaluationResult,
    EvaluationRun,
    EvaluationSample,
)
from mmodel.runners import retrieval
from mmodel.services.evaluation import (
    BUILTIN_DIR,
    benchmark_create,
    benchmarks_seed_builtin,
    evaluation_start,
)
from mmodel.services.evaluation_events import evaluation_events_apply
from mmodel.tests import evaluation_fixtures
from mmodel.tests.evaluation_fixtures import MC_DOCS, RETRIEVAL_DOCS, jsonl
from mmodel.tests.minilm import minilm_folder
from mmodel.tests.replica_server import replica_server
from mmodel.tests.test_evaluation_job import _wait
from ogai.crypto import decrypt, encrypt

BENCHMARKS = "/api/v1/mmodel/benchmarks/"
RUNS = "/api/v1/mmodel/evaluation-runs/"
SHIPPED = BUILTIN_DIR / "everyday-retrieval.jsonl"
SERVER_KEY = "the-minilm-deployments-key"

_own_data_dir = evaluation_fixtures._own_data_dir
make_version = evaluation_fixtures.make_version
embedding_version = evaluation_fixtures.embedding_version


def upload(api, user, docs=None, *, name="ret", raw=None, **fields):
    content = raw if raw is not None else jsonl(docs if docs is not None else RETRIEVAL_DOCS)
    return api.as_user(user).post(BENCHMARKS, {
        "name": name, "kind": "retrieval", "file": SimpleUploadedFile(f"{name}.jsonl", content),
        **fields}, format="multipart")


# -- the benchmark -------------------------------------------------------------------------------

def test_a_retrieval_benchmark_counts_its_queries_and_previews_them(world, api):
    response = upload(api, world.alpha_member)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "retrieval" and body["documents"] == 3  # the queries
    assert body["metrics"] == ["recall@1", "recall@5", "mrr"]
    assert body["prompt_template"] == "" and body["few_shot"] == 0
    assert [(p["index"], p["prompt"], p["target"]) for p in body["preview"]] == [
        (0, "CUDA out of memory", "gpu"), (1, "collective communication hangs", "nccl"),
        (2, "a pet resting on a rug", "cat, lr")]
    # Passages may come after the queries that name them.
    queries_first = [*RETRIEVAL_DOCS[4:], *RETRIEVAL_DOCS[:4]]
    assert upload(api, world.alpha_member, queries_first, name="later").status_code == 201
    only = upload(api, world.alpha_member, name="only", metrics=["mrr"]).json()
    assert only["metrics"] == ["mrr"]


PASSAGES = RETRIEVAL_DOCS[:4]


@pytest.mark.parametrize(("docs", "fields", "field", "words"), [
    ([*PASSAGES, {"query": "q", "relevant": ["gpu", "nope"]}], {}, "file",
     ["line 5", 'relevant id "nope"', "names no passage"]),
    ([{"id": 3, "text": "three"}, {"query": "q", "relevant": ["3"]}], {}, "file",
     ["line 2", 'relevant id "3"', "there is a passage 3"]),
    ([*PASSAGES, {"id": "empty", "text": "  "}, {"query": "q", "relevant": ["gpu"]}], {},
     "file", ["line 5", 'passage "empty" has no text']),
    ([{"text": "no id"}, {"query": "q", "relevant": ["gpu"]}], {}, "file",
     ["line 1", 'a passage needs an "id"']),
    ([*PASSAGES, {"id": "gpu", "text": "again"}, {"query": "q", "relevant": ["gpu"]}], {},
     "file", ["line 5", 'passage id "gpu" is already the id of line 1']),
    (PASSAGES, {}, "file", ["4 passages but no queries"]),
    ([{"query": "q", "relevant": ["gpu"]}], {}, "file", ["1 queries but no passages"]),
    ([*PASSAGES, {"query": "", "relevant": ["gpu"]}], {}, "file",
     ["line 5", "the query is empty"]),
    ([*PASSAGES, {"query": "q", "relevant": []}], {}, "file",
     ["line 5", '"relevant" must be a non-empty list']),
    ([*PASSAGES, {"query": "q", "relevant": "gpu"}], {}, "file",
     ["line 5", '"relevant" must be a non-empty list']),
    ([*PASSAGES, {"query": "q", "relevant": ["gpu", "gpu"]}], {}, "file",
     ["line 5", '"gpu" twice']),
    ([*PASSAGES, {"question": "q", "answer": "gpu"}], {}, "file",
     ["line 5", "a passage", "or a query", "this one has answer, question"]),
    ([*PASSAGES, {"query": "q", "text": "t", "relevant": ["gpu"]}], {}, "file",
     ["line 5", "not both"]),
    (RETRIEVAL_DOCS, {"prompt_template": "{{query}}"}, "prompt_template",
     ["takes no templates"]),
    (RETRIEVAL_DOCS, {"few_shot": 2}, "few_shot", ["no few-shot"]),
    (RETRIEVAL_DOCS, {"metrics": ["acc"]}, "metrics", ["recall@1, recall@5, mrr"]),
    (b"\n  \n", {}, "file", ["no documents"]),
])
def test_retrieval_mistakes_are_400s_naming_field_and_line(world, api, docs, fields, field,
                                                           words):
    raw = docs if isinstance(docs, bytes) else jsonl(docs)
    response = upload(api, world.alpha_member, raw=raw, **fields)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert field in body["fields"], body
    message = body["fields"][field][0]
    for word in words:
        assert word in message, message
    assert not Benchmark.objects.exists()
    assert not list((storage.data_root() / "mmodel" / "benchmarks").rglob("*.jsonl"))


# -- the runner on the real model ----------------------------------------------------------------

@pytest.fixture(scope="module")
def by_hand() -> dict:
    """The shipped set scored here with sentence-transformers directly: per query, whether its
    passage ranks first, its passages' order and its reciprocal rank."""
    from sentence_transformers import SentenceTransformer

    lines = [json.loads(line) for line in SHIPPED.read_text().splitlines() if line.strip()]
    passages = [line for line in lines if "id" in line]
    queries = [line for line in lines if "query" in line]
    model = SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)
    p = model.encode([line["text"] for line in passages], normalize_embeddings=True)
    q = model.encode([line["query"] for line in queries], normalize_embeddings=True)
    ids = [line["id"] for line in passages]
    similarity = q @ p.T
    correct, reciprocal, top5 = [], [], []
    for row, query in zip(similarity, queries, strict=True):
        (relevant,) = query["relevant"]
        order = [ids[i] for i in np.argsort(-row)]
        correct.append(order[0] == relevant)
        reciprocal.append(1.0 / (order.index(relevant) + 1))
        top5.append(order[:5])
    return {"correct": correct, "reciprocal": reciprocal, "top5": top5,
            "recall@1": sum(correct) / len(correct),
            "recall@5": sum(r >= 1 / 5 for r in reciprocal) / len(reciprocal),
            "mrr": sum(reciprocal) / len(reciprocal)}


def _run_runner(spec_path: Path, env: dict | None = None) -> list[dict]:
    """The runner as a job runs it, its events read off stdout (no platform to send them to)."""
    base = {k: v for k, v in os.environ.items() if k not in ("OGAI_URL", "OGAI_RUN_TOKEN")}
    finished = subprocess.run(
        [sys.executable, "-m", "mmodel.runners.evaluate", "--spec", str(spec_path)],
        env={**base, "OMP_NUM_THREADS": "1", **(env or {})}, capture_output=True, text=True,
        timeout=240)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return [json.loads(line.removeprefix("OGAI-EVENT "))
            for line in finished.stdout.splitlines() if line.startswith("OGAI-EVENT ")]


def test_the_runner_scores_minilm_as_sentence_transformers_does_by_hand(tmp_path, by_hand):
    # A set the model does not ace: a runner that miscounted would not match.
    assert 0 < by_hand["recall@1"] < 1 and by_hand["mrr"] < 1
    spec = {"run": 1, "model": "sentence-transformers",
            "model_args": {"folder": str(minilm_folder()), "device": "cpu"},
            "tasks": retrieval.retrieval_tasks([{"id": 7, "data_file": str(SHIPPED),
                                                 "metrics": list(retrieval.METRICS)}]),
            "limit": None}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    events = _run_runner(tmp_path / "spec.json")
    kinds = [event["kind"] for event in events]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "failed" not in kinds
    (result,) = [event["data"] for event in events if event["kind"] == "result"]
    assert result["benchmark"] == 7 and result["samples"] == 30
    metrics = result["metrics"]
    assert metrics["recall@1"]["value"] == pytest.approx(by_hand["recall@1"], abs=1e-12)
    assert metrics["recall@5"]["value"] == pytest.approx(by_hand["recall@5"], abs=1e-12)
    assert metrics["mrr"]["value"] == pytest.approx(by_hand["mrr"], abs=1e-9)
    # The standard error of the per-query values.
    assert metrics["mrr"]["stderr"] == pytest.approx(
        np.std(by_hand["reciprocal"], ddof=1) / np.sqrt(30), abs=1e-9)
    samples = [sample for event in events if event["kind"] == "samples"
               for sample in event["data"]["samples"]]
    assert [s["index"] for s in samples] == list(range(30))
    assert [s["correct"] for s in samples] == by_hand["correct"]
    assert [s["scores"]["top5"] for s in samples] == by_hand["top5"]
    first = samples[0]
    assert first["prompt"].startswith("an ancient fortification")
    assert first["target"].startswith("p01: The Great Wall")
    assert first["output"].splitlines()[0] == first["target"]
    assert events[-1]["data"] == {"cached_requests": 0, "total_requests": 64}


@pytest.fixture
def served_minilm(tmp_path):
    """The embeddings runtime answering for all-MiniLM-L6-v2 on a free port, requiring the
    deployment's key (SERVER_KEY), as a replica runs it."""
    with replica_server("mmodel.runners.serve_embeddings", [str(minilm_folder())],
                        key=SERVER_KEY, logs=tmp_path) as url:
        yield url


def test_a_deployment_is_scored_through_its_embeddings_endpoint(world, farm, embedding_version,
                                                                served_minilm, by_hand):
    """The endpoint arguments the service writes work against the real embeddings runtime: the
    runner (run directly, its events applied as the API would) sends the deployment's key."""
    version = embedding_version(world.alpha)
    shared = {b.name: b for b in benchmarks_seed_builtin()}["everyday-retrieval"]
    deployment = Deployment.objects.create(tenant=world.alpha, name="minilm", version=version,
                                           queue=farm.queues["alpha"],
                                           api_key=encrypt(SERVER_KEY))
    job = farm.submit("alpha", gpus=0, name="serve")
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, ready=True,
                                     upstream=served_minilm, served_model="minilm")
    run = evaluation_start(actor=world.alpha_member, tenant=world.alpha, version=version,
                           benchmarks=[shared], queue=farm.queues["alpha"],
                           deployment=deployment)
    assert run.target == "endpoint" and run.spec["model"] == "openai-embeddings"
    assert run.spec["model_args"]["base_url"] == f"{served_minilm}/v1/embeddings"
    secrets = json.loads(decrypt(run.job.secret_env))
    assert secrets["OPENAI_API_KEY"] == SERVER_KEY
    assert SERVER_KEY not in json.dumps([run.spec, run.job.command, run.job.env])

    spec_path = storage.absolute(run.folder) / "spec.json"
    events = _run_runner(spec_path, {"OPENAI_API_KEY": secrets["OPENAI_API_KEY"]})
    evaluation_events_apply(job=run.job, events=events)
    run.refresh_from_db()
    assert run.succeeded, run.message
    stored = {r.metric: r.value for r in EvaluationResult.objects.filter(run=run)}
    assert stored["recall@1"] == pytest.approx(by_hand["recall@1"], abs=1e-12)
    assert stored["mrr"] == pytest.approx(by_hand["mrr"], abs=1e-6)
    correct = EvaluationSample.objects.filter(run=run).order_by("index") \
        .values_list("correct", flat=True)
    assert list(correct) == by_hand["correct"]

    # Without the key the server answers 401, and the run fails saying so.
    failed = subprocess.run(
        [sys.executable, "-m", "mmodel.runners.evaluate", "--spec", str(spec_path)],
        env={k: v for k, v in os.environ.items()
             if k not in ("OGAI_URL", "OGAI_RUN_TOKEN", "OPENAI_API_KEY")},
        capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    assert "answered 401" in failed.stdout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_embedding_version_is_evaluated_in_a_job_and_reaches_the_leaderboard(
        world, api, local_queue, live_server, settings, celery_worker_process,
        embedding_version, by_hand):
    settings.OGAI_INTERNAL_URL = live_server.url
    version = embedding_version(world.alpha, real=True)
    benchmarks_seed_builtin()
    started = api.as_user(world.alpha_member).post(RUNS, {
        "version": version.pk, "benchmarks": ["everyday-retrieval"]}, format="json")
    assert started.status_code == 201, started.json()
    run = _wait(EvaluationRun.objects.get(pk=started.json()["id"]), timeout=180)
    assert run.total_requests == 64 and run.cached_requests == 0

    rows = api.as_user(world.alpha_viewer).get("/api/v1/mmodel/leaderboard/").json()
    (row,) = rows
    assert row["label"] == version.label
    scores = row["scores"]["everyday-retrieval"]
    assert scores["recall@1"] == pytest.approx(by_hand["recall@1"], abs=1e-12)
    assert scores["recall@5"] == pytest.approx(by_hand["recall@5"], abs=1e-12)
    assert scores["mrr"] == pytest.approx(by_hand["mrr"], abs=1e-9)
    assert row["runs"]["everyday-retrieval"]["documents"] == 30
    correct = EvaluationSample.objects.filter(run=run).order_by("index") \
        .values_list("correct", flat=True)
    assert list(correct) == by_hand["correct"]


# -- what the service refuses --------------------------------------------------------------------

def test_a_start_writes_the_retrieval_spec(world, api, farm, embedding_version, settings):
    version = embedding_version(world.alpha)
    mine = upload(api, world.alpha_member).json()
    response = api.as_user(world.alpha_member).post(RUNS, {
        "version": version.pk, "benchmarks": ["ret"], "limit": 2}, format="json")
    assert response.status_code == 201, response.json()
    run = EvaluationRun.objects.get(pk=response.json()["id"])
    folder = str(Path(settings.DATA_DIR) / version.artifact_path)
    data_file = str(Path(settings.DATA_DIR) / Benchmark.objects.get(pk=mine["id"]).data_path)
    assert run.spec == {
        "run": run.pk, "model": "sentence-transformers",
        "model_args": {"folder": folder, "device": "cpu"}, "limit": 2,
        "tasks": [{"task": f"ogai_b{mine['id']}", "benchmark": mine["id"], "kind": "retrieval",
                   "filter": "none", "data_file": data_file,
                   "metrics": ["recall@1", "recall@5", "mrr"]}]}
    assert json.loads((Path(settings.DATA_DIR) / run.folder / "spec.json").read_text()) \
        == run.spec
    assert run.job.command[1:3] == ["-m", "mmodel.runners.evaluate"]
    assert run.target == "weights" and run.job.gpus_per_replica == 0


def test_kinds_that_do_not_fit_the_model_are_refused_in_words(world, api, farm, make_version,
                                                              embedding_version):
    text_model = make_version(world.alpha, name="tiny")
    embedder = embedding_version(world.alpha)
    upload(api, world.alpha_member)
    quiz = benchmark_create(actor=world.alpha_member, tenant=world.alpha, name="quiz",
                            kind="multiple_choice", data=jsonl(MC_DOCS))
    client = api.as_user(world.alpha_member)

    def start(version, *names, **body):
        return client.post(RUNS, {"version": version.pk, "benchmarks": list(names), **body},
                           format="json")

    retrieval_on_text = start(text_model, "ret")
    assert retrieval_on_text.status_code == 400
    (reason,) = retrieval_on_text.json()["fields"]["benchmarks"]
    assert "ret: a retrieval benchmark scores an embedding model" in reason
    assert "tiny:v1 generates text" in reason

    text_on_embedder = start(embedder, "quiz", "ret")
    assert text_on_embedder.status_code == 400
    (reason,) = text_on_embedder.json()["fields"]["benchmarks"]
    assert "minilm:v1 is an embedding model" in reason
    assert "retrieval benchmarks only, not on quiz" in reason

    mixed = start(text_model, "quiz", "ret")
    assert mixed.status_code == 400 and "ret: a retrieval benchmark" in \
        mixed.json()["fields"]["benchmarks"][0]
    two_gpus = start(embedder, "ret", gpus=2)
    assert two_gpus.status_code == 400 and "one GPU" in two_gpus.json()["fields"]["gpus"][0]
    with pytest.raises(ValidationError) as refused:
        evaluation_start(actor=world.alpha_member, tenant=world.alpha, version=embedder,
                         benchmarks=[quiz], queue=farm.queues["alpha"])
    assert "benchmarks" in refused.value.message_dict
    assert not EvaluationRun.objects.exists()
    assert start(embedder, "ret").status_code == 201
    assert start(text_model, "quiz").status_code == 201


# -- the tenant boundary -------------------------------------------------------------------------

def test_another_tenant_cannot_see_or_evaluate_on_a_private_retrieval_benchmark(
        world, api, farm, embedding_version):
    private = upload(api, world.alpha_member, name="alpha-ret").json()
    alpha_version = embedding_version(world.alpha)
    beta_version = embedding_version(world.beta, name="beta-minilm")
    beta = api.as_user(world.beta_member)  # the same client, signed in as beta's member

    assert "alpha-ret" not in {b["name"] for b in beta.get(BENCHMARKS).json()["results"]}
    assert beta.get(f"{BENCHMARKS}{private['id']}/").status_code == 404
    assert beta.get(BENCHMARKS, {"tenant": "alpha"}).json()["results"] == []
    for ref in (private["id"], "alpha-ret"):
        refused = beta.post(RUNS, {"version": beta_version.pk, "benchmarks": [ref]},
                            format="json")
        assert refused.status_code == 400
        assert refused.json()["fields"]["benchmarks"] == [f"No benchmark {str(ref)!r}."]
    # Past the API too: the service checks the benchmark's tenant itself.
    with pytest.raises(ValidationError) as refused:
        evaluation_start(actor=world.beta_member, tenant=world.beta, version=beta_version,
                         benchmarks=[Benchmark.objects.get(pk=private["id"])],
                         queue=farm.queues["beta"])
    assert refused.value.message_dict == {
        "benchmarks": [f"No benchmark {private['id']} in beta."]}
    # Nor through alpha's version, nor in alpha's name.
    through_alpha = beta.post(RUNS, {"version": alpha_version.pk, "benchmarks": ["alpha-ret"],
                                     "tenant": "alpha"}, format="json")
    assert through_alpha.status_code in (400, 403)
    assert not EvaluationRun.objects.exists()

    # Alpha's run on it, and its samples, stay alpha's.
    started = api.as_user(world.alpha_member).post(RUNS, {
        "version": alpha_version.pk, "benchmarks": ["alpha-ret"]}, format="json")
    assert started.status_code == 201, started.json()
    run_id = started.json()["id"]
    beta = api.as_user(world.beta_member)
    assert beta.get(f"{RUNS}{run_id}/").status_code == 404
    assert beta.get(f"{RUNS}{run_id}/samples/").status_code == 404
    assert beta.get(RUNS, {"benchmark": private["id"]}).json()["results"] == []
    assert beta.get("/api/v1/mmodel/leaderboard/", {"tenant": "alpha"}).status_code == 400
