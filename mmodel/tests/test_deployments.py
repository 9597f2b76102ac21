"""Deployments on the fake driver: replicas as service jobs (quota, restarts, scaling,
stopping), readiness read by the watch task, scale to zero and waking, and the refusals."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.utils import timezone

from aistation.choices import JobState
from aistation.services.jobs import job_cancel
from aistation.services.reconcile import reconcile_cluster
from infra_os.models import AuditEvent
from mmodel.choices import DeploymentState, VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Deployment, DeploymentReplica, Model, ModelVersion
from mmodel.selectors.deployments import deployment_state
from mmodel.services import deployment_watch
from mmodel.services.deployment_watch import deployments_watch
from mmodel.services.deployments import (
    MAX_RESUBMITS,
    deployment_create,
    deployment_delete,
    deployment_scale,
    deployment_start,
    deployment_stop,
    deployment_wake,
    replica_mark_unready,
)


def make_version(tenant, name="tiny", *, status=VersionStatus.READY, folder="models/tiny"):
    model, _ = Model.objects.get_or_create(tenant=tenant, name=name)
    number = model.versions.count() + 1
    return ModelVersion.objects.create(
        model=model, number=number, status=status, source=VersionSource.IMPORT,
        artifact_path=f"{folder}/{number}", format=WeightsFormat.SAFETENSORS,
        content_hash=f"{name}-{number}")


@pytest.fixture
def healthy(monkeypatch):
    """The servers' health as the watch task reads it: every upstream answers unless listed
    in `healthy.down`."""

    class Health:
        down: set[str] = set()
        asked: list[str] = []
        holds: dict[str, tuple[str, ...]] = {}

    health = Health()

    def probe(upstream):
        health.asked.append(upstream)
        if upstream in health.down:
            return False, "its server does not answer yet (ConnectTimeout)", ()
        return True, "", health.holds.get(upstream, ())

    monkeypatch.setattr(deployment_watch, "probe_health", probe)
    return health


@pytest.fixture
def deploy(farm, world):
    def deploy_(name="chat", *, replicas=1, gpus=0, actor=None, **extra):
        return deployment_create(
            actor=actor or world.alpha_member, tenant=world.alpha, name=name,
            version=extra.pop("version", None) or make_version(world.alpha),
            queue=farm.queues["alpha"], replicas=replicas, gpus_per_replica=gpus, **extra)
    return deploy_


def replicas_of(deployment):
    return list(DeploymentReplica.objects.filter(deployment=deployment)
                .select_related("job").order_by("index"))


def settle(farm):
    """What the workers would do after commit: stop cancelled jobs' workloads, then a cycle."""
    reconcile_cluster(cluster=farm.cluster)
    farm.cycle()


def state(deployment):
    return deployment_state(Deployment.objects.get(pk=deployment.pk))


def test_each_replica_is_a_service_job_and_the_watch_finds_it_ready(farm, world, deploy,
                                                                      healthy, settings):
    deployment = deploy(replicas=2, gpus=8, cpu_per_replica=3)  # one on each node
    replicas = replicas_of(deployment)
    jobs = [replica.job for replica in replicas]
    assert [replica.index for replica in replicas] == [0, 1]
    assert len({job.pk for job in jobs}) == 2
    for job in jobs:
        assert job.service and job.ports == [8000] and job.gpus_per_replica == 8
        assert job.max_restarts >= 1 and job.owner == world.alpha_member
        assert job.env["HF_HUB_OFFLINE"] == "1" and job.env["OMP_NUM_THREADS"] == "3"
        folder = str(settings.DATA_DIR / deployment.version.artifact_path)
        # The image's python runs the launcher that puts the key in front of the server.
        assert job.command[:2] == ["python", "-c"] and job.command[3:5] == ["serve", folder]
        assert "--continuous-batching" in job.command and "--cb-max-memory-percent" in job.command
    assert state(deployment) == DeploymentState.STARTING
    assert AuditEvent.objects.filter(action="deployment.create",
                                     object_id=str(deployment.pk)).exists()

    deployments_watch()  # queued jobs: not ready, and the replica says why
    assert all("queued" in r.message for r in replicas_of(deployment))
    farm.cycle()
    healthy.down = {"http://fake-node-000:8000", "http://fake-node-001:8000"}
    deployments_watch()
    assert state(deployment) == DeploymentState.STARTING
    first = replicas_of(deployment)[0]
    assert not first.ready and "does not answer" in first.message and first.upstream

    healthy.down = {replicas_of(deployment)[1].upstream}
    deployments_watch()
    assert state(deployment) == DeploymentState.DEGRADED
    healthy.down = set()
    deployments_watch()
    assert state(deployment) == DeploymentState.READY
    for replica in replicas_of(deployment):
        assert replica.ready and replica.ready_since and replica.checked_at
        assert replica.upstream.startswith("http://fake-node-")
        assert replica.served_model == str(settings.DATA_DIR / deployment.version.artifact_path)
    # The address is asked of the cluster once per attempt, not on every round.
    healthy.asked.clear()
    deployments_watch()
    assert len(healthy.asked) == 2


