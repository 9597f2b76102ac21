"""The platform stopping stops the work it runs on this machine: each job's attempt ends as
stopped by the platform, the job queues again and runs when the platform starts again."""

import sys
import time

import pytest

from aistation.choices import AttemptState, JobState
from aistation.services.jobs import job_submit
from aistation.services.platform_stop import PLATFORM_STOPPED, local_work_stop
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes
from tests.processes import job_processes

pytestmark = pytest.mark.django_db(transaction=True)

# A job that starts a child of its own and would run for ten minutes.
LONG = ("import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('working', flush=True)\n"
        "time.sleep(600)\n")


@pytest.fixture(autouse=True)
def no_cycle_tasks(monkeypatch):
    # Cycles are run by hand here; no worker takes the tasks they would enqueue.
    for path in ("aistation.services.jobs.request_cycle",
                 "aistation.services.attempts.request_cycle_after"):
        monkeypatch.setattr(path, lambda *args, **kwargs: None, raising=False)


def _wait(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def fake_queue(world):
    cluster = Cluster.objects.create(name="farm", driver="fake",
                                     options={"nodes": 1, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    return queue_create(actor=world.operator, tenant=world.beta, name="default", cluster=cluster)


def test_stopping_ends_local_processes_and_queues_the_jobs_again(world, local_queue,
                                                                  fake_queue):
    local = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=local_queue,
                       name="long", command=[sys.executable, "-c", LONG],
                       memory_mib_per_replica=128)
    elsewhere = job_submit(actor=world.beta_member, tenant=world.beta, queue=fake_queue,
                           name="elsewhere", command=["train"])
    schedule_cluster(cluster_id=local_queue.cluster_id)
    schedule_cluster(cluster_id=fake_queue.cluster_id)
    _wait(lambda: len(job_processes(local.pk)) >= 2)
    local.refresh_from_db()
    assert local.state == JobState.RUNNING

    started = time.monotonic()
    assert local_work_stop(reason=PLATFORM_STOPPED) == [local.pk]
    assert time.monotonic() - started < 15, "one grace, then killed"

    assert job_processes(local.pk) == []
    local.refresh_from_db()
    assert local.state == JobState.QUEUED
    assert local.reason == PLATFORM_STOPPED
    assert local.restarts == 0, "not a failure"
    attempt = local.attempts.get()
    assert (attempt.state, attempt.reason) == (AttemptState.PREEMPTED, PLATFORM_STOPPED)
    elsewhere.refresh_from_db()
    assert elsewhere.state == JobState.RUNNING, "a cluster elsewhere runs on without us"
    assert local_work_stop() == [], "nothing left to stop"

    # The platform starts again: reconcile finds nothing to repair, the cycle starts it again.
    reconcile_cluster(cluster=local_queue.cluster)
    schedule_cluster(cluster_id=local_queue.cluster_id)
    _wait(lambda: len(job_processes(local.pk)) >= 2)
    local.refresh_from_db()
    assert local.state == JobState.RUNNING
    assert local.attempts.count() == 2
    local_work_stop()
    assert job_processes(local.pk) == []
