"""Ray clusters from the SDK (`OgaiClient.ray_cluster`, `RayCluster`) and the CLI (`kind: ray`
specs, `ogai job show`), against the whole platform served by uvicorn (its ASGI app: the API
and the proxy of Ray dashboards).

On the fake driver, `ray_addresses` is replaced at the driver's boundary and a tiny stand-in
answers Ray's job API (version, submit, status), so these are quick; scheduling cycles run in
the test's thread, between the SDK's polls. `test_a_real_ray_cluster_end_to_end` runs a real
one-worker Ray cluster on the local driver and submits to it through the proxy."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import httpx
import pytest
import yaml
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job
from aistation.services import ray_clusters
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from aistation.tests.test_notebook_proxy import _serve, _stop
from infra_os.services.tokens import api_token_create
from ogai_client import OgaiClient, OgaiError, RayCluster, cli
from ogai_client.spec import SpecError, parse_spec
from podsys.drivers.fake import FakeDriver
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

pytestmark = pytest.mark.django_db(transaction=True)

RAY_SPEC = """
kind: ray
name: ray-hello
command: [python, hello_ray.py]
ray:
  workers: 2
  worker: {gpus: 1, cpu: 4, memory: 16Gi}
  head: {cpu: 2, memory_mib: 8192}
  dashboard: true
"""


# -- specs: no server -------------------------------------------------------------------------


def test_a_ray_spec_is_read_with_memory_in_kubernetes_units():
    spec = parse_spec(RAY_SPEC)
    assert spec["kind"] == "ray"
    assert spec["ray"] == {"workers": 2, "dashboard": True,
                           "worker": {"gpus": 1, "cpu": 4, "memory_mib": 16384},
                           "head": {"cpu": 2, "memory_mib": 8192}}


@pytest.mark.parametrize(("text", "message"), [
    ("kind: spark\n", "kind: 'spark' is not a kind of job; use job or ray"),
    ("ray: {workers: 1}\n", "ray: only a job of kind: ray takes a Ray cluster; add kind: ray"),
    ("kind: ray\nray: [1]\n", "ray: give a mapping"),
    ("kind: ray\nray: {nodes: 3}\n", "ray.nodes: unknown field"),
    ("kind: ray\nray: {workers: two}\n", "ray.workers: 'two' is not a number"),
    ("kind: ray\nray: {workers: -1}\n", "ray.workers: -1 is not a number"),
    ("kind: ray\nray: {dashboard: maybe}\n", "ray.dashboard: give true or false"),
    ("kind: ray\nray: {worker: 4}\n", "ray.worker: give a mapping"),
    ("kind: ray\nray: {worker: {gpu: 1}}\n", "ray.worker.gpu: unknown field"),
    ("kind: ray\nray: {head: {memory: lots}}\n", "ray.head.memory: 'lots' is not a quantity"),
    ("kind: ray\nray: {head: {memory: 1Gi, memory_mib: 5}}\n",
     "ray.head: give memory or memory_mib, not both"),
])
def test_bad_ray_specs_say_which_field_in_one_line(text, message):
    with pytest.raises(SpecError) as raised:
        parse_spec(text)
    assert str(raised.value).startswith(message), str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_cli_refuses_a_bad_ray_spec_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "ray.yaml"
    path.write_text("kind: ray\nname: r\ncommand: [python]\nray: {worker: {gpu: 1}}\n")
    assert cli.main(["job", "submit", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ray.worker.gpu: unknown field") and err.count("\n") == 1


def test_the_sdk_imports_no_ray():
    code = "import sys, ogai_client; from ogai_client import RayCluster; " \
           "assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the platform, served -------------------------------------------------------------------------


async def ray_job_api(scope, receive, send):
    """Ray's job API, as much of it as `JobSubmissionClient` asks here; records requests."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    ray_job_api.seen.append((scope["method"], scope["path"], headers, body.decode()))
    if scope["path"] == "/api/version":
        answer = {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}
    elif scope["path"] == "/api/jobs/" and scope["method"] == "POST":
        answer = {"job_id": "raysubmit_1", "submission_id": "raysubmit_1"}
    elif scope["path"] == "/api/jobs/raysubmit_1":
        answer = {"type": "SUBMISSION", "status": "SUCCEEDED", "entrypoint": "x",
                  "submission_id": "raysubmit_1", "job_id": "raysubmit_1"}
    else:
        answer = {"error": scope["path"]}
    data = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


ray_job_api.seen = []


@pytest.fixture(scope="module")
def platform():
    from ogai.asgi import application

    served = _serve(application)
    yield served
    _stop(served)


@pytest.fixture(scope="module")
def dashboard():
    served = _serve(ray_job_api)
    yield served
    _stop(served)


