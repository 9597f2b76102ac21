"""An evaluation as a user runs it: the tiny model scored on a multiple-choice, a generation
and a perplexity benchmark by `python -m mmodel.runners.evaluate` as a job on the local
driver (a real Celery worker, the runner reporting to the live API with its job token),
offline. The stored scores are what lm-eval reports when run by hand on the same compiled
tasks and files; a second run of the same version answers every request from the cache.
An endpoint evaluation scores generation through a real `transformers serve`."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from aistation.choices import FINAL_STATES, JobState
from mmodel.models import EvaluationResult, EvaluationSample
from mmodel.services.evaluation import evaluation_start
from mmodel.tests import evaluation_fixtures
from mmodel.tests.replica_server import replica_server
from ogai.crypto import decrypt, encrypt

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

_own_data_dir = evaluation_fixtures._own_data_dir
tiny_weights = evaluation_fixtures.tiny_weights
tiny_version = evaluation_fixtures.tiny_version
suites = evaluation_fixtures.suites

LIMIT = 4


@pytest.fixture
def one_thread(monkeypatch):
    """The job (through the worker's environment) and the by-hand run compute alike: the same
    number of threads sums in the same order."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _wait(run, timeout: float = 150.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        run.job.refresh_from_db()
        if run.succeeded:
            return run
        if run.job.state in FINAL_STATES and run.job.state != JobState.SUCCEEDED:
            break
        time.sleep(0.25)
    raise AssertionError(f"evaluation {run.pk} never finished: job {run.job.state} "
                         f"({run.job.reason}); message: {run.message}")


def _by_hand(spec: dict) -> dict:
    """lm-eval on the run's compiled tasks and the same model, with no cache."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf", model_args=spec["model_args"], tasks=[t["task"] for t in spec["tasks"]],
        task_manager=TaskManager(include_path=spec["tasks_dir"], include_defaults=False),
        limit=LIMIT, batch_size=1, bootstrap_iters=1000, log_samples=True)


def _stored(run) -> dict:
    return {(r.benchmark_id, r.metric): (r.value, r.stderr, r.samples)
            for r in EvaluationResult.objects.filter(run=run)}


def test_a_job_scores_like_lm_eval_by_hand_and_a_rerun_comes_from_the_cache(
        one_thread, world, local_queue, live_server, settings, celery_worker_process,
        tiny_version, suites):
    settings.OGAI_INTERNAL_URL = live_server.url
    version = tiny_version(world.alpha)
    benchmarks = suites()
    member = world.alpha_member
    first = evaluation_start(actor=member, tenant=world.alpha, version=version,
                             benchmarks=benchmarks, queue=local_queue, limit=LIMIT)
    first = _wait(first)
    # Started at once: the by-hand run below overlaps it.
    second = evaluation_start(actor=member, tenant=world.alpha, version=version,
                              benchmarks=benchmarks, queue=local_queue, limit=LIMIT)

    assert first.total_requests > 0 and first.cached_requests == 0
    stored = _stored(first)
    reported = _by_hand(first.spec)
    expected = {}
    for task in first.spec["tasks"]:
        result = reported["results"][task["task"]]
        count = reported["n-samples"][task["task"]]["effective"]
        for key, value in result.items():
            metric, _, filter_name = key.partition(",")
            if filter_name != task["filter"] or metric.endswith("_stderr"):
                continue
            stderr = result[f"{metric}_stderr,{filter_name}"]
            expected[(task["benchmark"], metric)] = (
                value, None if stderr == "N/A" else stderr, count)
    assert stored == expected
    assert {metric for _, metric in stored} == {
        "acc", "acc_norm", "exact_match", "word_perplexity", "byte_perplexity",
        "bits_per_byte"}

    # One sample per document evaluated, whose verdicts add up to the score.
    mc, gen, ppl = benchmarks
    for benchmark, metric in ((mc, "acc"), (gen, "exact_match")):
        samples = EvaluationSample.objects.filter(run=first, benchmark=benchmark)
        assert samples.count() == LIMIT
        correct = samples.filter(correct=True).count()
        assert correct / LIMIT == stored[(benchmark.pk, metric)][0]
    by_hand = {s["doc_id"]: s for s in reported["samples"][f"ogai_b{gen.pk}"]}
    for sample in EvaluationSample.objects.filter(run=first, benchmark=gen):
        assert sample.output == by_hand[sample.index]["resps"][0][0]
        assert sample.prompt == by_hand[sample.index]["arguments"][0][0]
    prose = EvaluationSample.objects.filter(run=first, benchmark=ppl).order_by("index")
    assert [s.target for s in prose] == [d["text"] for d in evaluation_fixtures.PPL_DOCS]
    mc_prompt = EvaluationSample.objects.get(run=first, benchmark=mc, index=0).prompt
    assert mc_prompt.endswith("Question: What is the capital of France?\nAnswer:")
    assert mc_prompt.count("Question:") == 2  # one few-shot example before it

    second = _wait(second)
    assert second.total_requests == first.total_requests
    assert second.cached_requests == second.total_requests
    assert _stored(second) == stored


SERVER_KEY = "the-tiny-deployments-key"


@pytest.fixture
def served_tiny(tiny_weights, tmp_path):
    """`transformers serve` answering for the tiny model on a free port, behind the launcher
    that requires the deployment's key (SERVER_KEY), as a replica runs it."""
    with replica_server("mmodel.runners.serve_transformers",
                        ["serve", str(tiny_weights), "--device", "cpu"], key=SERVER_KEY,
                        logs=tmp_path, timeout=90) as url:
        yield url, str(tiny_weights)


def test_a_transformers_deployment_is_scored_on_generation(world, farm, tiny_version, suites,
                                                           served_tiny):
    """The endpoint arguments the platform writes work against a real `transformers serve`:
    the runner (here run directly, its events printed) scores generation through it."""
    from mmodel.models import Deployment, DeploymentReplica
    from mmodel.services.evaluation_events import evaluation_events_apply

    upstream, served_model = served_tiny
    version = tiny_version(world.alpha)
    _, gen, _ = suites()
    deployment = Deployment.objects.create(tenant=world.alpha, name="tiny", version=version,
                                           queue=farm.queues["alpha"],
                                           api_key=encrypt(SERVER_KEY))
    job = farm.submit("alpha", gpus=0, name="serve")
    type(job).objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, ready=True,
                                     upstream=upstream, served_model=served_model)
    run = evaluation_start(actor=world.alpha_member, tenant=world.alpha, version=version,
                           benchmarks=[gen], queue=farm.queues["alpha"],
                           deployment=deployment, limit=3)
    spec_path = Path(run.spec["tasks_dir"]).parent / "spec.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OGAI_URL", "OGAI_RUN_TOKEN")}
    # What the job's processes get besides: the deployment's key, for lm-eval to send.
    secrets = json.loads(decrypt(run.job.secret_env))
    env["OPENAI_API_KEY"] = secrets["OPENAI_API_KEY"]
    assert httpx.post(f"{upstream}/v1/completions", json={"model": served_model, "prompt": "x"})\
        .status_code == 401  # the server takes nothing without it
    finished = subprocess.run(
        [sys.executable, "-m", "mmodel.runners.evaluate", "--spec", str(spec_path)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    events = [json.loads(line.removeprefix("OGAI-EVENT "))
              for line in finished.stdout.splitlines() if line.startswith("OGAI-EVENT ")]
    assert finished.returncode == 0, finished.stderr[-3000:]
    evaluation_events_apply(job=run.job, events=events)
    run.refresh_from_db()
    assert run.succeeded and run.total_requests == 3
    result = EvaluationResult.objects.get(run=run, benchmark=gen, metric="exact_match")
    assert result.samples == 3
    outputs = list(EvaluationSample.objects.filter(run=run).values_list("output", flat=True))
    assert len(outputs) == 3 and all(outputs)  # the server answered every prompt
