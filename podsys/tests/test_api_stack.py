"""Stack profiles and deployment runs over the API: platform admins write, profiles are read by
everyone signed in, runs are seen by platform admins only; errors come in the envelope."""

import pytest

from podsys.choices import DeploymentState, TaskStatus
from podsys.models import DeploymentRun, DeploymentTaskResult, Node, StackProfile
from tests.factories import ClusterFactory

PROFILES = "/api/v1/podsys/stack-profiles/"
RUNS = "/api/v1/podsys/deployment-runs/"
PROFILE = {"name": "h100-cuda124", "os_family": "ubuntu22.04", "driver_version": "550.127.05",
           "cuda_version": "12.4", "cudnn_version": "9.5", "nccl_version": "2.21",
           "dcgm_version": "4.2", "orchestrator": "kubernetes", "orchestrator_version": "1.31"}


@pytest.fixture
def cluster(db):
    cluster = ClusterFactory(name="gpu", options={"nodes": 0})
    for name in ("gpu-1", "gpu-2"):
        Node.objects.create(cluster=cluster, name=name, address=f"10.0.0.{name[-1]}")
    return cluster


def test_operators_create_and_read_profiles_members_see_none(api, world):
    client = api.as_user(world.operator)
    response = client.post(PROFILES, PROFILE, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "h100-cuda124" and body["driver_version"] == "550.127.05"
    assert body["container_runtime"] == "containerd" and body["deployment_count"] == 0

    member = api.as_user(world.alpha_member)
    assert member.get(PROFILES).json()["results"] == []
    assert member.get(f"{PROFILES}h100-cuda124/").status_code == 404
    refused = member.post(PROFILES, {**PROFILE, "name": "mine"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["message"] == "Only a platform admin can do this."
    # Not theirs to see, so not found, like other operators' things.
    assert member.patch(f"{PROFILES}h100-cuda124/", {"description": "x"},
                        format="json").status_code == 404
    assert member.delete(f"{PROFILES}h100-cuda124/").status_code == 404


def test_an_incompatible_profile_is_refused_with_the_reason(api, world):
    client = api.as_user(world.operator)
    response = client.post(PROFILES, {**PROFILE, "driver_version": "535.54.03"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert body["fields"]["driver_version"] == [
        "Driver 535.54.03 is too old for CUDA 12.4: CUDA 12.4 needs driver 550.54.14 or newer."]
    assert body["message"].startswith("driver_version: Driver 535.54.03")

    response = client.post(PROFILES, {**PROFILE, "cuda_version": "12.7"}, format="json")
    assert "Unknown CUDA version 12.7" in response.json()["fields"]["cuda_version"][0]
    response = client.post(PROFILES, {**PROFILE, "os_family": "windows"}, format="json")
    assert response.status_code == 400 and "os_family" in response.json()["fields"]
    assert not StackProfile.objects.exists()


def test_profiles_are_changed_and_deleted(api, world):
    client = api.as_user(world.operator)
    client.post(PROFILES, PROFILE, format="json")
    url = f"{PROFILES}h100-cuda124/"
    response = client.patch(url, {"cuda_version": "12.8"}, format="json")
    assert response.status_code == 400
    assert "too old for CUDA 12.8" in response.json()["fields"]["driver_version"][0]
    response = client.patch(url, {"cuda_version": "12.8", "driver_version": "570.86.15"},
                            format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["cuda_version"] == "12.8"
    assert response.json()["orchestrator_version"] == "1.31"  # untouched fields stay
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404


def test_operators_deploy_and_follow_runs(api, world, cluster,
                                          django_capture_on_commit_callbacks):
    client = api.as_user(world.operator)
    client.post(PROFILES, PROFILE, format="json")
    with django_capture_on_commit_callbacks() as enqueued:
        response = client.post(RUNS, {"cluster": "gpu", "profile": "h100-cuda124",
                                      "hosts": ["gpu-1", "gpu-2"], "check_mode": True},
                               format="json")
    assert response.status_code == 202, response.json()
    assert len(enqueued) == 1
    body = response.json()
    assert (body["state"], body["kind"], body["playbook"]) == ("queued", "stack", "stack.yml")
    assert body["hosts"] == ["gpu-1", "gpu-2"] and body["check_mode"] is True
    assert body["created_by"] == "operator" and body["profile"] == "h100-cuda124"

    response = client.post(RUNS, {"cluster": "gpu", "profile": "h100-cuda124",
                                  "hosts": ["gpu-3"]}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["hosts"] == ["Not nodes of cluster gpu: gpu-3."]

    run = DeploymentRun.objects.get(pk=body["id"])
    response = client.post(f"{RUNS}{run.pk}/rerun-failed/")
    assert response.status_code == 400 and "still queued" in response.json()["message"]

    # The grid, as the console reads it while the run goes on.
    DeploymentRun.objects.filter(pk=run.pk).update(state=DeploymentState.RUNNING)
    DeploymentTaskResult.objects.create(run=run, host="gpu-1", position=0,
                                        task="Gathering Facts", status=TaskStatus.OK,
                                        output="ansible_facts: …")
    DeploymentTaskResult.objects.create(run=run, host="gpu-2", position=0,
                                        task="Gathering Facts", status=TaskStatus.UNREACHABLE,
                                        output="Connection timed out")
    grid = client.get(f"{RUNS}{run.pk}/results/").json()
    assert grid["tasks"] == [{"position": 0, "task": "Gathering Facts", "role": ""}]
    assert [(h["host"], h["state"]) for h in grid["hosts"]] == [("gpu-1", "running"),
                                                                ("gpu-2", "unreachable")]
    assert grid["hosts"][1]["output"] == "Connection timed out"
    # Polled: a cell carries its output where the task failed or was unreachable, only.
    assert [h["cells"][0]["output"] for h in grid["hosts"]] == ["", "Connection timed out"]

    response = client.post(f"{RUNS}{run.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert client.post(f"{RUNS}{run.pk}/cancel/").status_code == 400
    with django_capture_on_commit_callbacks() as enqueued:
        response = client.post(f"{RUNS}{run.pk}/rerun-failed/")
    assert response.status_code == 202, response.json()
    assert response.json()["hosts"] == ["gpu-1", "gpu-2"]  # cancelled: neither finished
    assert response.json()["rerun_of"] == run.pk and len(enqueued) == 1

    listed = client.get(RUNS, {"cluster": "gpu", "state": "cancelled"}).json()
    assert [r["id"] for r in listed["results"]] == [run.pk]


def test_tenant_users_see_no_runs_and_start_none(api, world, cluster,
                                                 django_capture_on_commit_callbacks):
    api.as_user(world.operator).post(PROFILES, PROFILE, format="json")
    with django_capture_on_commit_callbacks():
        run_id = api.as_user(world.operator).post(
            RUNS, {"cluster": "gpu", "profile": "h100-cuda124", "hosts": ["gpu-1"]},
            format="json").json()["id"]
    member = api.as_user(world.alpha_admin)
    assert member.get(RUNS).json()["count"] == 0
    assert member.get(f"{RUNS}{run_id}/").status_code == 404
    assert member.get(f"{RUNS}{run_id}/results/").status_code == 404
    response = member.post(RUNS, {"cluster": "gpu", "profile": "h100-cuda124",
                                  "hosts": ["gpu-1"]}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert member.post(f"{RUNS}{run_id}/cancel/").status_code == 404
    assert DeploymentRun.objects.get(pk=run_id).state == DeploymentState.QUEUED


def test_the_run_list_pins_its_query_count(api, world, cluster, django_assert_max_num_queries,
                                           django_capture_on_commit_callbacks):
    client = api.as_user(world.operator)
    client.post(PROFILES, PROFILE, format="json")
    for host in ("gpu-1", "gpu-2"):
        with django_capture_on_commit_callbacks():
            client.post(RUNS, {"cluster": "gpu", "profile": "h100-cuda124", "hosts": [host]},
                        format="json")
    with django_assert_max_num_queries(4):
        assert client.get(RUNS).json()["count"] == 2
