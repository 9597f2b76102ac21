"""`ogai model`, `benchmark`, `eval`, `deploy` and `chat` against the real API (`live_server`).

The CLI runs in-process (`main([...])`) with its URL and token from the environment. Jobs run
on the fake driver and no runner runs: between two polls the test plays the evaluation runner
(its reports applied with `evaluation_events_apply`) or the deployment watcher, in the test's
thread. The gateway is an ASGI app that `live_server` does not serve: `ogai chat` is tested
against a small stub speaking the OpenAI streaming format.
"""

import io
import json
import shutil
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.files.base import ContentFile
from django.utils import timezone

from aistation.choices import JobState
from infra_os.services.tokens import api_token_create
from mmodel.choices import WeightsFormat
from mmodel.models import (
    Benchmark,
    Deployment,
    EvaluationRun,
    Model,
    ModelImport,
    ModelVersion,
)
from mmodel.services import deployment_watch
from mmodel.services.deployment_watch import deployments_watch
from mmodel.services.evaluation import benchmark_create, evaluation_cancel
from mmodel.services.evaluation_events import evaluation_events_apply
from mmodel.tests import evaluation_fixtures, registry_fixtures
from mmodel.tests.evaluation_fixtures import GEN_DOCS, MC_DOCS, jsonl
from mmodel.tests.tiny import tiny_model
from ogai_client import OgaiClient, OgaiError, cli
from ogai_client.ylink import _size
from ylink.models import TrainingRun
from ylink.services.datasets import dataset_create, dataset_upload

live = pytest.mark.django_db(transaction=True)

make_version = evaluation_fixtures.make_version
eager = registry_fixtures.eager


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path, settings):
    """No real config or environment; the platform's files and the import root under
    tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    (tmp_path / "imports").mkdir()
    settings.OGAI_MODEL_IMPORT_ROOTS = [str(tmp_path / "imports")]
    settings.OGAI_MODEL_ALLOW_PICKLE = False
    settings.OGAI_RETRY_BACKOFF_S = 0


@pytest.fixture
def roots(tmp_path):
    return tmp_path / "imports"


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny-cli") / "model")


@pytest.fixture
def as_member(world, live_server, monkeypatch):
    monkeypatch.setenv("OGAI_URL", live_server.url)
    token = api_token_create(actor=world.alpha_member, name="test",
                             expires_at=timezone.now() + timedelta(days=1)).secret
    monkeypatch.setenv("OGAI_TOKEN", token)
    return world.alpha_member


def ogai(capsys, *argv, failure_is_an_error=True):
    """Run the CLI; returns (exit code, stdout, stderr). Every error is one stderr line."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0 and failure_is_an_error:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def words(text):
    """The text with its whitespace (table padding, wrapped lines) made single spaces."""
    return " ".join(text.split())


# -- the registry -------------------------------------------------------------------------------

@live
def test_import_follows_to_a_ready_version_listed_and_shown(as_member, roots, tiny_source, eager,
                                                            capsys, monkeypatch):
    folder = shutil.copytree(tiny_source, roots / "tiny")
    monkeypatch.chdir(roots)  # a relative path is sent absolute
    code, out, err = ogai(capsys, "model", "import", "tiny", "--name", "tiny", "-f",
                          "--interval", 0.1)
    assert code == 0, err
    version = ModelVersion.objects.get()
    started = ModelImport.objects.get()
    assert (started.state, version.status, version.source_path) == ("succeeded", "ready",
                                                                    str(folder))
    assert "created model tiny" in err
    assert out.startswith(f"import {started.pk} of {folder} started: tiny:v1 (version "
                          f"{version.pk}), ")
    assert words(out.splitlines()[-1]) == (
        f"tiny:v1 ready: LlamaForCausalLM (llama), {version.parameters:,} parameters, "
        f"safetensors, {_size(version.bytes)}, context 256")

    code, out, err = ogai(capsys, "model", "list")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if " tiny " in f" {line} ")
    assert row[1:5] == ["tiny", "1", "v1", "ready"]

    code, out, err = ogai(capsys, "model", "show", "tiny")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if line.startswith("v1 "))
    assert row[1:5] == [str(version.pk), "ready", "safetensors", "LlamaForCausalLM"]
    assert f"{version.parameters:,}" in row and "import" in row
    assert "lineage of tiny:v1" in out and f"imported from {folder}" in out

    code, out, err = ogai(capsys, "model", "show", "tiny:v1")
    assert code == 0, err
    assert "model.safetensors" in out and "tokenizer.json" in out and "files" in out
    code, out, _ = ogai(capsys, "model", "show", "tiny:1", "--json")
    assert json.loads(out)["label"] == "tiny:v1"

    # A second import is the next version of the same model.
    code, out, err = ogai(capsys, "model", "import", folder, "--name", "tiny", "--json")
    assert code == 0, err
    assert json.loads(out)["version_number"] == 2
    assert Model.objects.count() == 1