def test_a_deployment_waits_for_quota_like_a_job(farm, world, deploy, healthy):
    beta_job = farm.submit("beta", gpus=8)
    farm.cycle()
    deployment = deploy(replicas=2, gpus=8)
    farm.cycle()
    first, second = replicas_of(deployment)
    assert first.job.state == JobState.RUNNING
    assert second.job.state == JobState.QUEUED and second.job.reason
    deployments_watch()
    first, second = replicas_of(deployment)
    assert first.ready and not second.ready
    assert second.message == f"job {second.job_id} is queued: {second.job.reason}"
    assert state(deployment) == DeploymentState.DEGRADED

    job_cancel(actor=world.beta_member, job=beta_job)
    settle(farm)
    deployments_watch()
    assert state(deployment) == DeploymentState.READY


def test_refusals_name_the_field(farm, world, deploy):
    def refused(field, **kwargs):
        with pytest.raises(ValidationError) as caught:
            deploy(**kwargs)
        assert field in caught.value.message_dict, caught.value.message_dict
        return " ".join(caught.value.message_dict[field])

    assert "No model version" in refused("version", version=make_version(world.beta))
    assert "importing" in refused("version", version=make_version(
        world.alpha, "other", status=VersionStatus.IMPORTING))
    deploy("taken")
    assert "already has a deployment" in refused("name", name="taken")
    assert refused("name", name="Not A Name!")
    assert "1 to 16" in refused("replicas", replicas=17)
    assert refused("idle_timeout_s", idle_timeout_s=5)
    assert "cluster farm has 16" in refused("replicas", replicas=3, gpus=8)

    with pytest.raises(PermissionDenied):
        deploy("viewers", actor=world.alpha_viewer)
    with pytest.raises(Http404):
        deploy("strangers", actor=world.beta_member)
    assert set(Deployment.objects.values_list("name", flat=True)) == {"taken"}


def test_vllm_runs_locally_only_from_its_own_environment(world, local_queue, settings):
    settings.OGAI_VLLM_COMMAND = ""
    with pytest.raises(ValidationError) as caught:
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="fast",
                          version=make_version(world.alpha), queue=local_queue, runtime="vllm")
    assert caught.value.message_dict["runtime"] == [
        "vLLM is not installed here: set OGAI_VLLM_COMMAND to the vllm executable of its own "
        "environment, or use the transformers runtime"]
    with pytest.raises(ValidationError) as caught:  # another tenant's queue
        deployment_create(actor=world.beta_member, tenant=world.beta, name="x",
                          version=make_version(world.beta), queue=local_queue)
    assert "queue" in caught.value.message_dict

    settings.OGAI_VLLM_COMMAND = "/opt/vllm/bin/vllm"
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="fast",
                                   version=make_version(world.alpha), queue=local_queue,
                                   runtime="vllm")
    job = replicas_of(deployment)[0].job
    assert job.command[:2] == ["/opt/vllm/bin/vllm", "serve"]
    assert job.command[job.command.index("--served-model-name") + 1] == "fast"
    assert job.ports[0] == int(job.command[job.command.index("--port") + 1]) > 0
    assert replicas_of(deployment)[0].served_model == "fast"


