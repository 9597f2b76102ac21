"""The deployments API: create, list, read, scale, stop, start, delete, statistics."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from mmodel.gateway.stats import BUCKET_COUNT, bucket_index
from mmodel.models import Deployment, DeploymentStat
from mmodel.services import deployment_watch
from mmodel.services.deployment_watch import deployments_watch
from mmodel.tests.test_deployments import make_version

URL = "/api/v1/mmodel/deployments/"


@pytest.fixture(autouse=True)
def healthy(monkeypatch):
    monkeypatch.setattr(deployment_watch, "probe_health", lambda upstream: (True, "", ()))


def create(api, user, **body):
    return api.as_user(user).post(URL, {"tenant": "alpha", "queue": "default", **body},
                                  format="json")


def test_a_member_deploys_a_version_and_sees_it_ready(api, farm, world):
    version = make_version(world.alpha)
    response = create(api, world.alpha_member, name="chat", version=version.pk, replicas=2,
                      gpus_per_replica=1)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "starting" and body["replicas"] == 2
    assert body["model"] == "tiny" and body["version_label"] == "tiny:v1"
    assert [r["index"] for r in body["replica_set"]] == [0, 1]
    assert all(r["job"] and r["job_state"] == "queued" for r in body["replica_set"])

    farm.cycle()
    deployments_watch()
    body = api.get(f"{URL}{body['id']}/").json()
    assert body["state"] == "ready"
    assert all(r["ready"] and r["upstream"] is None for r in body["replica_set"])
    # Where the servers answer is internal: platform admins only.
    seen = api.as_user(world.operator).get(f"{URL}{body['id']}/").json()
    assert all(r["upstream"].startswith("http://") for r in seen["replica_set"])


def test_bad_input_gets_400_naming_the_field(api, farm, world):
    version = make_version(world.alpha)
    for body, field in [
        ({"name": "x", "version": make_version(world.beta).pk}, "version"),
        ({"name": "x", "version": 999999}, "version"),
        ({"name": "x", "version": version.pk, "replicas": 17}, "replicas"),
        ({"name": "x", "version": version.pk, "runtime": "llama"}, "runtime"),
        ({"name": "x", "version": version.pk, "replica": 2}, "replica"),
        ({"name": "Bad Name", "version": version.pk}, "name"),
        ({"name": "x", "version": version.pk, "queue": "nope"}, "queue"),
        ({"name": "x", "version": version.pk, "idle_timeout_s": 10}, "idle_timeout_s"),
    ]:
        response = create(api, world.alpha_member, **body)
        assert response.status_code == 400, (body, response.json())
        assert field in response.json()["fields"], (body, response.json())
    assert create(api, world.alpha_viewer, name="x", version=version.pk).status_code == 403
    assert not Deployment.objects.exists()


def test_scale_stop_start_and_delete(api, farm, world):
    deployment_id = create(api, world.alpha_member, name="chat",
                           version=make_version(world.alpha).pk).json()["id"]
    response = api.post(f"{URL}{deployment_id}/scale/", {"replicas": 3}, format="json")
    assert response.status_code == 202 and len(response.json()["replica_set"]) == 3
    assert api.post(f"{URL}{deployment_id}/scale/", {"replicas": 0},
                    format="json").status_code == 400
    response = api.post(f"{URL}{deployment_id}/stop/")
    assert response.status_code == 202 and response.json()["state"] == "stopped"
    assert all(r["job_state"] == "cancelled" for r in response.json()["replica_set"])
    assert api.post(f"{URL}{deployment_id}/stop/").status_code == 400
    response = api.post(f"{URL}{deployment_id}/start/")
    assert response.status_code == 202 and response.json()["state"] == "starting"

    viewer = api.as_user(world.alpha_viewer)
    assert viewer.get(f"{URL}{deployment_id}/").status_code == 200
    assert viewer.post(f"{URL}{deployment_id}/stop/").status_code == 403
    assert viewer.delete(f"{URL}{deployment_id}/").status_code == 403
    assert api.as_user(world.beta_admin).get(f"{URL}{deployment_id}/").status_code == 404
    assert api.as_user(world.alpha_admin).delete(f"{URL}{deployment_id}/").status_code == 204
    assert not Deployment.objects.exists()


def test_the_list_is_scoped_and_its_queries_do_not_grow(api, farm, world):
    for index in range(2):
        create(api, world.alpha_member, name=f"chat-{index}", version=make_version(world.alpha).pk,
               replicas=2)
    create(api, world.beta_member, name="theirs", version=make_version(world.beta).pk)
    client = api.as_user(world.alpha_viewer)
    with CaptureQueriesContext(connection) as few:
        body = client.get(URL).json()
    assert [d["name"] for d in body["results"]] == ["chat-0", "chat-1"]
    for index in range(2, 6):
        create(api, world.alpha_member, name=f"chat-{index}", version=make_version(world.alpha).pk,
               replicas=3)
    client = api.as_user(world.alpha_viewer)
    with CaptureQueriesContext(connection) as many:
        body = client.get(URL).json()
    assert body["count"] == 6
    assert len(many.captured_queries) == len(few.captured_queries)
    assert client.get(URL, {"tenant": "beta"}).json()["count"] == 0


def test_stats_give_requests_tokens_and_latency_percentiles_per_minute(api, farm, world):
    deployment_id = create(api, world.alpha_member, name="chat",
                           version=make_version(world.alpha).pk).json()["id"]
    now = timezone.now().replace(second=0, microsecond=0)
    buckets = [0] * BUCKET_COUNT
    buckets[bucket_index(20)] = 98  # 98 requests of 10-25 ms, 2 of 1-2.5 s
    buckets[bucket_index(2000)] = 2
    DeploymentStat.objects.create(deployment_id=deployment_id, minute=now - timedelta(minutes=1),
                                  requests=100, errors=3, prompt_tokens=1000,
                                  completion_tokens=5000, latency_ms_sum=100 * 50.0,
                                  latency_buckets=buckets)
    DeploymentStat.objects.create(deployment_id=deployment_id, minute=now - timedelta(hours=3),
                                  requests=1, latency_buckets=[1])
    rows = api.get(f"{URL}{deployment_id}/stats/", {"minutes": 60}).json()
    assert len(rows) == 1
    row = rows[0]
    assert (row["requests"], row["errors"], row["completion_tokens"]) == (100, 3, 5000)
    assert row["latency_ms_mean"] == 50.0
    assert 10 <= row["latency_ms_p50"] <= 25 and 1000 <= row["latency_ms_p99"] <= 2500
    assert len(api.get(f"{URL}{deployment_id}/stats/", {"minutes": 240}).json()) == 2
    response = api.get(f"{URL}{deployment_id}/stats/", {"minutes": "0"})
    assert response.status_code == 400 and "minutes" in response.json()["fields"]