@live
def test_an_import_refused_is_one_line(as_member, roots, tiny_source, tmp_path, capsys):
    outside = shutil.copytree(tiny_source, tmp_path / "outside")
    code, out, err = ogai(capsys, "model", "import", outside, "--name", "tiny")
    assert code == 1 and not out
    assert err == f"error: source_path: {outside} is outside the import roots: {roots}.\n"
    assert not ModelImport.objects.exists() and not ModelVersion.objects.exists()
    assert not Model.objects.exists()  # no empty model left behind

    inside = shutil.copytree(tiny_source, roots / "code")
    (inside / "modeling_tiny.py").write_text("import os\n")
    code, _, err = ogai(capsys, "model", "import", inside, "--name", "tiny", "-f")
    assert code == 1
    assert "modeling_tiny.py is Python code" in err and "trust_remote_code" in err
    code, _, err = ogai(capsys, "model", "import", roots / "nope", "--name", "tiny")
    assert code == 1 and f"{roots / 'nope'} does not exist" in err
    assert not ModelVersion.objects.exists()


@pytest.fixture
def trained(world, tmp_path, tiny_source):
    """A finished pretraining run of alpha on a dataset version, its output a tiny model."""
    dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name="corpus")
    data = dataset_upload(actor=world.alpha_member, dataset=dataset, upload=ContentFile(
        b'{"text": "The first document, long enough to count."}\n', name="c.jsonl"))
    output = shutil.copytree(tiny_source, tmp_path / "run-output")
    return TrainingRun.objects.create(
        tenant=world.alpha, created_by=world.alpha_member, name="demo-pretrain",
        kind="pretrain", dataset_version=data, spec={}, folder="r", succeeded=True,
        artifact="model", output_path=str(output), parameters=30880)


@live
def test_register_a_run_show_its_lineage_and_delete(as_member, trained, capsys):
    code, out, err = ogai(capsys, "model", "register", "--run", trained.pk, "--name", "tiny")
    assert code == 0, err
    version = ModelVersion.objects.get()
    assert version.training_run == trained and version.source == "training"
    assert words(out).startswith(f"training run {trained.pk} registered as tiny:v1 (version "
                                 f"{version.pk}): LlamaForCausalLM (llama), "
                                 f"{version.parameters:,} parameters, safetensors")

    code, out, err = ogai(capsys, "model", "show", "tiny")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("v1 "))
    assert f"training run {trained.pk}" in row
    lineage = out.split("lineage of tiny:v1", 1)[1].splitlines()
    order = [next(i for i, line in enumerate(lineage) if text in line)
             for text in ("tiny:v1", "demo-pretrain (pretrain)", "corpus v1")]
    assert order == sorted(order)  # the version, what made it, what that was made from
    assert f"training run {trained.pk}" in lineage[order[1]]
    assert "dataset version" in lineage[order[2]]

    code, _, err = ogai(capsys, "model", "register", "--run", trained.pk, "--name", "tiny")
    assert code == 1
    assert err.strip() == (f"error: training_run: Training run {trained.pk} is already "
                           "registered as tiny:v1.")
    code, _, err = ogai(capsys, "model", "register", "--run", 999999, "--name", "tiny")
    assert code == 1 and "training_run: No such training run." in err

    code, _, err = ogai(capsys, "model", "delete", "tiny")
    assert code == 2 and "name the version to delete: tiny:vN" in err
    code, out, err = ogai(capsys, "model", "delete", "tiny:v1")
    assert code == 0, err
    assert out == f"deleted tiny:v1 (version {version.pk})\n"
    assert not ModelVersion.objects.exists()
    code, _, err = ogai(capsys, "model", "show", "tiny:v1")
    assert code == 1 and "model version tiny:v1 not found" in err
    code, _, err = ogai(capsys, "model", "show", "nope")
    assert code == 1 and "model nope not found" in err
    code, _, err = ogai(capsys, "model", "show", "tiny:vx")
    assert code == 2 and "'tiny:vx' is not a model version" in err


