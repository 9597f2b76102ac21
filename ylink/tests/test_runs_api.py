"""Starting pipeline and training runs through the API, the job token the runner reports
with, and what its reports do to the run."""

import json
from pathlib import Path

import pytest

from aistation.choices import JobState
from aistation.models import Job
from aistation.services.transitions import job_transition
from ogai.crypto import decrypt
from ylink import storage
from ylink.models import DatasetVersion, PipelineRun, TrainingMetric, TrainingRun
from ylink.services.runner_events import runner_events_apply
from ylink.tests.conftest import jsonl

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/ylink/pipeline-runs/"
TRAINING = "/api/v1/ylink/training-runs/"
EVENTS = "/api/v1/ylink/runner/events/"


def _start_pipeline(client, version, **extra):
    body = {"dataset_version": version.pk, "tenant": "alpha",
            "steps": [{"type": "normalize"}, {"type": "exact_dedup"}], **extra}
    return client.post(RUNS, body, format="json")


def _secret_of(job: Job) -> str:
    return json.loads(decrypt(job.secret_env))["OGAI_RUN_TOKEN"]


def _post_events(client, secret, *events):
    return client.post(EVENTS, {"events": list(events)}, format="json",
                       HTTP_AUTHORIZATION=f"Bearer {secret}")


def test_a_pipeline_run_starts_one_job_that_runs_the_data_runner(api, farm, make_version):
    version = make_version()
    client = api.as_user(farm.world.alpha_member)
    response = _start_pipeline(client, version, replicas=2)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "queued" and body["replicas"] == 2
    assert [s["type"] for s in body["steps"]] == ["normalize", "exact_dedup"]
    job = Job.objects.get(pk=body["job"])
    assert job.replicas == 2 and job.command[1:3] == ["-m", "ylink.runners.data"]
    spec = json.loads(Path(job.command[-1]).read_text())
    assert spec["input"]["path"] == str(storage.absolute(version.path))
    assert spec["steps"][0]["params"], "defaults are filled in"
    # The runner's token travels only in the job's secret environment.
    shown = client.get(f"/api/v1/aistation/jobs/{job.pk}/").json()
    assert "OGAI_RUN_TOKEN" not in json.dumps(shown)
    assert shown["env"]["OGAI_URL"]


def test_a_bad_step_is_a_400_naming_its_place_and_starts_nothing(api, farm, make_version):
    version = make_version()
    client = api.as_user(farm.world.alpha_member)
    response = client.post(RUNS, {"dataset_version": version.pk, "steps": [
        {"type": "normalize"}, {"type": "minhash_dedup", "params": {"no_such": 1}}]},
        format="json")
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert any(key.startswith("steps[1]") for key in fields), fields
    response = client.post(RUNS, {"dataset_version": version.pk, "steps": [
        {"type": "frobnicate"}]}, format="json")
    assert response.status_code == 400
    assert "frobnicate" in json.dumps(response.json())
    assert not PipelineRun.objects.exists() and not Job.objects.exists()


def test_a_pipeline_can_name_its_dataset_by_name(api, farm, make_version):
    make_version(name="web")
    response = api.as_user(farm.world.alpha_member).post(
        RUNS, {"dataset": "web", "steps": [{"type": "normalize"}]}, format="json")
    assert response.status_code == 201, response.json()
    missing = api.post(RUNS, {"dataset": "nope", "steps": [{"type": "normalize"}]},
                       format="json")
    assert missing.status_code == 400


def test_training_specs_that_cannot_run_are_400s(api, farm, make_version):
    documents = make_version()
    client = api.as_user(farm.world.alpha_member)
    needs_tokens = client.post(TRAINING, {"dataset_version": documents.pk, "kind": "pretrain"},
                               format="json")
    assert needs_tokens.status_code == 400
    assert "token shards" in needs_tokens.json()["fields"]["dataset_version"][0]
    needs_base = client.post(TRAINING, {"dataset_version": documents.pk, "kind": "lora"},
                             format="json")
    assert needs_base.status_code == 400
    bad_value = client.post(TRAINING, {"dataset_version": documents.pk, "kind": "tokenizer",
                                       "tokenizer": {"vocab_size": -5}}, format="json")
    assert bad_value.status_code == 400
    assert "tokenizer.vocab_size" in bad_value.json()["fields"]
    assert not TrainingRun.objects.exists() and not Job.objects.exists()


def _token_version(make_version, tmp_path) -> DatasetVersion:
    """A token-shard version (files do not matter to the API: only its statistics)."""
    version = make_version()
    version.format = "tokens"
    version.stats = {"seq_len": 128, "vocab_size": 257, "eos_id": 256, "token_size": 2}
    version.save()
    return version


