"""A real `transformers serve` replica on the local driver: ready once its /health answers (the
watch task says so), answering chat completions; killed, it is marked not ready and restarted
by the platform, then ready again."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from aistation.models import Attempt
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from mmodel.choices import DeploymentState, VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Deployment, DeploymentReplica, Model, ModelVersion
from mmodel.selectors.deployments import deployment_state
from mmodel.services.deployments import deployment_create
from mmodel.tasks.deployments import watch_deployments
from mmodel.tests.tiny import tiny_model
from podsys.runtime import driver_for
from tests.processes import job_processes


def replica(deployment) -> DeploymentReplica:
    return DeploymentReplica.objects.select_related("job").get(deployment=deployment, index=0)


def watch_until(deployment, ready: bool, timeout: float) -> DeploymentReplica:
    """Run the watch task (as beat would, every half second here) until the replica's
    readiness is `ready`; the platform's own cycles run in between."""
    cluster = deployment.queue.cluster
    deadline = time.monotonic() + timeout
    while True:
        reconcile_cluster(cluster=cluster)
        schedule_cluster(cluster_id=cluster.pk)
        watch_deployments()
        found = replica(deployment)
        if found.ready == ready:
            return found
        if time.monotonic() > deadline:
            logs = "".join(Path(p).read_text()[-3000:] for p in
                           Path(cluster.options["root"]).glob("workloads/*/replica-0.log"))
            raise AssertionError(f"replica never became ready={ready}: {found.message}\n{logs}")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_replica_serves_is_killed_and_comes_back(world, local_queue, tmp_path, settings):
    settings.OGAI_RETRY_BACKOFF_S = 0
    folder = tiny_model(tmp_path / "tiny")
    model = Model.objects.create(tenant=world.alpha, name="tiny")
    version = ModelVersion.objects.create(
        model=model, number=1, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path=str(folder), format=WeightsFormat.SAFETENSORS, content_hash="t" * 64)
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="chat",
                                   version=version, queue=local_queue, cpu_per_replica=1,
                                   memory_mib_per_replica=1024)
    cluster = local_queue.cluster
    try:
        first = watch_until(deployment, ready=True, timeout=60)
        assert first.upstream.startswith("http://127.0.0.1:")
        assert deployment_state(Deployment.objects.get(pk=deployment.pk)) == \
            DeploymentState.READY
        answer = httpx.post(f"{first.upstream}/v1/chat/completions", timeout=30, json={
            "model": first.served_model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Paris is the capital of"}]})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 4

        servers = [pid for pid in job_processes(first.job_id)
                   if b"transformers" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert servers
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        down = watch_until(deployment, ready=False, timeout=20)
        assert down.message
        assert deployment_state(Deployment.objects.get(pk=deployment.pk)) == \
            DeploymentState.STARTING

        back = watch_until(deployment, ready=True, timeout=60)
        assert back.job_id == first.job_id  # the same job, restarted by AIStation
        assert back.job.attempts.count() == 2
        answer = httpx.post(f"{back.upstream}/v1/chat/completions", timeout=30, json={
            "model": back.served_model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}]})
        assert answer.status_code == 200, answer.text
    finally:  # whatever failed above, no server outlives the test
        for attempt in Attempt.objects.filter(cluster=cluster):
            driver_for(cluster).cancel(attempt.workload_id)