# -- benchmarks ---------------------------------------------------------------------------------

def write_jsonl(path, docs):
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return path


@live
def test_upload_a_benchmark_and_a_bad_file_names_its_line(as_member, capsys, tmp_path):
    path = write_jsonl(tmp_path / "mc.jsonl", MC_DOCS)
    code, out, err = ogai(capsys, "benchmark", "upload", path, "--name", "mc", "--kind",
                          "multiple_choice", "--prompt", r"Q: {{question}}\nA:",
                          "--metric", "acc_norm")
    assert code == 0, err
    benchmark = Benchmark.objects.get()
    assert (benchmark.name, benchmark.kind, benchmark.documents) == ("mc", "multiple_choice", 5)
    assert benchmark.prompt_template == "Q: {{question}}\nA:"  # typed as \\n
    assert benchmark.metrics == ["acc_norm"]
    assert out.startswith(f"benchmark {benchmark.pk} uploaded: mc (multiple_choice) in alpha, "
                          "5 documents\n")
    assert "Q: What is the capital of France?\nA:" in out
    assert "choices: Paris, Rome, Oslo" in out

    sums = write_jsonl(tmp_path / "sums.jsonl", GEN_DOCS)
    code, out, err = ogai(capsys, "benchmark", "upload", sums, "--name", "sums", "--kind",
                          "generation", "--prompt", "{{question}} Answer:", "--few-shot", 2,
                          "--json")
    assert code == 0, err
    assert (json.loads(out)["few_shot"], json.loads(out)["documents"]) == (2, 5)

    code, out, err = ogai(capsys, "benchmark", "list", "--kind", "multiple_choice")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if " mc " in f" {line} ")
    assert row[1:5] == ["mc", "alpha", "multiple_choice", "5"]
    assert "sums" not in out
    code, out, _ = ogai(capsys, "benchmark", "show", "sums")
    assert "{{question}} Answer:" in out and "What is 1 + 1? Answer:" in out

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(MC_DOCS[0]) + "\n" + json.dumps({"question": "No choices?",
                                                               "answer": 0}) + "\n")
    code, out, err = ogai(capsys, "benchmark", "upload", bad, "--name", "bad", "--kind",
                          "multiple_choice")
    assert code == 1 and not out
    assert err.startswith("error: choices_template: line 2: "), err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(MC_DOCS[0]) + "\n{not json\n")
    code, _, err = ogai(capsys, "benchmark", "upload", broken, "--name", "bad", "--kind",
                        "multiple_choice")
    assert code == 1 and "line 2" in err, err
    code, _, err = ogai(capsys, "benchmark", "upload", tmp_path / "missing.jsonl", "--name",
                        "x", "--kind", "generation")
    assert code == 1 and "cannot read" in err and "missing.jsonl" in err
    assert Benchmark.objects.count() == 2


# -- evaluation ---------------------------------------------------------------------------------

@pytest.fixture
def suite(world):
    return [benchmark_create(actor=world.alpha_member, tenant=world.alpha, name="mc",
                             kind="multiple_choice", data=jsonl(MC_DOCS)),
            benchmark_create(actor=world.alpha_member, tenant=world.alpha, name="sums",
                             kind="generation", data=jsonl(GEN_DOCS),
                             prompt_template="{{question}} Answer:")]