def test_an_embedding_model_is_refused_to_vllm(world, local_queue, settings, tmp_path):
    settings.OGAI_VLLM_COMMAND = "/opt/vllm/bin/vllm"
    (tmp_path / "minilm" / "1").mkdir(parents=True)
    (tmp_path / "minilm" / "1" / "modules.json").write_text("[]")  # sentence-transformers'
    version = make_version(world.alpha, "minilm", folder=str(tmp_path / "minilm"))
    with pytest.raises(ValidationError) as caught:
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="embed",
                          version=version, queue=local_queue, runtime="vllm")
    assert "is an embedding model" in caught.value.message_dict["runtime"][0]
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="embed",
                                   version=version, queue=local_queue)
    assert "mmodel.runners.serve_embeddings" in replicas_of(deployment)[0].job.command


def test_scale_adds_and_removes_the_highest_replicas(farm, world, deploy, healthy):
    deployment = deploy(replicas=1)
    deployment_scale(actor=world.alpha_member, deployment=deployment, replicas=3)
    replicas = replicas_of(deployment)
    assert [r.index for r in replicas] == [0, 1, 2] and all(r.job for r in replicas)
    jobs = [r.job for r in replicas]
    farm.cycle()

    deployment_scale(actor=world.alpha_admin, deployment=deployment, replicas=1)
    assert [r.index for r in replicas_of(deployment)] == [0]
    for job in jobs:
        job.refresh_from_db()
    assert [job.state for job in jobs] == [JobState.RUNNING, JobState.CANCELLED,
                                           JobState.CANCELLED]
    assert Deployment.objects.get(pk=deployment.pk).replicas == 1
    event = AuditEvent.objects.filter(action="deployment.scale").latest("id")
    assert event.changes == {"replicas": [3, 1]}
    with pytest.raises(ValidationError):
        deployment_scale(actor=world.alpha_member, deployment=deployment, replicas=0)
    with pytest.raises(PermissionDenied):
        deployment_scale(actor=world.alpha_viewer, deployment=deployment, replicas=2)


def test_stop_start_and_delete(farm, world, deploy, healthy):
    deployment = deploy(replicas=2, gpus=4)
    farm.cycle()
    deployments_watch()
    assert state(deployment) == DeploymentState.READY
    old_jobs = [r.job for r in replicas_of(deployment)]

    deployment_stop(actor=world.alpha_member, deployment=deployment)
    assert state(deployment) == DeploymentState.STOPPED
    for job in old_jobs:
        job.refresh_from_db()
        assert job.state == JobState.CANCELLED
    assert not any(r.ready or r.upstream for r in replicas_of(deployment))
    deployments_watch()  # a stopped deployment's cancelled jobs are not replaced
    assert [r.job for r in replicas_of(deployment)] == old_jobs
    with pytest.raises(ValidationError):
        deployment_stop(actor=world.alpha_member, deployment=deployment)

    deployment_start(actor=world.alpha_member, deployment=deployment)
    new_jobs = [r.job for r in replicas_of(deployment)]
    assert not set(new_jobs) & set(old_jobs)
    assert state(deployment) == DeploymentState.STARTING
    with pytest.raises(ValidationError):
        deployment_start(actor=world.alpha_member, deployment=deployment)
    settle(farm)
    deployments_watch()
    assert state(deployment) == DeploymentState.READY

    deployment_delete(actor=world.alpha_admin, deployment=deployment)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    for job in new_jobs:
        job.refresh_from_db()
        assert job.state == JobState.CANCELLED
    actions = list(AuditEvent.objects.filter(object_type="mmodel.deployment").order_by("id")
                   .values_list("action", flat=True))
    assert actions == ["deployment.create", "deployment.stop", "deployment.start",
                       "deployment.delete"]


def test_a_killed_replica_is_restarted_alone(farm, world, deploy, healthy):
    deployment = deploy(replicas=2, gpus=1)
    farm.cycle()
    deployments_watch()
    first, second = replicas_of(deployment)
    farm.fake.crash(first.job.attempts.get().workload_id, exit_code=-9)
    reconcile_cluster(cluster=farm.cluster)
    deployments_watch()
    first, second = replicas_of(deployment)
    assert not first.ready and second.ready
    assert state(deployment) == DeploymentState.DEGRADED
    farm.cycle()  # the same job, its next attempt
    deployments_watch()
    assert replicas_of(deployment)[0].job_id == first.job_id
    assert first.job.attempts.count() == 2
    assert state(deployment) == DeploymentState.READY
    assert second.job.attempts.count() == 1