def test_a_model_too_big_for_the_gpus_asked_is_refused_with_numbers(api, farm, make_version,
                                                                    tmp_path):
    version = _token_version(make_version, tmp_path)
    client = api.as_user(farm.world.alpha_member)
    response = client.post(TRAINING, {
        "dataset_version": version.pk, "kind": "pretrain", "model": {"preset": "7b"},
        "resources": {"gpus": 1}}, format="json")
    assert response.status_code == 400, response.json()
    message = json.dumps(response.json()["fields"])
    assert "GiB" in message and "7b" in message
    assert not TrainingRun.objects.exists()
    fits = client.post(TRAINING, {
        "dataset_version": version.pk, "kind": "pretrain", "model": {"preset": "tiny"},
        "training": {"max_steps": 20}}, format="json")
    assert fits.status_code == 201, fits.json()
    run = fits.json()
    assert run["total_steps"] == 20 and run["spec"]["model"]["vocab_size"] == 257
    assert run["spec"]["model"]["context_length"] == 128


def test_the_job_token_opens_the_runner_endpoint_only_while_the_job_lives(
        api, farm, make_version, tmp_path):
    version = _token_version(make_version, tmp_path)
    client = api.as_user(farm.world.alpha_member)
    run = client.post(TRAINING, {"dataset_version": version.pk, "kind": "pretrain",
                                 "model": {"preset": "tiny"}}, format="json").json()
    job = Job.objects.get(pk=run["job"])
    secret = _secret_of(job)
    anonymous = type(api)()
    metric = {"kind": "metric", "at": "2026-11-30T01:00:00Z",
              "data": {"step": 10, "loss": 5.5, "lr": 1e-4, "tokens": 1000, "tokens_per_s": 9}}
    assert _post_events(anonymous, secret, metric).status_code == 200
    # Nothing else opens with it.
    other = anonymous.get("/api/v1/aistation/jobs/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert other.status_code == 401
    other = anonymous.get(f"{TRAINING}{run['id']}/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert other.status_code == 401
    # A user's session does not open the runner endpoint.
    assert client.post(EVENTS, {"events": [metric]}, format="json").status_code in (401, 403)
    assert _post_events(anonymous, "ogj_wrong", metric).status_code == 401
    # Once the job has ended the token is dead.
    job.refresh_from_db()
    job_transition(job, JobState.CANCELLED, "cancelled by test")
    job.save()
    assert _post_events(anonymous, secret, metric).status_code == 401


def test_reports_are_applied_once_however_often_they_arrive(api, farm, make_version, tmp_path):
    version = _token_version(make_version, tmp_path)
    client = api.as_user(farm.world.alpha_member)
    run = TrainingRun.objects.get(pk=client.post(TRAINING, {
        "dataset_version": version.pk, "kind": "pretrain", "model": {"preset": "tiny"},
        "training": {"max_steps": 30}}, format="json").json()["id"])
    events = [
        {"kind": "started", "at": "2026-11-30T01:00:00Z",
         "data": {"attempt": 1, "world_size": 1, "resumed_from_step": None}},
        *({"kind": "metric", "at": f"2026-11-30T01:00:{step:02d}Z",
           "data": {"step": step, "loss": 6.0 - step / 10, "lr": 1e-3, "tokens": step * 100,
                    "tokens_per_s": 50.0}} for step in (5, 10, 15)),
        {"kind": "checkpoint", "at": "2026-11-30T01:00:16Z",
         "data": {"step": 10, "path": str(tmp_path / "step-10"), "bytes": 1234}},
        {"kind": "checkpoint", "at": "2026-11-30T01:00:16Z",
         "data": {"step": 15, "path": str(tmp_path / "step-15"), "bytes": 1234}},
    ]
    (tmp_path / "step-15").mkdir()  # the runner kept only its newest checkpoint
    runner_events_apply(job=run.job, events=events)
    # The runner was killed after step 15; its next attempt resumed from 10 and re-sent 15.
    runner_events_apply(job=run.job, events=[
        {"kind": "started", "at": "2026-11-30T01:01:00Z",
         "data": {"attempt": 2, "world_size": 1, "resumed_from_step": 10}},
        {"kind": "metric", "at": "2026-11-30T01:01:05Z",
         "data": {"step": 15, "loss": 4.4, "lr": 1e-3, "tokens": 1500, "tokens_per_s": 60.0}},
        {"kind": "progress", "at": "2026-11-30T01:01:06Z",
         "data": {"step": 16, "total_steps": 30, "tokens": 1600, "tokens_per_s": 60.0,
                  "eta_s": 20}},
    ])
    assert list(TrainingMetric.objects.filter(run=run).values_list("step", "loss")) == \
        [(5, 5.5), (10, 5.0), (15, 4.4)]
    body = client.get(f"{TRAINING}{run.pk}/").json()
    assert (body["step"], body["resumed_from_step"], body["eta_s"]) == (16, 10, 20)
    assert [c["step"] for c in client.get(f"{TRAINING}{run.pk}/checkpoints/").json()] == [15]
    later = client.get(f"{TRAINING}{run.pk}/metrics/?after_step=5").json()
    assert [m["step"] for m in later] == [10, 15]

    done = {"kind": "done", "at": "2026-11-30T01:02:00Z", "data": {"output": {
        "path": "/x/out", "artifact": "model", "parameters": 500000, "final_loss": 3.0,
        "steps": 30, "tokens": 3000}}}
    runner_events_apply(job=run.job, events=[done, done])
    body = client.get(f"{TRAINING}{run.pk}/").json()
    assert (body["state"], body["artifact"], body["parameters"], body["step"]) == \
        ("succeeded", "model", 500000, 30)
    # The result is where the platform told the runner to write, whatever the report said.
    assert body["output_path"] == str(storage.absolute(run.folder) / "output")


def test_a_finished_pipeline_adds_a_version_with_lineage_and_chains_its_training(
        api, farm, make_version):
    from ylink.services.pipelines import pipeline_run_start

    version = make_version()
    run = pipeline_run_start(
        actor=farm.world.alpha_member, version=version, queue=farm.queues["alpha"],
        steps=[{"type": "normalize"}, {"type": "exact_dedup"}],
        then_train={"kind": "tokenizer", "name": "after", "tokenizer": {"vocab_size": 300}},
    )
    output = storage.absolute(run.folder) / "output"
    output.mkdir(parents=True)
    (output / "00000.jsonl").write_bytes(jsonl("kept one", "kept two"))
    step = {"index": 1, "type": "exact_dedup", "docs_in": 3, "docs_out": 2, "bytes_in": 30,
            "bytes_out": 20, "dropped": {"duplicate": 1}, "samples": [], "seconds": 0.1}
    runner_events_apply(job=run.job, events=[
        {"kind": "data_step", "data": step}, {"kind": "data_step", "data": step},
        {"kind": "done", "data": {"output": {"format": "jsonl"}}},
    ])
    run.refresh_from_db()
    assert run.state == "succeeded" and len(run.step_results) == 1
    new = run.output_version
    assert (new.number, new.parent, new.pipeline_run, new.documents) == (2, version, run, 2)
    chained = TrainingRun.objects.get()
    assert (chained.kind, chained.dataset_version, chained.name) == ("tokenizer", new, "after")
    assert chained.job.queue == farm.queues["alpha"]


def test_a_pipeline_output_linked_to_another_tenants_dataset_is_not_taken(
        api, farm, make_version):
    """The job writes its output folder: planting links there (to beta's dataset) must not
    make beta's documents a version of alpha's dataset."""
    from django.core.files.base import ContentFile

    from ylink.services.datasets import dataset_create, dataset_upload
    from ylink.services.pipelines import pipeline_run_start

    world = farm.world
    secret = dataset_create(actor=world.beta_member, tenant=world.beta, name="secret")
    beta_version = dataset_upload(actor=world.beta_member, dataset=secret, upload=ContentFile(
        b'{"text": "Beta only: the launch codes of the quarter."}\n', name="s.jsonl"))
    beta_folder = storage.absolute(beta_version.path)
    run = pipeline_run_start(actor=world.alpha_member, version=make_version(),
                             queue=farm.queues["alpha"], steps=[{"type": "normalize"}])
    output = storage.absolute(run.folder) / "output"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.symlink_to(beta_folder, target_is_directory=True)
    runner_events_apply(job=run.job, events=[
        {"kind": "done", "data": {"output": {"format": "jsonl"}}}])
    run.refresh_from_db()
    assert run.output_version is None and not run.succeeded
    assert run.message == (f"The output of pipeline run {run.pk} is not its own: output is a "
                           "link. Nothing was recorded.")
    assert DatasetVersion.objects.filter(dataset__tenant=world.alpha).count() == 1
    assert any(beta_folder.rglob("*.jsonl"))  # beta's dataset is untouched

    output.unlink()  # a real folder whose meta.json points at beta's is refused as well
    output.mkdir()
    (output / "meta.json").symlink_to(next(beta_folder.rglob("*.jsonl")))
    runner_events_apply(job=run.job, events=[
        {"kind": "done", "data": {"output": {"format": "tokens"}}}])
    run.refresh_from_db()
    assert run.output_version is None and "meta.json is a link" in run.message


def test_runs_of_other_tenants_are_invisible(api, farm, make_version):
    version = make_version()
    client = api.as_user(farm.world.alpha_member)
    run = _start_pipeline(client, version).json()
    beta = api.as_user(farm.world.beta_member)
    assert beta.get(f"{RUNS}{run['id']}/").status_code == 404
    assert beta.post(f"{RUNS}{run['id']}/cancel/").status_code == 404
    assert beta.post(RUNS, {"dataset_version": version.pk, "tenant": "beta",
                            "steps": [{"type": "normalize"}]},
                     format="json").status_code == 400
    cancelled = api.as_user(farm.world.alpha_member).post(f"{RUNS}{run['id']}/cancel/")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"


@pytest.mark.parametrize("path", ["datasets/", "dataset-versions/", "pipeline-runs/",
                                  "training-runs/"])
def test_lists_pin_their_query_counts(api, farm, make_version, django_assert_max_num_queries,
                                      path):
    from ylink.services.pipelines import pipeline_run_start
    from ylink.services.training import training_run_start

    member = farm.world.alpha_member
    for number in range(4):
        version = make_version(name=f"corpus-{number}")
        pipeline_run_start(actor=member, version=version, queue=farm.queues["alpha"],
                           steps=[{"type": "normalize"}])
        training_run_start(actor=member, dataset_version=version, queue=farm.queues["alpha"],
                           kind="tokenizer")
    client = api.as_user(member)
    with django_assert_max_num_queries(6):
        response = client.get(f"/api/v1/ylink/{path}")
    assert response.status_code == 200 and response.json()["count"] >= 4


def test_a_chained_training_that_cannot_start_keeps_the_pipelines_result(
        api, farm, make_version):
    from infra_os.choices import Role
    from infra_os.models import Membership
    from ylink.services.pipelines import pipeline_run_start

    member = farm.world.alpha_member
    run = pipeline_run_start(actor=member, version=make_version(), queue=farm.queues["alpha"],
                             steps=[{"type": "normalize"}],
                             then_train={"kind": "tokenizer", "name": "after"})
    output = storage.absolute(run.folder) / "output"
    output.mkdir(parents=True)
    (output / "00000.jsonl").write_bytes(jsonl("kept"))
    # Its starter lost the right to start work while it ran.
    Membership.objects.filter(user=member, tenant=farm.world.alpha).update(role=Role.VIEWER)
    member = type(member).objects.get(pk=member.pk)
    runner_events_apply(job=run.job, events=[
        {"kind": "done", "data": {"output": {"format": "jsonl"}}}])
    run.refresh_from_db()
    assert run.state == "succeeded" and run.output_version.documents == 1
    assert run.message.startswith("The chained training did not start")
    assert not TrainingRun.objects.exists()
    # The version's files live with the dataset now, not in the run's folder.
    assert not output.exists()
    assert storage.absolute(run.output_version.path).is_dir()


def test_toolchain_jobs_are_not_rerun_as_plain_jobs(api, farm, make_version):
    client = api.as_user(farm.world.alpha_member)
    run = _start_pipeline(client, make_version()).json()
    client.post(f"{RUNS}{run['id']}/cancel/")
    response = client.post(f"/api/v1/aistation/jobs/{run['job']}/rerun/")
    assert response.status_code == 400
    assert "toolchain" in json.dumps(response.json())


def test_training_takes_one_gpu_per_replica(api, farm, make_version, tmp_path):
    version = _token_version(make_version, tmp_path)
    response = api.as_user(farm.world.alpha_member).post(TRAINING, {
        "dataset_version": version.pk, "kind": "pretrain", "model": {"preset": "tiny"},
        "resources": {"gpus": 4}}, format="json")
    assert response.status_code == 400
    assert "replicas: 4" in response.json()["fields"]["resources.gpus"][0]


def test_gpus_on_a_cluster_without_them_are_refused_in_those_words(api, world, make_version,
                                                                   tmp_path):
    from aistation.services.queues import queue_create
    from podsys.models import Cluster
    from podsys.services.clusters import cluster_sync_nodes

    cluster = Cluster.objects.create(name="cpus", driver="fake",
                                     options={"nodes": 1, "gpus_per_node": 0})
    cluster_sync_nodes(cluster=cluster)
    queue_create(actor=world.operator, tenant=world.alpha, name="cpu", cluster=cluster)
    version = _token_version(make_version, tmp_path)
    response = api.as_user(world.alpha_member).post(TRAINING, {
        "dataset_version": version.pk, "kind": "pretrain", "queue": "cpu",
        "model": {"preset": "7b"}, "resources": {"gpus": 1}}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["resources.gpus"] == ["No node of cluster cpus has GPUs."]
