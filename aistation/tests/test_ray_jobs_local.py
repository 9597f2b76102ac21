"""A Ray job of a head and a worker on the local driver, through the platform: its entrypoint
uses both nodes; it is preempted like any job (the fair policy takes its GPUs for a less served
job) and cancelled like any job, and neither leaves a Ray process of its attempt behind. Ray
starts slowly (about 15 s a cluster on two cores): the test starts two, one per attempt."""

import re
import sys
import textwrap
import time

import pytest

from aistation.choices import FINAL_STATES, JobState
from aistation.models import Job
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from aistation.tasks import cancel_job
from podsys.models import Cluster
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes
from tests.processes import ray_processes

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOBS = "/api/v1/aistation/jobs/"
# Runs a task on each live node, says how many nodes ran one, then holds its cluster.
TWO_NODES_THEN_HOLD = textwrap.dedent("""
    import time
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init()
    alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]

    @ray.remote(num_cpus=0)
    def where():
        return ray.get_runtime_context().get_node_id()

    ran = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote() for node in alive])
    print("alive", len(alive), "ran on", len(set(ran)), "nodes", flush=True)
    time.sleep(600)
""")
USED = re.compile(r"alive \d+ ran on \d+ nodes")


def _until(predicate, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _running_on_both_nodes(driver, job: Job, number: int):
    job.refresh_from_db()
    assert job.state == JobState.RUNNING, job.reason
    attempt = job.attempts.get(number=number)
    handle = attempt.workload_id
    # A Ray cluster starting on two busy cores has been seen to take over 90 s.
    said = _until(lambda: USED.search(driver.logs(handle)), "the entrypoint to use the cluster",
                  240)
    assert said.group(0) == "alive 2 ran on 2 nodes"
    assert ray_processes(driver, handle)
    addresses = driver.ray_addresses(handle)
    assert addresses and addresses["gcs"].startswith("127.0.0.1:")
    return attempt


def test_a_ray_job_uses_both_nodes_and_is_preempted_and_cancelled_like_any_job(
        api, world, tmp_path, settings):
    settings.OGAI_SCHEDULER_LEVELS_GPU_S = (1.0,)  # a level down after one GPU-second
    settings.OGAI_SCHEDULER_MIN_RUN_S = 0.5
    cluster = Cluster.objects.create(name="two-gpus", driver="local", options={
        "root": str(tmp_path / "cluster"), "grace_s": 1, "gpus": 2})
    cluster_sync_nodes(cluster=cluster)
    queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=cluster)
    member = api.as_user(world.alpha_member)
    small = {"cpu": 1, "memory_mib": 400}
    response = member.post(JOBS, {
        "tenant": "alpha", "queue": "default", "name": "ray", "kind": "ray",
        "command": [sys.executable, "-c", TWO_NODES_THEN_HOLD],
        "ray": {"workers": 1, "head": small, "worker": {**small, "gpus": 1}}}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    driver = driver_for(cluster)
    schedule_cluster(cluster_id=cluster.pk)
    first = _running_on_both_nodes(driver, job, 1)
    time.sleep(1.0)  # past one GPU-second (two GPUs held): a level down

    # Preempted: a less served job takes the GPUs; the attempt's Ray is gone.
    response = member.post(JOBS, {
        "tenant": "alpha", "queue": "default", "name": "short",
        "command": [sys.executable, "-c", "print('short done')"],
        "resources": {"gpus": 1}}, format="json")
    assert response.status_code == 201, response.content
    short = Job.objects.get(pk=response.json()["id"])
    schedule_cluster(cluster_id=cluster.pk)
    job.refresh_from_db()
    first.refresh_from_db()
    assert job.events.filter(to_state=JobState.PREEMPTED).exists()
    assert (first.state, job.state) == ("preempted", JobState.QUEUED), job.reason
    _until(lambda: not ray_processes(driver, first.workload_id),
           "the preempted attempt's Ray processes to stop", 15)

    # The short job ends; the Ray job runs again, a new cluster.
    def short_done():
        reconcile_cluster(cluster=cluster)
        short.refresh_from_db()
        return short.state in FINAL_STATES

    _until(short_done, "the short job to end", 60)
    assert short.state == JobState.SUCCEEDED, short.reason
    schedule_cluster(cluster_id=cluster.pk)
    second = _running_on_both_nodes(driver, job, 2)

    # Cancelled: the worker's cancel stops the attempt; its Ray is gone.
    response = member.post(f"{JOBS}{job.pk}/cancel/")
    assert response.status_code == 202, response.content
    assert cancel_job(job_id=job.pk) == 1
    job.refresh_from_db()
    second.refresh_from_db()
    assert (job.state, second.state) == (JobState.CANCELLED, "cancelled")
    _until(lambda: not ray_processes(driver, second.workload_id),
           "the cancelled attempt's Ray processes to stop", 15)