def test_a_job_that_ended_for_good_is_replaced_then_given_up(farm, world, deploy, healthy):
    deployment = deploy()
    farm.cycle()
    seen = set()
    for round_ in range(MAX_RESUBMITS + 1):
        replica = replicas_of(deployment)[0]
        seen.add(replica.job_id)
        job_cancel(actor=world.alpha_admin, job=replica.job)  # ended outside the deployment
        deployments_watch()
        replica = replicas_of(deployment)[0]
        if round_ < MAX_RESUBMITS:
            assert replica.job_id not in seen and replica.job.state == JobState.QUEUED
            assert f"job {min(seen) if round_ == 0 else max(seen)} cancelled" in replica.message
    replica = replicas_of(deployment)[0]
    assert replica.failed and "gave up" in replica.message
    assert state(deployment) == DeploymentState.FAILED
    deployments_watch()
    assert replicas_of(deployment)[0].job_id == replica.job_id  # no more new jobs

    deployment_start(actor=world.alpha_member, deployment=deployment)
    replica = replicas_of(deployment)[0]
    assert not replica.failed and replica.job.state == JobState.QUEUED
    farm.cycle()
    deployments_watch()
    assert state(deployment) == DeploymentState.READY


def test_a_replica_that_became_ready_again_gets_new_jobs_again(farm, world, deploy, healthy):
    deployment = deploy()
    for _ in range(MAX_RESUBMITS + 2):
        farm.cycle()
        deployments_watch()
        assert state(deployment) == DeploymentState.READY
        job_cancel(actor=world.alpha_admin, job=replicas_of(deployment)[0].job)
        deployments_watch()
    assert state(deployment) == DeploymentState.STARTING


def test_idle_deployments_scale_to_zero_and_a_request_wakes_them(farm, world, deploy,
                                                                  healthy):
    deployment = deploy(replicas=2, gpus=2, idle_timeout_s=300)
    farm.cycle()
    t0 = timezone.now()
    deployments_watch(now=t0)
    assert state(deployment) == DeploymentState.READY
    deployments_watch(now=t0 + timedelta(seconds=299))
    assert state(deployment) == DeploymentState.READY
    Deployment.objects.filter(pk=deployment.pk).update(
        last_request_at=t0 + timedelta(seconds=200))  # the gateway saw a request
    deployments_watch(now=t0 + timedelta(seconds=450))
    assert state(deployment) == DeploymentState.READY

    jobs = [r.job for r in replicas_of(deployment)]
    deployments_watch(now=t0 + timedelta(seconds=501))
    assert state(deployment) == DeploymentState.SCALED_TO_ZERO
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.CANCELLED  # its GPUs are free
    assert all("scaled to zero after 5 min" in r.message for r in replicas_of(deployment))
    assert AuditEvent.objects.filter(action="deployment.scale_to_zero").count() == 1
    deployments_watch(now=t0 + timedelta(seconds=900))  # nothing is started while idle
    assert [r.job for r in replicas_of(deployment)] == jobs

    deployment_wake(deployment_id=deployment.pk)
    woken = [r.job for r in replicas_of(deployment)]
    assert all(job.state == JobState.QUEUED for job in woken) and not set(woken) & set(jobs)
    assert state(deployment) == DeploymentState.STARTING
    deployment_wake(deployment_id=deployment.pk)  # idempotent
    assert [r.job for r in replicas_of(deployment)] == woken
    farm.cycle()
    deployments_watch()  # the waking request counts: not idle again at once
    assert state(deployment) == DeploymentState.READY

    deployment_stop(actor=world.alpha_member, deployment=deployment)
    deployment_wake(deployment_id=deployment.pk)  # a stopped deployment stays stopped
    assert state(deployment) == DeploymentState.STOPPED


def test_a_deployment_without_requests_is_idle_from_its_first_ready_replica(farm, deploy,
                                                                            healthy):
    deployment = deploy(idle_timeout_s=60)
    t0 = timezone.now()
    deployments_watch(now=t0 + timedelta(seconds=600))  # still queued: starting, not idle
    assert state(deployment) == DeploymentState.STARTING
    farm.cycle()
    deployments_watch(now=t0 + timedelta(seconds=700))
    deployments_watch(now=t0 + timedelta(seconds=750))
    assert state(deployment) == DeploymentState.READY
    deployments_watch(now=t0 + timedelta(seconds=761))
    assert state(deployment) == DeploymentState.SCALED_TO_ZERO