@live
def test_eval_run_without_follow_starts_a_job(as_member, farm, world, make_version, suite,
                                              capsys, monkeypatch):
    version = make_version(world.alpha)
    code, out, err = ogai(capsys, "eval", "run", "tiny", "--benchmark", "mc,sums", "--limit", 3)
    assert code == 0, err
    run = EvaluationRun.objects.get()
    assert run.version == version and run.limit == 3
    assert sorted(run.benchmarks.values_list("name", flat=True)) == ["mc", "sums"]
    assert run.job.queue == farm.queues["alpha"] and run.job.state == JobState.QUEUED
    assert "mmodel.runners.evaluate" in run.job.command
    assert words(out).startswith(f"evaluation run {run.pk} started: tiny:v1 on mc, sums (its "
                                 f"weights, at most 3 documents each), job {run.job_id}, "
                                 "queued")

    code, out, err = ogai(capsys, "eval", "list")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [str(run.pk)])
    assert row[1:5] == ["tiny:v1", "mc,", "sums", "weights"]
    code, out, _ = ogai(capsys, "eval", "cancel", run.pk)
    assert f"evaluation run {run.pk} cancelled" in out
    code, _, err = ogai(capsys, "eval", "cancel", run.pk)
    assert code == 1 and f"state: Evaluation run {run.pk} already cancelled." in err

    # -f exits 1 for a run that does not succeed.
    def cancel():
        evaluation_cancel(actor=world.alpha_member, run=EvaluationRun.objects.first())

    monkeypatch.setattr(cli, "_pause", Turns(farm, [cancel]).pause)
    code, _, err = ogai(capsys, "eval", "run", "tiny", "-b", "mc", "-f",
                        failure_is_an_error=False)
    second = EvaluationRun.objects.first()
    assert code == 1 and second != run
    assert err.splitlines()[-1].startswith(f"error: evaluation run {second.pk} cancelled")
    code, _, err = ogai(capsys, "eval", "run", "tiny:v7", "-b", "mc")
    assert code == 1 and "model version tiny:v7 not found" in err
    code, _, err = ogai(capsys, "eval", "run", "tiny", "-b", "nope")
    assert code == 1 and "benchmarks: No benchmark 'nope'." in err


class Turns:
    """Plays a run's runner and its cluster, one scripted turn per pause of the CLI's `-f`."""

    def __init__(self, farm, turns):
        self.farm = farm
        self.turns = list(turns)
        self.pauses = 0

    def pause(self, seconds):
        self.pauses += 1
        assert self.pauses < 20, "the CLI did not stop following"
        turn = self.turns.pop(0) if self.turns else None
        if turn is not None:
            turn()
        self.farm.cycle()


@live
def test_eval_follow_prints_results_then_samples_and_leaderboard(as_member, farm, world,
                                                                 make_version, suite, capsys,
                                                                 monkeypatch):
    make_version(world.alpha)
    mc, sums = suite

    def report(*events):
        return lambda: evaluation_events_apply(job=EvaluationRun.objects.get().job,
                                               events=list(events))

    samples = [{"index": i, "prompt": f"Question: {doc['question']}\nAnswer:",
                "target": doc["choices"][doc["answer"]], "output": doc["choices"][0],
                "correct": doc["answer"] == 0, "scores": {"acc": float(doc["answer"] == 0)}}
               for i, doc in enumerate(MC_DOCS)]
    turns = Turns(farm, [
        None,
        report({"kind": "started", "data": {}}),
        report({"kind": "result", "data": {"benchmark": mc.pk, "samples": 5, "metrics": {
                    "acc": {"value": 0.4, "stderr": 0.2449}}}},
               {"kind": "samples", "data": {"benchmark": mc.pk, "samples": samples}},
               {"kind": "result", "data": {"benchmark": sums.pk, "samples": 5, "metrics": {
                   "exact_match": {"value": 0.2, "stderr": None}}}},
               {"kind": "finished", "data": {"total_requests": 20, "cached_requests": 5}}),
    ])
    monkeypatch.setattr(cli, "_pause", turns.pause)
    code, out, err = ogai(capsys, "eval", "run", "tiny:v1", "-b", "mc", "-b", "sums", "-f")
    assert code == 0, err
    run = EvaluationRun.objects.get()
    assert f"evaluation run {run.pk}: running" in err
    assert f"evaluation run {run.pk}: succeeded" in err
    assert "20 requests, 5 answered from the cache of earlier runs" in err
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()}
    assert rows[("mc", "acc")] == ["0.4000", "0.2449", "5"]
    assert rows[("sums", "exact_match")] == ["0.2000", "-", "5"]

    code, out, err = ogai(capsys, "eval", "samples", run.pk, "--benchmark", "mc", "-n", 2)
    assert code == 0, err
    blocks = out.strip().split("\n\n")
    assert blocks[0].splitlines()[0].startswith("#0  right")
    assert "expected: Paris" in blocks[0] and "answer:   Paris" in blocks[0]
    assert blocks[1].splitlines()[0].startswith("#1  wrong")
    assert "samples 0 to 1 of 5; --offset 2 for more" in err
    code, _, err = ogai(capsys, "eval", "samples", run.pk, "--benchmark", "prose")
    assert code == 1 and "did not evaluate benchmark prose (it evaluated mc, sums)" in err

    code, out, err = ogai(capsys, "eval", "leaderboard")
    assert code == 0, err
    header, row = out.splitlines()[:2]
    assert header.split() == ["VERSION", "mc", "acc", "sums", "exact_match"]
    assert row.split() == ["tiny:v1", "0.4000", "0.2000"]
    code, out, _ = ogai(capsys, "eval", "show", run.pk)
    assert "succeeded" in out and "20 requests, 5 answered from the cache" in words(out)


