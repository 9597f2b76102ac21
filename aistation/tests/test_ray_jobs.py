"""Jobs of `kind: ray` through the API: a head and N workers are the gang's N+1 replicas, bad
Ray specs answer 400 naming the field, and a cluster whose driver runs no Ray refuses them."""

import pytest

from aistation.models import Job
from aistation.services.workloads import ray_spec

JOBS = "/api/v1/aistation/jobs/"


def ray_job(**changes):
    body = {"tenant": "alpha", "queue": "default", "name": "ray", "kind": "ray",
            "command": ["python", "-c", "import ray; ray.init()"],
            "ray": {"workers": 2, "worker": {"gpus": 1, "cpu": 2, "memory_mib": 4096},
                    "head": {"cpu": 4, "memory_mib": 2048}, "dashboard": True}}
    body.update(changes)
    return body


def test_a_ray_job_is_a_gang_of_its_head_and_workers(api, world, farm):
    response = api.as_user(world.alpha_member).post(JOBS, ray_job(), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["kind"] == "ray" and body["replicas"] == 3
    # Each replica holds the larger of the head's and a worker's resources.
    assert body["resources"] == {"gpus": 1, "gpu_model": "", "cpu": 4.0, "memory_mib": 4096}
    assert body["ray"]["workers"] == 2 and body["ray"]["dashboard"] is True
    spec = ray_spec(Job.objects.get().ray)
    assert spec is not None and spec.head.gpus == 0 and spec.worker.gpus == 1


@pytest.mark.parametrize(("changes", "field"), [
    ({"ray": {"workers": -1}}, "ray.workers"),
    ({"ray": {"workers": "2"}}, "ray.workers"),
    ({"ray": {"worker": {"gpus": -1}}}, "ray.worker.gpus"),
    ({"ray": {"worker": {"memory_mib": 10}}}, "ray.worker.memory_mib"),
    ({"ray": {"nodes": 3}}, "ray.nodes"),
    ({"replicas": 3}, "replicas"),
    ({"resources": {"gpus": 1}}, "resources"),
    ({"kind": "spark"}, "kind"),
    ({"kind": "job"}, "ray"),
])
def test_bad_ray_specs_answer_400_naming_the_field(api, world, farm, changes, field):
    response = api.as_user(world.alpha_member).post(JOBS, ray_job(**changes), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert any(name == field or name.startswith(f"{field}.") for name in body["fields"]), body
    assert not Job.objects.exists()


def test_a_driver_that_runs_no_ray_refuses_ray_jobs(api, world, farm, monkeypatch):
    from podsys.drivers.fake import FakeDriver

    monkeypatch.setattr(FakeDriver, "unsupported", {"ray": "no Ray here"})
    response = api.as_user(world.alpha_member).post(JOBS, ray_job(), format="json")
    assert response.status_code == 400, response.content
    assert "no Ray here" in response.json()["fields"]["kind"][0]