def test_the_gateway_marks_a_replica_unready_until_its_health_answers(farm, deploy, healthy):
    deployment = deploy()
    farm.cycle()
    deployments_watch()
    replica = replicas_of(deployment)[0]
    assert replica.ready
    replica_mark_unready(replica_id=replica.pk, reason="connection refused at the gateway")
    replica = replicas_of(deployment)[0]
    assert not replica.ready and replica.message == "connection refused at the gateway"
    assert state(deployment) == DeploymentState.STARTING
    deployments_watch()
    assert replicas_of(deployment)[0].ready


def test_a_creator_who_left_stops_the_platform_acting_for_them(farm, world, deploy, healthy):
    deployment = deploy()
    farm.cycle()
    world.alpha_member.memberships.all().delete()
    job_cancel(actor=world.alpha_admin, job=replicas_of(deployment)[0].job)
    deployments_watch()
    replica = replicas_of(deployment)[0]
    assert replica.failed and "can no longer start work in alpha" in replica.message
    deployment_start(actor=world.alpha_admin, deployment=deployment)
    assert replicas_of(deployment)[0].job.owner == world.alpha_admin


# -- replicas that run but do not answer ------------------------------------------------------


@pytest.fixture
def health_server(monkeypatch):
    """A real small HTTP server standing for every replica's process: its /health answers
    `health_server.status` (503, as a transformers server whose batching worker died). The
    watch asks it through its real probe, wherever the fake cluster says the replica is."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status = server.status if self.path == "/health" else 404
            body = b'{"status": "unhealthy", "reason": "cb_worker_dead"}' if status != 200 \
                else b'{"status": "ok"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.status = 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    real = deployment_watch.probe_health
    monkeypatch.setattr(deployment_watch, "probe_health", lambda upstream: real(url))
    yield server
    server.shutdown()
    thread.join(5)


def test_a_replica_stuck_unhealthy_is_restarted_after_the_grace_and_recovers(
        farm, deploy, health_server, settings):
    settings.OGAI_REPLICA_UNHEALTHY_GRACE_S = 60
    deployment = deploy()
    farm.cycle()
    t0 = timezone.now()
    deployments_watch(now=t0)
    stuck = replicas_of(deployment)[0]
    assert stuck.ready and state(deployment) == DeploymentState.READY

    health_server.status = 503  # the process lives on; its server is broken
    for seconds in (10, 40, 70):  # unhealthy since +10 s: within the grace until +70
        deployments_watch(now=t0 + timedelta(seconds=seconds))
        replica = replicas_of(deployment)[0]
        assert replica.job_id == stuck.job_id and not replica.ready
        assert replica.message == "its server's /health answered 503"
    deployments_watch(now=t0 + timedelta(seconds=71))
    replica = replicas_of(deployment)[0]
    stuck.job.refresh_from_db()
    assert stuck.job.state == JobState.CANCELLED  # its GPUs and port are freed
    assert replica.job_id != stuck.job_id and replica.job.state == JobState.QUEUED
    assert "failed its health check for over 60 s" in replica.message
    assert not replica.failed and replica.resubmits == 1
    event = AuditEvent.objects.get(action="deployment.restart_replica")
    assert event.changes["job"] == stuck.job_id

    # The new process is healthy: the deployment is back by itself.
    health_server.status = 200
    settle(farm)
    deployments_watch(now=t0 + timedelta(seconds=80))
    replica = replicas_of(deployment)[0]
    assert replica.ready and replica.resubmits == 0
    assert state(deployment) == DeploymentState.READY


def test_a_healthy_replica_is_never_restarted(farm, deploy, health_server, settings):
    settings.OGAI_REPLICA_UNHEALTHY_GRACE_S = 60
    deployment = deploy(replicas=2)
    farm.cycle()
    jobs = [r.job_id for r in replicas_of(deployment)]
    t0 = timezone.now()
    for seconds in (0, 3600, 86400, 30 * 86400):
        deployments_watch(now=t0 + timedelta(seconds=seconds))
    # A blip shorter than the grace, twice, 90 s apart: each streak starts afresh.
    for seconds, status in ((100, 503), (150, 200), (200, 503), (250, 503), (255, 200)):
        health_server.status = status
        deployments_watch(now=t0 + timedelta(days=31, seconds=seconds))
    assert [r.job_id for r in replicas_of(deployment)] == jobs
    assert state(deployment) == DeploymentState.READY
    assert not AuditEvent.objects.filter(action="deployment.restart_replica").exists()


def test_a_replica_that_never_answers_is_judged_by_the_start_timeout(farm, world, deploy,
                                                                     health_server, settings):
    settings.OGAI_REPLICA_UNHEALTHY_GRACE_S = 60
    settings.OGAI_REPLICA_START_TIMEOUT_S = 600
    health_server.status = 503  # loading its weights, or never going to
    deployment = deploy()
    farm.cycle()
    t0 = timezone.now()
    first = replicas_of(deployment)[0].job_id
    for seconds in (0, 120, 600):  # long past the grace, but it has never answered
        deployments_watch(now=t0 + timedelta(seconds=seconds))
        assert replicas_of(deployment)[0].job_id == first
    assert state(deployment) == DeploymentState.STARTING
    deployments_watch(now=t0 + timedelta(seconds=601))
    replica = replicas_of(deployment)[0]
    assert replica.job_id != first
    assert "did not answer its health check within 600 s of starting" in replica.message

    # Each new job gets the same time; after MAX_RESUBMITS that never answered, it gives up.
    clock = t0 + timedelta(seconds=601)
    for _ in range(MAX_RESUBMITS):
        settle(farm)
        deployments_watch(now=clock)
        clock += timedelta(seconds=601)
        deployments_watch(now=clock)
    replica = replicas_of(deployment)[0]
    assert replica.failed and "gave up" in replica.message
    assert replica.job.state == JobState.CANCELLED
    assert state(deployment) == DeploymentState.FAILED

    health_server.status = 200
    deployment_start(actor=world.alpha_member, deployment=deployment)
    settle(farm)
    deployments_watch(now=clock)
    assert state(deployment) == DeploymentState.READY


def test_the_replicas_key_is_in_their_secret_environment_only(farm, world, deploy, api,
                                                                settings):
    import json

    from ogai.crypto import decrypt

    settings.OGAI_TRANSFORMERS_IMAGE = "registry.example/serving:5.24"
    deployment = deploy(replicas=2, idle_timeout_s=0)
    other = deploy("other")
    key = decrypt(Deployment.objects.get(pk=deployment.pk).api_key)
    assert len(key) >= 32 and key != decrypt(Deployment.objects.get(pk=other.pk).api_key)
    farm.cycle()
    member = api.as_user(world.alpha_member)
    for replica in replicas_of(deployment):
        job = replica.job
        assert json.loads(decrypt(job.secret_env)) == {"OGAI_REPLICA_API_KEY": key}
        assert key not in json.dumps([job.command, job.env])
        for part in ("", "manifests/", "logs/"):
            shown = member.get(f"/api/v1/aistation/jobs/{job.pk}/{part}")
            assert shown.status_code == 200, shown.content
            assert key.encode() not in shown.content, part
    for viewer in (world.alpha_member, world.alpha_admin, world.operator):
        client = api.as_user(viewer)
        for url in ("/api/v1/mmodel/deployments/",
                    f"/api/v1/mmodel/deployments/{deployment.pk}/"):
            body = client.get(url)
            assert body.status_code == 200
            assert key.encode() not in body.content and b"api_key" not in body.content
    # A deployment made before replicas had keys gets one at its next start.
    Deployment.objects.filter(pk=deployment.pk).update(api_key="")
    deployment_stop(actor=world.alpha_member, deployment=deployment)
    deployment_start(actor=world.alpha_member, deployment=deployment)
    fresh = decrypt(Deployment.objects.get(pk=deployment.pk).api_key)
    assert fresh and fresh != key
    assert all(json.loads(decrypt(r.job.secret_env)) == {"OGAI_REPLICA_API_KEY": fresh}
               for r in replicas_of(deployment))
