"""Submitting through the API: bad specs answer 400 naming the field and store nothing."""

import pytest

from aistation.models import Job

JOBS = "/api/v1/aistation/jobs/"


def spec(**changes):
    base = {"tenant": "alpha", "queue": "default", "name": "train",
            "command": ["python", "-c", "print(1)"], "resources": {"gpus": 1}}
    base.update(changes)
    return base


@pytest.mark.parametrize(("changes", "field"), [
    ({"queue": "nope"}, "queue"),
    ({"tenant": "beta"}, "tenant"),
    ({"resources": {"gpus": -1}}, "resources.gpus"),
    ({"resources": {"gpus": 1, "cpu": 0}}, "resources.cpu"),
    ({"resources": {"gpus": 1, "memory_mib": 0}}, "resources.memory_mib"),
    ({"replicas": 0}, "replicas"),
    ({"resources": {"gpus": 9}}, "resources.gpus"),
    ({"resources": {"gpus": 8}, "replicas": 3}, "replicas"),
    ({"resources": {"gpus": 1, "gpu_model": "TPU"}}, "resources.gpu_model"),
    ({"command": "python train.py"}, "command"),
    ({"command": ["python", 5]}, "command"),
    ({"command": []}, "command"),
    ({"time_limit_s": 10**9}, "time_limit_s"),
    ({"time_limit_s": 0}, "time_limit_s"),
    ({"env": {"1BAD": "x"}}, "env"),
])
def test_bad_specs_answer_400_naming_the_field(api, world, farm, changes, field):
    response = api.as_user(world.alpha_member).post(JOBS, spec(**changes), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert any(name == field or name.startswith(f"{field}.") for name in body["fields"]), body
    assert not Job.objects.exists()


def test_a_submitted_job_is_queued_and_says_why_it_waits(api, world, farm):
    response = api.as_user(world.alpha_member).post(JOBS, spec(), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "queued"
    assert body["owner"] == "alpha-member"
    assert body["resources"]["gpus"] == 1
    assert [e["to_state"] for e in body["events"]] == ["queued"]
    assert body["reason"]


def test_resources_may_be_left_out_for_the_defaults(api, world, farm):
    body = spec()
    del body["resources"]
    response = api.as_user(world.alpha_member).post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["resources"] == {"gpus": 0, "gpu_model": "", "cpu": 1.0,
                                            "memory_mib": 1024}


def test_the_tenant_may_be_left_out_by_a_member_of_one_tenant(api, world, farm):
    body = spec()
    del body["tenant"]
    response = api.as_user(world.alpha_member).post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == "alpha"


def test_cancel_and_rerun_through_the_api(api, world, farm):
    client = api.as_user(world.alpha_member)
    job = client.post(JOBS, spec(), format="json").json()
    cancelled = client.post(f"{JOBS}{job['id']}/cancel/")
    assert cancelled.status_code == 202
    assert cancelled.json()["state"] == "cancelled"
    again = client.post(f"{JOBS}{job['id']}/cancel/")
    assert again.status_code == 400
    rerun = client.post(f"{JOBS}{job['id']}/rerun/")
    assert rerun.status_code == 201
    assert rerun.json()["rerun_of"] == job["id"]
    assert rerun.json()["state"] == "queued"


def test_queue_status_counts_backlog(api, world, farm):
    farm.submit(gpus=1)
    farm.submit(gpus=2)
    queues = api.as_user(world.alpha_member).get("/api/v1/aistation/queues/").json()["results"]
    default = next(q for q in queues if q["tenant"] == "alpha")
    assert default["pending"] == 2
    assert default["running"] == 0


def test_job_lists_pin_their_query_count(api, world, farm, django_assert_max_num_queries):
    for _ in range(20):
        farm.submit(gpus=1)
    client = api.as_user(world.alpha_member)
    with django_assert_max_num_queries(6):
        assert client.get(JOBS).status_code == 200
    with django_assert_max_num_queries(6):
        assert client.get("/api/v1/aistation/queues/").status_code == 200