@pytest.fixture
def fake(world, settings, monkeypatch, dashboard):
    """A fake cluster where alpha and beta have a queue; its driver says each Ray workload's
    GCS is 127.0.0.1:6379 and its dashboard is the stand-in of Ray's job API."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    cluster = Cluster.objects.create(name="fake-ray", driver="fake",
                                     options={"nodes": 2, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    for tenant in (world.alpha, world.beta):
        queue_create(actor=world.alpha_admin if tenant == world.alpha else world.beta_admin,
                     tenant=tenant, name="default", cluster=cluster)
    monkeypatch.setattr(FakeDriver, "ray_addresses",
                        lambda self, handle: {"gcs": "127.0.0.1:6379",
                                              "dashboard": dashboard.url})
    monkeypatch.setattr(ray_clusters, "_addresses", {})
    ray_job_api.seen.clear()
    return cluster


def token_for(user) -> str:
    return api_token_create(actor=user, name="test",
                            expires_at=timezone.now() + timedelta(days=1)).secret


@pytest.fixture
def client(world, platform):
    with OgaiClient(platform.url, token_for(world.alpha_member)) as client:
        yield client


@pytest.fixture
def cycles_between_polls(fake, monkeypatch):
    """The SDK's polls sleep: a scheduling cycle runs instead."""
    import ogai_client.ray as sdk_ray

    monkeypatch.setattr(sdk_ray.time, "sleep",
                        lambda seconds: schedule_cluster(cluster_id=fake.pk))


def test_a_ray_cluster_from_the_sdk_comes_up_takes_work_and_goes_down(
        world, client, platform, fake, cycles_between_polls, monkeypatch):
    registered = []
    real_register, real_unregister = atexit.register, atexit.unregister
    monkeypatch.setattr("ogai_client.ray.atexit.register", lambda fn, *args, **kwargs: (
        registered.append(fn) if fn.__module__ == "ogai_client.ray"
        else real_register(fn, *args, **kwargs)))
    unregistered = []
    monkeypatch.setattr("ogai_client.ray.atexit.unregister", lambda fn: (
        unregistered.append(fn) if fn.__module__ == "ogai_client.ray"
        else real_unregister(fn)))
    with client.ray_cluster(workers=1, worker={"cpu": 1, "memory": "2Gi"},
                            time_limit_s=600) as cluster:
        job = Job.objects.get(pk=cluster.job_id)
        assert job.ray["workers"] == 1 and job.replicas == 2
        assert job.ray["worker"]["memory_mib"] == 2048 and job.ray["dashboard"] is True
        assert job.time_limit_s == 600
        # The entrypoint only holds the cluster up, a little past the time limit.
        assert job.command == ["python", "-c", "import time; time.sleep(660)"]
        assert cluster._down_at_exit in registered
        with pytest.raises(OgaiError) as raised:
            _ = cluster.address
        assert raised.value.code == "not_ready" and "wait_ready" in str(raised.value)

        assert cluster.wait_ready(timeout=30) is cluster
        assert cluster.job.state == "running"
        assert cluster.address == "127.0.0.1:6379"
        assert cluster.dashboard_url == f"{platform.url}/ray-dashboards/{job.pk}/"

        # Work goes to the running cluster through Ray's job API, via the platform's proxy.
        submission = cluster.submit(["python", "-c", "print('hi there')"], wait=True)
        assert submission == "raysubmit_1"
        posted = [seen for seen in ray_job_api.seen if seen[0] == "POST"]
        assert len(posted) == 1
        assert json.loads(posted[0][3])["entrypoint"] == "python -c 'print('\"'\"'hi " \
            "there'\"'\"')'"
        # The platform's token stopped at the proxy.
        assert all("authorization" not in seen[2] for seen in ray_job_api.seen)
        assert Job.objects.count() == 1  # submitting made no second job
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert cluster._down_at_exit in unregistered
    cluster.down()  # twice is nothing
    assert cluster.job.state == "cancelled"


def test_the_cluster_goes_down_when_the_session_ends(world, client, fake, monkeypatch):
    real_register = atexit.register
    monkeypatch.setattr("ogai_client.ray.atexit.register", lambda fn, *args, **kwargs: (
        None if fn.__module__ == "ogai_client.ray" else real_register(fn, *args, **kwargs)))
    cluster = client.ray_cluster(workers=0, dashboard=False)
    client.close()  # the notebook's own client may be gone by then
    cluster._down_at_exit()
    assert Job.objects.get(pk=cluster.job_id).state == JobState.CANCELLED


def test_without_a_dashboard_submit_says_to_use_ray_init(world, client, fake,
                                                         cycles_between_polls):
    cluster = RayCluster.create(client, workers=1, dashboard=False, down_at_exit=False)
    cluster.wait_ready(timeout=30)
    assert cluster.dashboard_url == ""
    with pytest.raises(OgaiError) as raised:
        cluster.submit("python x.py")
    assert raised.value.code == "unsupported"
    assert "ray.init(address=cluster.address)" in str(raised.value)
    cluster.down()


def test_a_cluster_that_ends_before_ready_says_why(world, client, fake, cycles_between_polls):
    cluster = RayCluster.create(client, workers=1, down_at_exit=False)
    client.cancel_job(cluster.job_id)
    with pytest.raises(OgaiError) as raised:
        cluster.wait_ready(timeout=30)
    assert raised.value.code == "ended" and "cancelled" in str(raised.value)


