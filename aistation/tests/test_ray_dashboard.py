"""A Ray job's addresses through the API (`GET /jobs/{id}/ray/`) and its dashboard through the
platform's proxy (`/ray-dashboards/<job id>/`), on the fake driver with `ray_addresses`
replaced at the driver's boundary: the dashboard is a tiny upstream that echoes requests.

Attacks: an anonymous caller, a bad token, another tenant's member (session or token) and a
viewer of the same tenant reach nothing; only the job's owner and the tenant's admins do."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from aistation.choices import JobState
from aistation.services import ray_clusters
from aistation.tests.test_notebook_proxy import _serve, _stop, upstream_app
from infra_os.services.tokens import api_token_create
from podsys.drivers.fake import FakeDriver

pytestmark = pytest.mark.django_db(transaction=True)

RAY = {"workers": 1, "head": {"gpus": 0, "gpu_model": "", "cpu": 1.0, "memory_mib": 2048},
       "worker": {"gpus": 0, "gpu_model": "", "cpu": 1.0, "memory_mib": 2048},
       "dashboard": True}


@pytest.fixture(scope="module")
def dashboard():
    served = _serve(upstream_app)
    yield served
    _stop(served)


@pytest.fixture(scope="module")
def proxy_server():
    from ogai.asgi import application

    served = _serve(application)
    yield served
    _stop(served)


@pytest.fixture
def http(proxy_server):
    with httpx.Client(base_url=proxy_server.url, trust_env=False, timeout=10) as client:
        yield client


@pytest.fixture
def addresses(monkeypatch, dashboard):
    """The fake driver says where each workload's Ray is: the echoing upstream."""
    asked = []

    def ray_addresses(self, handle):
        asked.append(handle)
        return {"gcs": "127.0.0.1:6379", "dashboard": dashboard.url}

    monkeypatch.setattr(FakeDriver, "ray_addresses", ray_addresses)
    monkeypatch.setattr(ray_clusters, "_addresses", {})
    return asked


def ray_job(farm, *, dashboard=True, run=True, tenant="alpha"):
    job = farm.submit(tenant, gpus=0, replicas=2, name="ray", duration=600,
                      ray={**RAY, "dashboard": dashboard})
    if run:
        farm.cycle()
        job.refresh_from_db()
        assert job.state == JobState.RUNNING, job.reason
    return job


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def token_of(user) -> str:
    return api_token_create(actor=user, name="t",
                            expires_at=timezone.now() + timedelta(days=1)).secret


# -- the API -----------------------------------------------------------------------------------


def test_the_api_says_where_a_running_ray_job_is(api, world, farm, addresses, monkeypatch):
    job = ray_job(farm, run=False)
    url = f"/api/v1/aistation/jobs/{job.pk}/ray/"
    body = api.as_user(world.alpha_member).get(url).json()
    assert body["ready"] is False and body["address"] == ""
    assert f"job {job.pk} is queued" in body["reason"]
    farm.cycle()
    body = api.as_user(world.alpha_member).get(url).json()
    assert body == {"ready": True, "address": "127.0.0.1:6379", "reason": "",
                    "gcs_address": "127.0.0.1:6379",
                    "dashboard_url": f"http://testserver/ray-dashboards/{job.pk}/"}
    # Where the driver gives a Ray Client address, that is what ray.init takes.
    monkeypatch.setattr(FakeDriver, "ray_addresses", lambda self, handle: {
        "gcs": "127.0.0.1:6379", "client": "ray://127.0.0.1:10001", "dashboard": ""})
    monkeypatch.setattr(ray_clusters, "_addresses", {})
    body = api.as_user(world.alpha_member).get(url).json()
    assert body["address"] == "ray://127.0.0.1:10001" and body["gcs_address"] == "127.0.0.1:6379"
    # A viewer of the tenant sees it as they see the job; another tenant finds no such job.
    assert api.as_user(world.alpha_viewer).get(url).status_code == 200
    response = api.as_user(world.beta_admin).get(url)
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    response = api.as_user(world.beta_member).get(url)
    assert response.status_code == 404


