"""Notebooks through the API: start, list, stop, resume, delete; other tenants' notebooks are
not found, viewers cannot start one, and no token ever appears in an answer."""

import pytest

from aistation.choices import JobState
from aistation.models import Notebook, NotebookPolicy
from aistation.services import scheduling
from aistation.services.notebooks import notebook_gpu_hours, notebook_start
from infra_os.models import ApiToken
from ogai.crypto import decrypt

NOTEBOOKS = "/api/v1/aistation/notebooks/"


def start(**changes):
    base = {"tenant": "alpha", "queue": "default", "name": "explore", "gpus": 1}
    base.update(changes)
    return base


def secrets_of(notebook: Notebook) -> list[str]:
    """The strings that must never be in an answer: the Jupyter server's token (plain and as
    stored) and the SDK token's stored parts."""
    notebook.refresh_from_db()
    found = [notebook.server_token, decrypt(notebook.server_token)] \
        if notebook.server_token else []
    token = ApiToken.objects.filter(pk=notebook.sdk_token_id).first()
    if token is not None:
        found += [token.prefix, token.key_hash]
    return found


def assert_no_tokens(response, notebook: Notebook) -> None:
    text = response.content.decode()
    assert "token" not in text.lower(), text
    for secret in secrets_of(notebook):
        assert secret not in text


def test_start_list_retrieve_stop_resume_and_delete(api, world, farm):
    client = api.as_user(world.alpha_member)
    created = client.post(NOTEBOOKS, start(cpu=4, memory_mib=16384), format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    notebook = Notebook.objects.get(pk=body["id"])
    assert_no_tokens(created, notebook)
    assert body["tenant"] == "alpha" and body["owner"] == "alpha-member"
    assert body["queue"] == "default" and body["name"] == "explore"
    assert body["resources"] == {"gpus": 1, "gpu_model": "", "cpu": 4.0, "memory_mib": 16384}
    assert body["state"] == "waiting" and body["reason"]
    assert body["job"] == notebook.job_id and body["url"] is None
    assert body["gpu_hours"] == 0 and body["idle_timeout_s"] == 3600
    assert set(body) == {"id", "tenant", "owner", "name", "queue", "image", "resources",
                         "state", "reason", "job", "url", "gpu_hours", "idle_timeout_s",
                         "last_activity_at", "created_at"}

    scheduling.schedule_cluster(cluster_id=farm.cluster.pk)
    shown = client.get(f"{NOTEBOOKS}{notebook.pk}/")
    assert shown.status_code == 200
    assert shown.json()["state"] == "running" and shown.json()["reason"] == ""
    assert shown.json()["url"] == f"/notebooks/{notebook.pk}/lab"
    assert_no_tokens(shown, notebook)

    listed = client.get(NOTEBOOKS)
    assert listed.status_code == 200
    assert [n["id"] for n in listed.json()["results"]] == [notebook.pk]
    assert_no_tokens(listed, notebook)
    assert client.get(NOTEBOOKS, {"state": "running"}).json()["count"] == 1
    assert client.get(NOTEBOOKS, {"state": "stopped"}).json()["count"] == 0
    assert client.get(NOTEBOOKS, {"tenant": "beta"}).json()["count"] == 0
    assert client.get(NOTEBOOKS, {"state": "asleep"}).status_code == 400

    stopped = client.post(f"{NOTEBOOKS}{notebook.pk}/stop/")
    assert stopped.status_code == 202, stopped.content
    assert stopped.json()["state"] == "stopped" and stopped.json()["url"] is None
    assert_no_tokens(stopped, notebook)
    assert client.post(f"{NOTEBOOKS}{notebook.pk}/stop/").status_code == 400
    first_job = notebook.job_id

    resumed = client.post(f"{NOTEBOOKS}{notebook.pk}/resume/")
    assert resumed.status_code == 202, resumed.content
    assert resumed.json()["state"] == "waiting" and resumed.json()["job"] != first_job
    assert_no_tokens(resumed, notebook)
    assert client.post(f"{NOTEBOOKS}{notebook.pk}/resume/").status_code == 400

    deleted = client.delete(f"{NOTEBOOKS}{notebook.pk}/")
    assert deleted.status_code == 204
    notebook.refresh_from_db()
    assert notebook.deleted and notebook.job.state == JobState.CANCELLED
    assert client.get(f"{NOTEBOOKS}{notebook.pk}/").status_code == 404
    assert client.get(NOTEBOOKS).json()["count"] == 0


def test_another_tenants_notebook_is_not_found(api, world, farm):
    notebook = notebook_start(actor=world.beta_member, tenant=world.beta,
                              queue=farm.queues["beta"], name="theirs")
    client = api.as_user(world.alpha_admin)
    assert client.get(f"{NOTEBOOKS}{notebook.pk}/").status_code == 404
    for action in ("stop", "resume"):
        response = client.post(f"{NOTEBOOKS}{notebook.pk}/{action}/")
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert client.delete(f"{NOTEBOOKS}{notebook.pk}/").status_code == 404
    assert client.get(NOTEBOOKS).json()["count"] == 0
    notebook.refresh_from_db()
    assert not notebook.deleted and notebook.job.state == JobState.QUEUED


def test_a_member_sees_only_their_own_and_a_tenant_admin_all_of_the_tenants(api, world, farm):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="mine")
    assert api.as_user(world.both).get(f"{NOTEBOOKS}{notebook.pk}/").status_code == 404
    admin = api.as_user(world.alpha_admin)
    assert admin.get(NOTEBOOKS).json()["count"] == 1
    assert admin.post(f"{NOTEBOOKS}{notebook.pk}/stop/").status_code == 202


