"""`GET /jobs/{id}/manifests/`: what OGAI would run for a job, as YAML: the Kubernetes objects
on a Kubernetes cluster, the workload itself on the fake one."""

import json
from types import SimpleNamespace

import pytest
import yaml

from aistation.models import Attempt
from aistation.services.jobs import job_submit
from aistation.services.manifests import job_manifests, job_next_attempt
from aistation.services.queues import queue_create
from ogai.crypto import encrypt
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_refresh_capacity

IMAGE = "registry.example.org/train:1"
KUBECONFIG = "users: [{name: ogai, user: {token: kube-token-7}}]"


def url(job):
    return f"/api/v1/aistation/jobs/{job.pk}/manifests/"


@pytest.fixture
def kube(world):
    """A Kubernetes cluster known by its nodes only (rendering never reaches it), and alpha's
    queue on it; `kube.submit(...)` submits as alpha's member."""
    cluster = Cluster.objects.create(name="kube", driver="kubernetes", options={},
                                     credentials=encrypt(json.dumps({"kubeconfig": KUBECONFIG})))
    for i in range(2):
        Node.objects.create(cluster=cluster, name=f"gpu-{i}", gpus=8, cpu_cores=64,
                            memory_mib=524288)
    cluster_refresh_capacity(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)

    def submit(*, gpus=1, replicas=1, **extra):
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                          name="work", command=["python", "train.py"], gpus_per_replica=gpus,
                          replicas=replicas, **extra)

    return SimpleNamespace(cluster=cluster, submit=submit)


def test_a_queued_job_renders_as_a_service_and_an_indexed_job(api, world, kube):
    job = kube.submit(image=IMAGE, gpus=2, replicas=2, env={"LR": "3e-4"})
    response = api.as_user(world.alpha_member).get(url(job))
    assert response.status_code == 200, response.content
    objects = list(yaml.safe_load_all(response.json()["yaml"]))
    # Its NetworkPolicy first: its pods reach each other, and nothing else gets in.
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [
        ("networking.k8s.io/v1", "NetworkPolicy"), ("v1", "Service"), ("batch/v1", "Job")]
    _, service, batch = objects
    assert service["metadata"]["name"] == batch["metadata"]["name"] == f"job-{job.pk}-a1"
    assert batch["spec"]["completions"] == 2
    container = batch["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["command"] == ["python", "train.py"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LR"] == "3e-4"
    assert env["OGAI_ATTEMPT"] == "1"
    assert not Attempt.objects.exists()  # rendering created nothing


def test_a_started_job_renders_its_newest_attempt(api, world, farm):
    job = farm.submit(image=IMAGE)
    farm.cycle()
    job.refresh_from_db()
    attempt = job.attempts.get()
    assert job_next_attempt(job).pk == attempt.pk
    assert yaml.safe_load(job_manifests(job=job))["id"] == attempt.workload_id


def test_the_default_image_comes_from_the_clusters_options(api, world, kube):
    kube.cluster.options = {**kube.cluster.options, "default_image": IMAGE}
    kube.cluster.save(update_fields=["options"])
    job = kube.submit()
    response = api.as_user(world.alpha_viewer).get(url(job))
    assert response.status_code == 200, response.content
    assert f"image: {IMAGE}" in response.json()["yaml"]


def test_another_tenants_member_gets_404(api, world, farm):
    job = farm.submit(image=IMAGE)
    response = api.as_user(world.beta_member).get(url(job))
    assert response.status_code == 404, response.content
    assert api.as_user(world.beta_member).get(f"/api/v1/aistation/jobs/{job.pk}/") \
        .status_code == 404


def test_a_job_without_an_image_answers_400_saying_so(api, world, kube):
    job = kube.submit()
    response = api.as_user(world.alpha_member).get(url(job))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    assert "no image" in body["message"] and "default_image" in body["message"], body


def test_anonymous_callers_are_refused(api, world, farm):
    job = farm.submit(image=IMAGE)
    assert api.get(url(job)).status_code in {401, 403}


def test_the_stored_credentials_never_reach_the_rendering(api, world, kube):
    job = kube.submit(image=IMAGE)
    text = api.as_user(world.alpha_member).get(url(job)).json()["yaml"]
    assert "kube-token-7" not in text and "kubeconfig" not in text


def test_on_the_fake_cluster_the_workload_itself_is_shown(api, world, farm):
    job = farm.submit(image=IMAGE, env={"LR": "3e-4"}, secret_env={"API_KEY": "k-secret-1"})
    response = api.as_user(world.alpha_member).get(url(job))
    assert response.status_code == 200, response.content
    shown = yaml.safe_load(response.json()["yaml"])
    assert shown["id"] == f"job-{job.pk}-a1"
    assert shown["command"] == ["python", "train.py"] and shown["image"] == IMAGE
    assert shown["env"]["LR"] == "3e-4" and shown["resources"]["gpus"] == 1
    assert "k-secret-1" not in response.json()["yaml"] and "API_KEY" in shown["secret_env"]