@live
def test_eval_leaderboard_says_which_scores_a_limit_cut_short(as_member, world, make_version,
                                                             suite, capsys):
    mc, _ = suite
    full, quick = make_version(world.alpha, number=1), make_version(world.alpha, number=2)
    for version, limit, samples, acc in ((full, None, 5, 0.4), (quick, 2, 2, 1.0)):
        run = EvaluationRun.objects.create(tenant=world.alpha, name="r", version=version,
                                           succeeded=True, finished_at=timezone.now(),
                                           limit=limit)
        run.results.create(benchmark=mc, metric="acc", value=acc, samples=samples)
    code, out, err = ogai(capsys, "eval", "leaderboard")
    assert code == 0, err
    rows = {line.split()[0]: words(line) for line in out.splitlines()[1:] if line.strip()}
    assert rows["tiny:v2"] == "tiny:v2 1.0000 (2 docs, limit)"
    assert rows["tiny:v1"] == "tiny:v1 0.4000"
    assert "over fewer documents than their benchmark holds" in words(err)
    code, out, _ = ogai(capsys, "eval", "leaderboard", "--json")
    by_label = {row["label"]: row for row in json.loads(out)}
    assert by_label["tiny:v2"]["runs"]["mc"]["limit"] == 2
    assert by_label["tiny:v2"]["runs"]["mc"]["documents"] == 2
    assert by_label["tiny:v1"]["runs"]["mc"]["benchmark_documents"] == 5


# -- deployments --------------------------------------------------------------------------------

@live
def test_deploy_create_wait_list_scale_stop_start_delete(as_member, farm, world, make_version,
                                                         live_server, capsys, monkeypatch):
    make_version(world.alpha)
    monkeypatch.setattr(deployment_watch, "probe_health", lambda upstream: (True, "", ()))
    monkeypatch.setattr(cli, "_pause", lambda seconds: (farm.cycle(), deployments_watch()))
    code, out, err = ogai(capsys, "deploy", "create", "chat", "--version", "tiny",
                          "--replicas", 2, "--gpus", 1, "--memory", "8Gi", "-w")
    assert code == 0, err
    deployment = Deployment.objects.get()
    assert (deployment.replicas, deployment.gpus_per_replica,
            deployment.memory_mib_per_replica) == (2, 1, 8192)
    assert words(out).startswith("deployment chat created: tiny:v1 on transformers, 2 x (1 "
                                 "GPU, 2 CPU, 8Gi) in alpha/default, starting")
    assert "deployment chat: starting, 0/2 replicas ready" in err
    assert "deployment chat: ready, 2/2 replicas ready" in err
    assert f"call it as model 'chat' at {live_server.url}/v1/" in words(out)

    code, out, err = ogai(capsys, "deploy", "list")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if line.startswith("chat "))
    assert row[1:7] == ["tiny:v1", "transformers", "ready", "2/2", "2x1", "never"]

    code, out, err = ogai(capsys, "deploy", "scale", "chat", 3)
    assert code == 0, err
    assert out.startswith("deployment chat: 3 replicas (was 2), ")
    assert Deployment.objects.get().replicas == 3
    code, out, err = ogai(capsys, "deploy", "show", "chat")
    assert code == 0, err
    lines = [line.strip() for line in out.splitlines()]
    title = lines.index("replicas")
    replicas = [line.split() for line in lines[title + 2:title + 5]]
    assert [row[:2] for row in replicas] == [
        [str(r.index), str(r.job_id)] for r in Deployment.objects.get().replica_set.all()]
    assert [row[2] for row in replicas] == ["running", "running", "queued"]
    assert "no requests in the last 60 minutes" in err

    code, out, err = ogai(capsys, "deploy", "stop", "chat")
    assert code == 0, err
    assert out.startswith("deployment chat stopped: its replicas' jobs are cancelled")
    assert all(r.job.state == JobState.CANCELLED
               for r in Deployment.objects.get().replica_set.select_related("job"))
    code, _, err = ogai(capsys, "deploy", "stop", "chat")
    assert code == 1 and "state: Deployment chat is already stopped." in err
    code, out, err = ogai(capsys, "deploy", "start", "chat", "-w")
    assert code == 0, err
    assert out.startswith("deployment chat starting")
    assert "deployment chat: ready, 3/3 replicas ready" in err

    code, _, err = ogai(capsys, "deploy", "create", "other", "--version", "tiny",
                        "--idle-timeout", 10)
    assert code == 1 and err.startswith("error: idle_timeout_s: Use 0 (never scale to zero)")
    code, out, err = ogai(capsys, "deploy", "delete", "chat")
    assert code == 0 and out == "deployment chat deleted\n", err
    assert not Deployment.objects.exists()
    code, _, err = ogai(capsys, "deploy", "show", "chat")
    assert code == 1 and "deployment chat not found" in err