def test_a_job_without_a_dashboard_has_no_dashboard_url(api, world, farm, addresses):
    job = ray_job(farm, dashboard=False)
    body = api.as_user(world.alpha_member).get(f"/api/v1/aistation/jobs/{job.pk}/ray/").json()
    assert body["ready"] is True and body["address"] == "127.0.0.1:6379"
    assert body["dashboard_url"] == ""


def test_a_job_that_is_not_a_ray_job_answers_400(api, world, farm):
    job = farm.submit(gpus=1)
    response = api.as_user(world.alpha_member).get(f"/api/v1/aistation/jobs/{job.pk}/ray/")
    assert response.status_code == 400
    assert "not a Ray job" in response.json()["fields"]["kind"][0]


# -- the proxy ---------------------------------------------------------------------------------


def test_the_owner_reaches_the_dashboard_with_the_prefix_stripped(http, world, farm, addresses):
    job = ray_job(farm)
    cookie = session_of(world.alpha_member)
    response = http.get(f"/ray-dashboards/{job.pk}/api/version?x=1",
                        headers={"Cookie": cookie + "; other=kept"})
    assert response.status_code == 201, response.text
    echoed = response.json()
    assert echoed["raw_path"] == "/api/version" and echoed["query"] == "x=1"
    assert echoed["headers"]["cookie"] == "other=kept"
    assert "authorization" not in echoed["headers"]
    # The SDK's JobSubmissionClient comes with an API token, never passed upstream.
    token = token_of(world.alpha_member)
    response = http.post(f"/ray-dashboards/{job.pk}/api/jobs/", content=b"{}",
                         headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text
    assert response.json()["method"] == "POST"
    assert token not in response.text
    # The tenant's admins may reach it too.
    response = http.get(f"/ray-dashboards/{job.pk}/",
                        headers={"Cookie": session_of(world.alpha_admin)})
    assert response.status_code == 201 and response.json()["raw_path"] == "/"
    # The folder's own address without its slash is sent to it.
    response = http.get(f"/ray-dashboards/{job.pk}")
    assert response.status_code == 302
    assert response.headers["location"] == f"/ray-dashboards/{job.pk}/"


def test_attackers_reach_no_dashboard(http, world, farm, addresses):
    job = ray_job(farm)
    path = f"/ray-dashboards/{job.pk}/api/jobs/"
    # Anonymous: sent to sign in; a made-up token or session is no better.
    response = http.get(path)
    assert response.status_code == 302 and "next=" in response.headers["location"]
    assert http.get(path, headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}=x"}) \
        .status_code == 302
    response = http.post(path, content=b"{}", headers={"Authorization": "Bearer ogai_nope"})
    assert response.status_code == 401
    # Another tenant's member and admin, by session or token: no such dashboard.
    for user in (world.beta_member, world.beta_admin):
        assert http.get(path, headers={"Cookie": session_of(user)}).status_code == 404
        response = http.post(path, content=b"{}",
                             headers={"Authorization": f"Bearer {token_of(user)}"})
        assert response.status_code == 404
    # A viewer of the job's own tenant sees the job, but the dashboard runs code: no.
    assert http.get(path, headers={"Cookie": session_of(world.alpha_viewer)}).status_code \
        == 404
    # A cross-site form post with the owner's session is refused before anything else.
    response = http.post(path, content=b"{}", headers={
        "Cookie": session_of(world.alpha_member), "Origin": "https://evil.example"})
    assert response.status_code == 403
    # Nothing of these reached the dashboard: the driver was asked only by the API's checks.
    assert addresses == []


def test_no_dashboard_and_not_running_say_so(http, world, farm, addresses):
    cookie = {"Cookie": session_of(world.alpha_member)}
    without = ray_job(farm, dashboard=False)
    assert http.get(f"/ray-dashboards/{without.pk}/", headers=cookie).status_code == 404
    plain = farm.submit(gpus=1)
    assert http.get(f"/ray-dashboards/{plain.pk}/", headers=cookie).status_code == 404
    waiting = ray_job(farm, run=False)
    waiting.state = JobState.QUEUED
    waiting.save(update_fields=["state"])
    response = http.get(f"/ray-dashboards/{waiting.pk}/", headers=cookie)
    assert response.status_code == 503 and f"job {waiting.pk} is queued" in response.text
    assert http.get("/ray-dashboards/999999/", headers=cookie).status_code == 404