def test_a_viewer_cannot_start_a_notebook(api, world, farm):
    response = api.as_user(world.alpha_viewer).post(NOTEBOOKS, start(), format="json")
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "permission_denied" and body["message"]
    # `both` writes in alpha but only views beta: the service says no, in the same envelope.
    response = api.as_user(world.both).post(NOTEBOOKS, start(tenant="beta"), format="json")
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "permission_denied"
    assert not Notebook.objects.exists()


@pytest.mark.parametrize(("changes", "field"), [
    ({"queue": "nope"}, "queue"),
    ({"tenant": "beta"}, "tenant"),
    ({"gpus": -1}, "gpus"),
    ({"name": ""}, "name"),
    ({"gpu": 1}, "gpu"),
])
def test_bad_starts_answer_400_naming_the_field(api, world, farm, changes, field):
    response = api.as_user(world.alpha_member).post(NOTEBOOKS, start(**changes), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not Notebook.objects.exists()


def test_the_tenant_may_be_left_out_by_a_member_of_one_tenant(api, world, farm):
    body = start()
    del body["tenant"]
    response = api.as_user(world.alpha_member).post(NOTEBOOKS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == "alpha"


def test_the_list_pins_its_query_count_and_agrees_with_the_services(
        api, world, farm, django_assert_max_num_queries):
    NotebookPolicy.objects.create(tenant=world.alpha, idle_timeout_s=900)
    notebooks = [notebook_start(actor=world.alpha_member, tenant=world.alpha,
                                queue=farm.queues["alpha"], name=f"n{i}") for i in range(12)]
    scheduling.schedule_cluster(cluster_id=farm.cluster.pk)
    client = api.as_user(world.alpha_member)
    client.post(f"{NOTEBOOKS}{notebooks[0].pk}/stop/")
    client.post(f"{NOTEBOOKS}{notebooks[0].pk}/resume/")
    with django_assert_max_num_queries(6):
        response = client.get(NOTEBOOKS)
    assert response.status_code == 200
    rows = {row["id"]: row for row in response.json()["results"]}
    assert len(rows) == 12
    for notebook in notebooks:
        notebook.refresh_from_db()
        row = rows[notebook.pk]
        assert row["idle_timeout_s"] == 900
        assert row["gpu_hours"] == pytest.approx(notebook_gpu_hours(notebook), abs=1e-3)
        detail = client.get(f"{NOTEBOOKS}{notebook.pk}/").json()
        assert detail["gpu_hours"] == pytest.approx(row["gpu_hours"], abs=1e-3)
        assert detail["idle_timeout_s"] == 900