@live
def test_deploy_create_a_pool_and_show_what_its_replica_holds(as_member, farm, world,
                                                              make_version, capsys,
                                                              monkeypatch):
    base = make_version(world.alpha)
    adapter = make_version(world.alpha, number=2)
    adapter.format, adapter.base_version = WeightsFormat.ADAPTER, base
    adapter.save()
    monkeypatch.setattr(deployment_watch, "probe_health",
                        lambda upstream: (True, "", ("tiny", "tuned")))
    code, out, err = ogai(capsys, "deploy", "create", "tiny", "--version", "tiny:v1",
                          "--pool", "tuned=tiny:v2", "--max-loras", 2, "--pool-memory", "1Gi")
    assert code == 0, err
    deployment = Deployment.objects.get()
    assert (deployment.max_loras, deployment.pool_memory_mib) == (2, 1024)
    assert [(m.name, m.version_id) for m in deployment.members.all()] == [("tuned", adapter.pk)]
    farm.cycle()
    deployments_watch()
    code, out, err = ogai(capsys, "deploy", "show", "tiny")
    assert code == 0, err
    lines = [line.split() for line in out.splitlines()]
    title = next(i for i, line in enumerate(lines) if line[:4] == ["models", "in", "this",
                                                                   "pool"])
    assert lines[title + 2:title + 4] == [["tiny", "base", "tiny:v1", "replica", "0"],
                                          ["tuned", "adapter", "tiny:v2", "replica", "0"]]
    code, _, err = ogai(capsys, "deploy", "create", "x", "--version", "tiny", "--pool",
                        "nothing")
    assert code == 2 and "give NAME=MODEL[:vN], not 'nothing'" in err

    other = make_version(world.alpha, number=3)
    other.format, other.base_version = WeightsFormat.ADAPTER, base
    other.save()
    code, out, err = ogai(capsys, "deploy", "pool", "add", "tiny", "second=tiny:v3")
    assert code == 0, err
    assert words(out).startswith("pool tiny serves second (tiny:v3); its running replicas "
                                 "start again")
    assert sorted(deployment.members.values_list("name", flat=True)) == ["second", "tuned"]
    code, out, err = ogai(capsys, "deploy", "pool", "remove", "tiny", "tuned")
    assert code == 0 and "pool tiny no longer serves tuned" in words(out), err
    code, _, err = ogai(capsys, "deploy", "pool", "remove", "tiny", "tuned")
    assert code == 1 and "serves no model 'tuned'" in err


# -- chat through the gateway (a stub of it) ----------------------------------------------------

