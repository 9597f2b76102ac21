"""Evaluation runs through the API on a fake cluster: what a start launches, what it refuses
(an endpoint that cannot score log-likelihoods among them), cancelling, the runner's events
(idempotent, only with its live job token), samples, comparison, the leaderboard, isolation."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job
from mmodel.choices import Runtime
from mmodel.models import (
    Deployment,
    DeploymentReplica,
    EvaluationResult,
    EvaluationRun,
    EvaluationSample,
)
from mmodel.services.evaluation import benchmark_create
from mmodel.tests import evaluation_fixtures
from mmodel.tests.evaluation_fixtures import MC_DOCS, jsonl
from ogai.crypto import decrypt

RUNS = "/api/v1/mmodel/evaluation-runs/"
EVENTS = "/api/v1/mmodel/runner/events/"

_own_data_dir = evaluation_fixtures._own_data_dir
make_version = evaluation_fixtures.make_version
suites = evaluation_fixtures.suites


@pytest.fixture
def started(world, api, farm, make_version, suites):
    """A run of alpha's version on its three benchmarks (the job queued on the fake cluster),
    and a job token for reporting as its runner."""
    version = make_version(world.alpha)
    benchmarks = suites()
    response = api.as_user(world.alpha_member).post(RUNS, {
        "version": version.pk, "benchmarks": [b.name for b in benchmarks], "limit": 4,
    }, format="json")
    assert response.status_code == 201, response.json()
    run = EvaluationRun.objects.get(pk=response.json()["id"])
    # The token the runner finds in its environment.
    secret = json.loads(decrypt(run.job.secret_env))["OGAI_RUN_TOKEN"]
    return run, benchmarks, secret


def _events(api, secret, events):
    api.force_authenticate(user=None)
    return api.post(EVENTS, {"events": events}, format="json",
                    HTTP_AUTHORIZATION=f"Bearer {secret}")


def _report(run, benchmarks, *, acc=0.5, cached=0, total=20):
    mc, gen, ppl = benchmarks
    return [
        {"kind": "started", "at": timezone.now().isoformat(), "data": {"attempt": 1}},
        {"kind": "result", "data": {"benchmark": mc.pk, "task": f"ogai_b{mc.pk}", "samples": 4,
                                    "metrics": {"acc": {"value": acc, "stderr": 0.25},
                                                "acc_norm": {"value": 0.25, "stderr": 0.2}}}},
        {"kind": "samples", "data": {"benchmark": mc.pk, "samples": [
            {"index": i, "prompt": f"Question {i}", "target": "Paris", "output": "Rome",
             "correct": i % 2 == 0, "scores": {"acc": float(i % 2 == 0)}} for i in range(4)]}},
        {"kind": "result", "data": {"benchmark": gen.pk, "samples": 4,
                                    "metrics": {"exact_match": {"value": 0.0, "stderr": 0.0}}}},
        {"kind": "result", "data": {"benchmark": ppl.pk, "samples": 3,
                                    "metrics": {"word_perplexity": {"value": 812.5,
                                                                    "stderr": None}}}},
        {"kind": "finished", "data": {"cached_requests": cached, "total_requests": total}},
    ]


def test_a_start_compiles_the_tasks_and_queues_the_runner_job(world, started, settings):
    run, benchmarks, _ = started
    spec = json.loads((Path(settings.DATA_DIR) / run.folder / "spec.json").read_text())
    assert spec == run.spec and spec["run"] == run.pk
    assert run.folder.startswith("mmodel/evaluations/") and f"{run.pk}-" in run.folder
    assert spec["model"] == "hf" and spec["limit"] == 4
    assert spec["model_args"] == {"pretrained": str(Path(settings.DATA_DIR)
                                                    / run.version.artifact_path),
                                  "device": "cpu", "dtype": "float32"}
    # Per tenant: the cache holds the tenant's prompts (and lm-eval unpickles it).
    assert spec["cache"] == str(Path(settings.DATA_DIR) / "mmodel" / "lm-eval-cache"
                                / str(world.alpha.pk) / run.version.content_hash / "weights"
                                / "requests")
    assert [t["benchmark"] for t in spec["tasks"]] == [b.pk for b in benchmarks]
    mc_yaml = Path(spec["tasks_dir"], f"ogai_b{benchmarks[0].pk}.yaml").read_text()
    data_file = str(Path(settings.DATA_DIR) / benchmarks[0].data_path)
    assert f"test: {data_file}" in mc_yaml and "train:" not in mc_yaml
    assert "fewshot_split: test" in mc_yaml and "num_fewshot: 1" in mc_yaml
    job = run.job
    assert job.command[1:] == ["-m", "mmodel.runners.evaluate", "--spec",
                               str(Path(settings.DATA_DIR) / run.folder / "spec.json")]
    assert job.env["HF_HUB_OFFLINE"] == "1" and job.env["OGAI_URL"]
    assert job.gpus_per_replica == 0 and job.tenant == world.alpha
    assert run.state == "queued" and run.created_by == world.alpha_member


def test_a_start_refuses_what_cannot_run(world, api, farm, make_version, suites):
    version = make_version(world.alpha)
    mc, _, _ = suites()
    beta_bench = benchmark_create(actor=world.beta_member, tenant=world.beta, name="theirs",
                                  kind="multiple_choice", data=jsonl(MC_DOCS))
    client = api.as_user(world.alpha_member)

    def start(**body):
        return client.post(RUNS, {"version": version.pk, "benchmarks": [mc.pk], **body},
                           format="json")

    refused = start(benchmarks=[beta_bench.pk])
    assert refused.status_code == 400 and "benchmarks" in refused.json()["fields"]
    assert start(queue="nope").json()["fields"]["queue"] == ["No queue 'nope' in tenant alpha."]
    assert start(limit=0).status_code == 400
    beta_version = make_version(world.beta, name="beta-model")
    other = start(version=beta_version.pk)
    assert other.status_code == 400 and "version" in other.json()["fields"]
    version.status = "importing"
    version.save()
    pending = start()
    assert pending.status_code == 400 and "only a ready version" in pending.json()["message"]
    assert api.as_user(world.alpha_viewer).post(RUNS, {"version": version.pk,
                                                       "benchmarks": [mc.pk]},
                                                format="json").status_code == 403
    assert not EvaluationRun.objects.exists()


def _deployment(world, farm, version, runtime):
    deployment = Deployment.objects.create(
        tenant=world.alpha, name=f"tiny-{runtime}", version=version,
        queue=farm.queues["alpha"], runtime=runtime)
    job = farm.submit("alpha", gpus=0, name=f"serve-{runtime}")
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, ready=True,
                                     upstream="http://127.0.0.1:18123",
                                     served_model="/models/tiny")
    return deployment


def test_an_endpoint_is_scored_where_its_server_can_answer(world, api, farm, make_version,
                                                           suites, settings):
    version = make_version(world.alpha)
    mc, gen, ppl = suites()
    client = api.as_user(world.alpha_member)
    served = _deployment(world, farm, version, Runtime.TRANSFORMERS)

    refused = client.post(RUNS, {"version": version.pk, "benchmarks": [mc.pk, gen.pk, ppl.pk],
                                 "deployment": served.pk}, format="json")
    assert refused.status_code == 400
    reason = refused.json()["fields"]["deployment"][0]
    assert "mc, prose" in reason and "log-probabilities" in reason
    assert "transformers serve" in reason and "vLLM" in reason

    generation = client.post(RUNS, {"version": version.pk, "benchmarks": [gen.pk],
                                    "deployment": served.pk}, format="json")
    assert generation.status_code == 201, generation.json()
    run = EvaluationRun.objects.get(pk=generation.json()["id"])
    assert run.target == "endpoint" and run.deployment == served
    assert run.spec["model"] == "local-completions"
    args = run.spec["model_args"]
    assert args["base_url"] == "http://127.0.0.1:18123/v1/completions"
    assert args["model"] == "/models/tiny" and args["tokenizer_backend"] == "huggingface"
    assert args["tokenizer"] == str(Path(settings.DATA_DIR) / version.artifact_path)
    assert args["tokenized_requests"] is False
    assert run.spec["cache"].endswith("/endpoint-transformers/requests")
    # The deployment's key reaches the runner only in its job's secret environment, where
    # lm-eval's local-completions reads it (OPENAI_API_KEY) for its Authorization header.
    key = decrypt(Deployment.objects.get(pk=served.pk).api_key)
    secrets = json.loads(decrypt(run.job.secret_env))
    assert secrets["OPENAI_API_KEY"] == key and set(secrets) == {"OGAI_RUN_TOKEN",
                                                                  "OPENAI_API_KEY"}
    assert key not in json.dumps([run.spec, run.job.command, run.job.env])
    assert key.encode() not in client.get(f"{RUNS}{run.pk}/").content

    vllm = _deployment(world, farm, version, Runtime.VLLM)
    scored = client.post(RUNS, {"version": version.pk, "benchmarks": [mc.pk, ppl.pk],
                                "deployment": vllm.pk}, format="json")
    assert scored.status_code == 201, scored.json()
    assert "tokenized_requests" not in EvaluationRun.objects.get(
        pk=scored.json()["id"]).spec["model_args"]

    DeploymentReplica.objects.filter(deployment=vllm).update(ready=False)
    down = client.post(RUNS, {"version": version.pk, "benchmarks": [mc.pk],
                              "deployment": vllm.pk}, format="json")
    assert down.status_code == 400 and "no ready replica" in down.json()["message"]


def test_the_runner_reports_results_and_samples_once_however_often_it_sends(world, api,
                                                                            started):
    run, benchmarks, secret = started
    report = _report(run, benchmarks)
    first = _events(api, secret, report[:3])
    assert first.status_code == 200 and first.json() == {"accepted": 3}
    # The runner could not confirm the batch and sends it again, then the rest.
    assert _events(api, secret, report[:3]).status_code == 200
    assert _events(api, secret, report[2:]).status_code == 200
    run.refresh_from_db()
    assert run.succeeded and run.state == "succeeded" and run.total_requests == 20
    assert EvaluationSample.objects.filter(run=run).count() == 4
    assert EvaluationResult.objects.filter(run=run).count() == 4

    body = api.as_user(world.alpha_viewer).get(f"{RUNS}{run.pk}/").json()
    assert body["state"] == "succeeded" and body["cached_requests"] == 0
    results = {(r["benchmark"], r["metric"]): r for r in body["results"]}
    assert results[("mc", "acc")] == {"benchmark": "mc", "benchmark_id": benchmarks[0].pk,
                                      "metric": "acc", "value": 0.5, "stderr": 0.25,
                                      "samples": 4}
    assert results[("prose", "word_perplexity")]["stderr"] is None

    page = api.as_user(world.alpha_viewer).get(
        f"{RUNS}{run.pk}/samples/", {"benchmark": benchmarks[0].pk, "limit": 3}).json()
    assert page["count"] == 4 and len(page["results"]) == 3
    assert page["results"][0] == {"benchmark": "mc", "index": 0, "prompt": "Question 0",
                                  "target": "Paris", "output": "Rome", "correct": True,
                                  "scores": {"acc": 1.0}}
    wrong = api.as_user(world.alpha_viewer).get(f"{RUNS}{run.pk}/samples/",
                                                {"benchmark": 10**6})
    assert wrong.status_code == 400 and "benchmark" in wrong.json()["fields"]


def test_samples_take_the_benchmark_by_name_as_the_cli_does(world, api, started):
    run, benchmarks, secret = started
    _events(api, secret, _report(run, benchmarks))
    client = api.as_user(world.alpha_viewer)
    by_name = client.get(f"{RUNS}{run.pk}/samples/", {"benchmark": "mc"})
    assert by_name.status_code == 200, by_name.json()
    by_id = client.get(f"{RUNS}{run.pk}/samples/", {"benchmark": benchmarks[0].pk})
    assert by_name.json() == by_id.json() and by_name.json()["count"] == 4
    assert {row["benchmark"] for row in by_name.json()["results"]} == {"mc"}
    unknown = client.get(f"{RUNS}{run.pk}/samples/", {"benchmark": "arithmetic-em"})
    assert unknown.status_code == 400
    assert unknown.json()["fields"]["benchmark"] == [
        f"Run {run.pk} did not evaluate benchmark 'arithmetic-em' (it evaluated mc, prose, "
        "sums)."]
    pairs = client.get(f"{RUNS}{run.pk}/compare/", {"benchmark": "mc", "other": run.pk})
    assert pairs.status_code == 200 and len(pairs.json()) == 4


def test_runner_events_need_the_live_token_of_the_runs_job(world, api, started):
    run, benchmarks, secret = started
    assert _events(api, "ogj_not-a-token", _report(run, benchmarks)).status_code == 401
    assert _events(api, secret, [{"kind": "exploded", "data": {}}]).status_code == 400
    Job.objects.filter(pk=run.job_id).update(state=JobState.CANCELLED)
    ended = _events(api, secret, _report(run, benchmarks))
    assert ended.status_code == 401
    run.refresh_from_db()
    assert not run.succeeded and not EvaluationResult.objects.exists()
    assert api.as_user(world.alpha_member).post(EVENTS, {"events": []},
                                                format="json").status_code in (401, 403)


def test_cancel_stops_the_job(world, api, started):
    run, _, _ = started
    client = api.as_user(world.alpha_member)
    response = client.post(f"{RUNS}{run.pk}/cancel/")
    assert response.status_code == 202 and response.json()["state"] == "cancelled"
    run.job.refresh_from_db()
    assert run.job.state == JobState.CANCELLED
    assert client.post(f"{RUNS}{run.pk}/cancel/").status_code == 400
    assert api.as_user(world.beta_admin).post(f"{RUNS}{run.pk}/cancel/").status_code == 404


def _finished_run(world, version, benchmarks, *, acc, minutes_ago, succeeded=True,
                  limit=None, samples=0):
    run = EvaluationRun.objects.create(tenant=world.alpha, name="r", version=version,
                                       succeeded=succeeded, limit=limit,
                                       finished_at=timezone.now() - timedelta(
                                           minutes=minutes_ago))
    run.benchmarks.set(benchmarks)
    for benchmark in benchmarks:
        EvaluationResult.objects.create(run=run, benchmark=benchmark, metric="acc", value=acc,
                                        samples=samples)
    return run


def test_the_leaderboard_shows_each_versions_newest_succeeded_scores(world, api,
                                                                    make_version, suites):
    mc, gen, _ = suites()
    v1 = make_version(world.alpha, number=1)
    v2 = make_version(world.alpha, number=2)
    old = _finished_run(world, v1, [mc, gen], acc=0.2, minutes_ago=30)
    newer = _finished_run(world, v1, [mc], acc=0.4, minutes_ago=10, samples=mc.documents)
    _finished_run(world, v1, [mc], acc=0.9, minutes_ago=1, succeeded=False)
    # Limited to 2 documents, and the runner did not say how many it scored.
    limited = _finished_run(world, v2, [mc], acc=0.7, minutes_ago=5, limit=2)

    rows = api.as_user(world.alpha_viewer).get("/api/v1/mmodel/leaderboard/").json()
    assert mc.documents > 2

    def about(run, benchmark, documents, limit=None):
        return {"run": run.pk, "documents": documents, "limit": limit,
                "benchmark_documents": benchmark.documents,
                "benchmark_version": benchmark.content_hash[:12]}

    assert rows == [
        {"version": v2.pk, "label": "tiny:v2", "model": "tiny", "number": 2,
         "scores": {"mc": {"acc": 0.7}}, "runs": {"mc": about(limited, mc, 2, limit=2)}},
        {"version": v1.pk, "label": "tiny:v1", "model": "tiny", "number": 1,
         "scores": {"mc": {"acc": 0.4}, "sums": {"acc": 0.2}},
         "runs": {"mc": about(newer, mc, mc.documents),
                  "sums": about(old, gen, gen.documents)}},
    ]
    beta = api.as_user(world.beta_member).get("/api/v1/mmodel/leaderboard/",
                                              {"tenant": "alpha"})
    assert beta.status_code == 400 and beta.json()["fields"]["tenant"] == ["No tenant 'alpha'."]
    assert api.as_user(world.beta_member).get("/api/v1/mmodel/leaderboard/").json() == []
    both = api.as_user(world.both).get("/api/v1/mmodel/leaderboard/")
    assert both.status_code == 400 and "tenant" in both.json()["fields"]


def test_two_runs_compare_side_by_side_by_document(world, api, make_version, suites):
    mc, gen, _ = suites()
    version = make_version(world.alpha)
    a = _finished_run(world, version, [mc, gen], acc=0.5, minutes_ago=3)
    b = _finished_run(world, version, [mc], acc=0.5, minutes_ago=2)
    for run, outputs in ((a, ["Paris", "2", "dog"]), (b, ["Rome", "2"])):
        EvaluationSample.objects.bulk_create(
            EvaluationSample(run=run, benchmark=mc, index=i, prompt=f"q{i}", target="t",
                             output=out, correct=out in ("Paris", "2", "dog"))
            for i, out in enumerate(outputs))
    client = api.as_user(world.alpha_viewer)
    pairs = client.get(f"{RUNS}{a.pk}/compare/", {"other": b.pk, "benchmark": mc.pk}).json()
    assert [(p["index"], p["a"]["output"], p["b"]["output"]) for p in pairs] == [
        (0, "Paris", "Rome"), (1, "2", "2")]
    assert pairs[0]["a"]["correct"] is True and pairs[0]["b"]["correct"] is False
    other_benchmark = client.get(f"{RUNS}{a.pk}/compare/", {"other": b.pk,
                                                            "benchmark": gen.pk})
    assert other_benchmark.status_code == 400


def test_tenants_see_only_their_own_runs(world, api, started):
    run, _, _ = started
    assert api.as_user(world.beta_admin).get(RUNS).json()["results"] == []
    assert api.as_user(world.beta_admin).get(f"{RUNS}{run.pk}/").status_code == 404
    assert api.as_user(world.beta_admin).get(f"{RUNS}{run.pk}/samples/").status_code == 404
    listed = api.as_user(world.alpha_viewer).get(RUNS).json()["results"]
    assert [r["id"] for r in listed] == [run.pk]
    assert [b["name"] for b in listed[0]["benchmarks"]] == ["mc", "prose", "sums"]
    alpha_bench = listed[0]["benchmarks"][0]
    start = api.as_user(world.beta_member).post(RUNS, {"version": run.version.pk,
                                                       "benchmarks": [alpha_bench["id"]]},
                                                format="json")
    assert start.status_code == 400


def test_a_shared_benchmark_and_gen_kwargs_reach_the_task(world, api, farm, make_version):
    from mmodel.services.evaluation import benchmarks_seed_builtin

    benchmarks_seed_builtin()
    version = make_version(world.beta)
    response = api.as_user(world.beta_member).post(RUNS, {
        "version": version.pk, "benchmarks": ["arithmetic-em", "basic-facts-mc"]},
        format="json")
    assert response.status_code == 201, response.json()
    run = EvaluationRun.objects.get(pk=response.json()["id"])
    arithmetic = next(t for t in run.spec["tasks"] if t["kind"] == "generation")
    yaml_text = Path(run.spec["tasks_dir"], f"{arithmetic['task']}.yaml").read_text()
    assert "max_gen_toks: 8" in yaml_text and "num_fewshot: 3" in yaml_text
    assert "remove_whitespace" in yaml_text


def test_lists_cost_the_same_queries_however_many_rows(world, api, farm, make_version,
                                                       suites, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    version = make_version(world.alpha)
    benchmarks = suites()
    client = api.as_user(world.alpha_member)

    def count(url):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        return len(queries)

    def start():
        run = client.post(RUNS, {"version": version.pk,
                                 "benchmarks": [b.pk for b in benchmarks]}, format="json")
        assert run.status_code == 201
        EvaluationResult.objects.create(run_id=run.json()["id"], benchmark=benchmarks[0],
                                        metric="acc", value=0.5)

    start()
    runs_one, benchmarks_one = count(RUNS), count("/api/v1/mmodel/benchmarks/")
    for _ in range(3):
        start()
    assert count(RUNS) == runs_one
    assert count("/api/v1/mmodel/benchmarks/") == benchmarks_one
    with django_assert_max_num_queries(12):
        client.get(RUNS)