def test_another_tenant_cannot_reach_the_cluster(world, client, platform, fake,
                                                 cycles_between_polls):
    cluster = RayCluster.create(client, workers=1, down_at_exit=False)
    cluster.wait_ready(timeout=30)
    with OgaiClient(platform.url, token_for(world.beta_member)) as theirs:
        with pytest.raises(OgaiError) as raised:
            theirs.ray_addresses(cluster.job_id)
        assert raised.value.status == 404
        with pytest.raises(OgaiError):
            RayCluster.attach(theirs, cluster.job_id)
        # Their token does not open the dashboard either, nor does no token.
        with httpx.Client(trust_env=False) as http:
            url = f"{cluster.dashboard_url}api/jobs/"
            assert http.post(url, json={}, headers={
                "Authorization": f"Bearer {theirs.token}"}).status_code == 404
            assert http.post(url, json={}).status_code == 302
    attached = RayCluster.attach(client, cluster.job_id)
    assert attached.address == "127.0.0.1:6379"
    attached.down()


def test_the_cli_submits_and_shows_a_ray_job(world, platform, fake, tmp_path, capsys,
                                              monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OGAI_URL", platform.url)
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.alpha_member))
    path = tmp_path / "ray.yaml"
    spec = yaml.safe_load(RAY_SPEC)
    spec["ray"]["worker"] = {"cpu": 2, "memory": "4Gi"}
    path.write_text(yaml.safe_dump(spec))
    assert cli.main(["job", "submit", str(path), "--no-workdir"]) == 0, capsys.readouterr().err
    job = Job.objects.get()
    assert job.ray["worker"]["memory_mib"] == 4096 and job.replicas == 3
    capsys.readouterr()
    assert cli.main(["job", "show", str(job.pk)]) == 0
    out = capsys.readouterr().out
    assert "kind" in out and " ray" in out
    assert "head (0 GPU, 2 CPU, 8Gi) + 2 workers (0 GPU, 2 CPU, 4Gi); dashboard on" in out
    assert "not ready: job" in out
    schedule_cluster(cluster_id=fake.pk)
    assert cli.main(["job", "show", str(job.pk)]) == 0
    out = capsys.readouterr().out
    assert "127.0.0.1:6379" in out and f"/ray-dashboards/{job.pk}/" in out
    assert cli.main(["job", "show", str(job.pk), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "ray" and shown["ray_cluster"]["address"] == "127.0.0.1:6379"


# -- a real Ray cluster, end to end -------------------------------------------------------------


def ray_daemons(marks: list[str]) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(mark in cmdline for mark in marks) and ("raylet" in cmdline
                                                      or "gcs_server" in cmdline):
            found.append(cmdline[:120])
    return found


JOINS = textwrap.dedent("""
    import ray
    ray.init()
    print("alive nodes", len([node for node in ray.nodes() if node["Alive"]]), flush=True)

    @ray.remote(num_cpus=0)
    def times(a, b):
        return a * b

    print("6 * 7 =", ray.get(times.remote(6, 7)), flush=True)
""")


@pytest.mark.slow  # about 55 s on two cores: Ray starts slowly
def test_a_real_ray_cluster_end_to_end(world, local_queue, platform, client):
    """The SDK starts a one-worker Ray cluster on this machine (the local driver), waits for
    it, submits work to it through Ray's job API via the platform's proxy (the dashboard, with
    the SDK's token), and down() leaves no Ray process."""
    pytest.importorskip("ray")
    cluster_id = local_queue.cluster_id
    stop = threading.Event()

    def controller():  # what the platform's Celery worker does
        while not stop.is_set():
            schedule_cluster(cluster_id=cluster_id)
            reconcile_cluster(cluster=Cluster.objects.get(pk=cluster_id))
            stop.wait(0.5)

    thread = threading.Thread(target=controller, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        node = {"cpu": 1, "memory_mib": 400}
        with client.ray_cluster(workers=1, worker=node, time_limit_s=300,
                                down_at_exit=False) as cluster:
            cluster.wait_ready(timeout=90, poll_s=0.5)
            host, port = cluster.address.split(":")
            assert host == "127.0.0.1" and port.isdigit() and cluster.gcs_address == \
                cluster.address
            # Work goes in through Ray's job API via the platform's proxy; it runs beside the
            # head, joins the cluster (Ray sets RAY_ADDRESS) and sees both nodes.
            jobs = cluster.job_client()
            submission = cluster.submit(["python", "-c", JOINS])
            status = cluster.wait_submission(submission, timeout=60, poll_s=0.5, jobs=jobs)
            logs = jobs.get_job_logs(submission)
            assert status == "SUCCEEDED", logs
            assert "alive nodes 2" in logs and "6 * 7 = 42" in logs
            gcs_port = port
        job = Job.objects.get(pk=cluster.job_id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
                job.state != JobState.CANCELLED
                or ray_daemons([f"--gcs_server_port={gcs_port}"])):
            time.sleep(0.5)
            job.refresh_from_db()
        assert job.state == JobState.CANCELLED, job.reason
        assert ray_daemons([f"--gcs_server_port={gcs_port}"]) == []
    finally:
        stop.set()
        thread.join(10)
    print(f"real Ray cluster end to end: {time.monotonic() - started:.1f} s")
