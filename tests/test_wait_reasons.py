"""A deployment or a training run whose job waits for room says why, naming what is scarce and
who holds it, wherever it shows a state: the API, its console pages and their status partials,
for its own tenant only. The box: one node of 3 CPU cores and no GPU, where the demo deployment
(2 cores) already runs."""

import html

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse

from aistation.choices import JobState
from aistation.labels import OWNER_LABEL
from aistation.models import Attempt, Job
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from aistation.services.workloads import attempt_workload
from mmodel.services import deployment_watch
from mmodel.services.deployment_watch import deployments_watch
from mmodel.tests.test_deployments import make_version
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes
from ylink.services.datasets import dataset_create, dataset_upload

DEPLOYMENTS = "/api/v1/mmodel/deployments/"
TRAINING = "/api/v1/ylink/training-runs/"
NODE = "fake-node-000"
WAITING = (f"waiting: 2 CPU cores asked, 1 free on node {NODE} (the deployment demo-tiny-gpt "
           "holds 2)")


@pytest.fixture
def box(world, api, monkeypatch, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir(exist_ok=True)
    monkeypatch.setattr(deployment_watch, "probe_health", lambda upstream: (True, "", ()))
    cluster = Cluster.objects.create(name="box", driver="fake", options={
        "nodes": 1, "gpus_per_node": 0, "cpu_cores": 3, "memory_mib": 65536})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)
    client = api.as_user(world.alpha_member)
    version = make_version(world.alpha)
    response = client.post(DEPLOYMENTS, {"tenant": "alpha", "name": "demo-tiny-gpt",
                                         "version": version.pk}, format="json")
    assert response.status_code == 201, response.json()

    def cycle():
        schedule_cluster(cluster_id=cluster.pk)
        deployments_watch()

    cycle()
    assert client.get(f"{DEPLOYMENTS}{response.json()['id']}/").json()["state"] == "ready"
    return type("Box", (), {"cluster": cluster, "queue": queue, "cycle": staticmethod(cycle),
                            "version": version, "client": client,
                            "demo": response.json()["id"]})


def test_a_waiting_deployment_says_why_in_its_api_output(box, api, world):
    second = box.client.post(DEPLOYMENTS, {"tenant": "alpha", "name": "second",
                                           "version": box.version.pk}, format="json").json()
    assert second["waiting_reason"] == "submitted; waiting for the scheduler"
    box.cycle()
    body = box.client.get(f"{DEPLOYMENTS}{second['id']}/").json()
    assert body["state"] == "starting"
    assert body["waiting_reason"] == WAITING
    assert body["replica_set"][0]["waiting_reason"] == WAITING
    listed = {d["name"]: d["waiting_reason"] for d in box.client.get(DEPLOYMENTS).json()["results"]}
    assert listed == {"demo-tiny-gpt": "", "second": WAITING}
    # Another tenant sees neither the deployment nor why it waits.
    other = api.as_user(world.beta_member)
    assert other.get(f"{DEPLOYMENTS}{second['id']}/").status_code == 404
    assert other.get(DEPLOYMENTS).json()["count"] == 0

    # Once the cores are free it starts, and the reason goes.
    member = api.as_user(world.alpha_member)  # the same client, signed in again
    assert member.post(f"{DEPLOYMENTS}{box.demo}/stop/").status_code == 202
    box.cycle()
    body = member.get(f"{DEPLOYMENTS}{second['id']}/").json()
    assert (body["state"], body["waiting_reason"]) == ("ready", "")


def test_a_waiting_deployment_says_why_on_its_console_pages(box, client, world):
    second = box.client.post(DEPLOYMENTS, {"tenant": "alpha", "name": "second",
                                           "version": box.version.pk}, format="json").json()
    box.cycle()
    client.force_login(world.alpha_viewer)
    url = reverse("frontend:deployment", args=[second["id"]])
    for params in ({}, {"part": "status"}):
        page = html.unescape(client.get(url, params).content.decode())
        assert f"starting, 0/1 replicas ready — {WAITING}" in page, params
        assert "data-waiting-reason" in page and "data-replica-waiting" in page
    listing = html.unescape(client.get(reverse("frontend:deployments")).content.decode())
    assert WAITING in listing
    client.force_login(world.beta_member)
    assert client.get(url).status_code == 404


def tokens(world):
    dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name="corpus",
                             kind="text")
    version = dataset_upload(actor=world.alpha_member, dataset=dataset, upload=ContentFile(
        b'{"text": "A document long enough to count for something."}\n', name="c.jsonl"))
    version.format = "tokens"
    version.stats = {"seq_len": 128, "vocab_size": 257, "eos_id": 256, "token_size": 2}
    version.save()
    return version


def test_a_waiting_training_run_says_why_in_the_api_and_the_console(box, api, client, world):
    run = box.client.post(TRAINING, {
        "dataset_version": tokens(world).pk, "kind": "pretrain", "name": "tiny-gpt",
        "model": {"preset": "tiny"}, "training": {"max_steps": 20},
        "resources": {"cpu": 2}}, format="json").json()
    box.cycle()
    body = box.client.get(f"{TRAINING}{run['id']}/").json()
    assert body["waiting_reason"] == WAITING
    assert [r["waiting_reason"] for r in box.client.get(TRAINING).json()["results"]] == [WAITING]
    assert api.as_user(world.beta_member).get(f"{TRAINING}{run['id']}/").status_code == 404

    client.force_login(world.alpha_member)
    url = reverse("frontend:training-run", args=[run["id"]])
    for params in ({}, {"part": "status"}):
        page = html.unescape(client.get(url, params).content.decode())
        assert WAITING[0].upper() + WAITING[1:] in page, params
    listing = html.unescape(client.get(reverse("frontend:training-runs")).content.decode())
    assert WAITING in listing


def test_holders_are_named_by_their_owner_label_else_job_and_name(box, world):
    etl = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=box.queue, name="etl",
                     command=["python", "etl.py"], cpu_per_replica=0.5)
    box.cycle()
    waiting = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=box.queue,
                         name="train-gpt", command=["python", "train.py"], cpu_per_replica=1)
    box.cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    assert waiting.reason == (
        f"waiting: 1 CPU core asked, 0.5 free on node {NODE} (the deployment demo-tiny-gpt "
        f"holds 2, job {etl.pk} etl holds 0.5)")


def test_the_owner_label_stays_off_the_cluster(box):
    job = Job.objects.get(name__startswith="deployment demo-tiny-gpt")
    assert job.labels[OWNER_LABEL] == "the deployment demo-tiny-gpt"
    # Kubernetes label values allow no spaces: the platform's own name for it never goes there.
    labels = attempt_workload(Attempt.objects.get(job=job)).labels
    assert OWNER_LABEL not in labels and labels["ogai.io/role"] == "model-server"
