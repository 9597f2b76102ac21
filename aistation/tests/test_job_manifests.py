"""`GET /jobs/{id}/manifests/`: the Kubernetes objects OGAI would create for a job, as YAML."""

import yaml

from aistation.models import Attempt
from aistation.services.manifests import job_manifests, job_next_attempt

IMAGE = "registry.example.org/train:1"


def url(job):
    return f"/api/v1/aistation/jobs/{job.pk}/manifests/"


def test_a_queued_job_renders_as_a_service_and_an_indexed_job(api, world, farm):
    job = farm.submit(image=IMAGE, gpus=2, replicas=2, env={"LR": "3e-4"})
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
    objects = list(yaml.safe_load_all(job_manifests(job=job)))
    assert objects[-1]["metadata"]["name"] == attempt.workload_id


def test_the_default_image_comes_from_the_clusters_options(api, world, farm):
    farm.cluster.options = {**farm.cluster.options, "default_image": IMAGE}
    farm.cluster.save(update_fields=["options"])
    job = farm.submit()
    response = api.as_user(world.alpha_viewer).get(url(job))
    assert response.status_code == 200, response.content
    assert f"image: {IMAGE}" in response.json()["yaml"]


def test_another_tenants_member_gets_404(api, world, farm):
    job = farm.submit(image=IMAGE)
    response = api.as_user(world.beta_member).get(url(job))
    assert response.status_code == 404, response.content
    assert api.as_user(world.beta_member).get(f"/api/v1/aistation/jobs/{job.pk}/") \
        .status_code == 404


def test_a_job_without_an_image_answers_400_saying_so(api, world, farm):
    job = farm.submit()
    response = api.as_user(world.alpha_member).get(url(job))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    assert "no image" in body["message"] and "default_image" in body["message"], body


def test_anonymous_callers_are_refused(api, world, farm):
    job = farm.submit(image=IMAGE)
    assert api.get(url(job)).status_code in {401, 403}