class Gateway(BaseHTTPRequestHandler):
    """Answers /v1/chat/completions like the gateway: "echo" streams "You said: <last turn>"
    in pieces; "slow" waits for the client to have read its first piece before the rest;
    "missing", "busy" and "cold" are refused (404, 429, 503); "broken" breaks off."""

    requests: list[dict] = []
    first_piece_read = threading.Event()
    waited: bool | None = None

    def log_message(self, *args):
        pass

    def _error(self, status, message, code, retry_after=None):
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "param": "model" if status == 404 else None,
                                     "code": code}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after:
            self.send_header("Retry-After", str(retry_after))
        self.end_headers()
        self.wfile.write(body)

    def _event(self, data):
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _piece(self, text):
        self._event({"object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": text}}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["authorization"] = self.headers.get("Authorization")
        Gateway.requests.append(body)
        if self.path != "/v1/chat/completions":
            return self._error(404, f"Invalid URL (POST {self.path}).", "unknown_url")
        model = body["model"]
        if model == "missing":
            return self._error(404, "The model `missing` does not exist or you do not have "
                               "access to it.", "model_not_found")
        if model == "busy":
            return self._error(429, "Rate limit reached for tenant alpha: 2 requests per "
                               "minute. Retry after 7 s.", "rate_limit_exceeded", 7)
        if model == "cold":
            return self._error(503, "The model `cold` is starting (it was scaled to zero); "
                               "retry shortly.", "model_starting", 5)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if model == "broken":
            self._piece("Half an ans")
            return self._event({"error": {"message": "The model server of `broken` broke "
                                          "off its answer.", "type": "server_error",
                                          "code": "upstream_error"}})
        last = body["messages"][-1]["content"]
        self._piece("You said: ")
        if model == "slow":
            # Only a client that hands on each piece as it arrives gets past this.
            Gateway.waited = Gateway.first_piece_read.wait(5)
        self._piece(last)
        self._event({"object": "chat.completion.chunk", "choices": [],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def gateway(monkeypatch):
    Gateway.requests = []
    Gateway.first_piece_read = threading.Event()
    Gateway.waited = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("OGAI_URL", url)
    monkeypatch.setenv("OGAI_TOKEN", "ogai-token")
    yield url
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_chat_streams_the_answer_and_keeps_a_conversation(gateway, capsys, monkeypatch):
    code, out, err = ogai(capsys, "chat", "echo", "Hello there", "--system", "Be brief.",
                          "--temperature", 0.2, "--max-tokens", 16)
    assert code == 0, err
    assert out == "You said: Hello there\n"
    sent = Gateway.requests[-1]
    assert sent["authorization"] == "Bearer ogai-token"
    assert sent["stream"] is True and sent["temperature"] == 0.2 and sent["max_tokens"] == 16
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello there"}]

    # Without PROMPT each line is a turn, and the answers so far go along with the next one.
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n\nHow are you?\n"))
    code, out, err = ogai(capsys, "chat", "echo")
    assert code == 0, err
    assert out == "You said: Hi\nYou said: How are you?\n"
    assert Gateway.requests[-1]["max_tokens"] == 256, "an answer has a bound by default"
    assert Gateway.requests[-1]["messages"] == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "You said: Hi"},
        {"role": "user", "content": "How are you?"}]


@pytest.mark.parametrize(("model", "line"), [
    ("missing", "error: The model `missing` does not exist or you do not have access to it; "
                "`ogai deploy list` shows your deployments"),
    ("busy", "error: Rate limit reached for tenant alpha: 2 requests per minute. Retry after "
             "7 s."),
    ("cold", "error: The model `cold` is starting (it was scaled to zero); retry shortly; "
             "retry after 5 s."),
    ("broken", "error: The model server of `broken` broke off its answer."),
])
def test_chat_refusals_are_one_line_and_exit_1(gateway, capsys, model, line):
    code, out, err = ogai(capsys, "chat", model, "Hello")
    assert code == 1
    assert err == line + "\n"
    assert out == ("Half an ans\n" if model == "broken" else "")


def test_the_sdk_hands_on_each_piece_as_it_arrives(gateway):
    with OgaiClient.from_config() as client:
        pieces = client.chat_stream("slow", [{"role": "user", "content": "now"}])
        assert next(pieces) == "You said: "
        Gateway.first_piece_read.set()  # the stub sends the rest only now
        assert list(pieces) == ["now"]
        assert Gateway.waited is True
        with pytest.raises(OgaiError) as refused:
            list(client.chat_stream("busy", [{"role": "user", "content": "x"}]))
        assert (refused.value.status, refused.value.code) == (429, "rate_limit_exceeded")
