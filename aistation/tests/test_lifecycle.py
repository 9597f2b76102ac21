"""The job lifecycle on the fake driver: scheduling cycles and reconcile run in-process."""

import time

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from aistation.choices import ACTIVE_STATES, JobState
from aistation.models import Attempt, Job
from aistation.services import scheduling
from aistation.services.jobs import job_cancel
from aistation.services.reconcile import reconcile_cluster
from aistation.tasks import cancel_job
from infra_os.models import Quota, UsageRecord
from podsys.services.clusters import cluster_sync_nodes


def cycle(farm):
    return scheduling.schedule_cluster(cluster_id=farm.cluster.pk)


def reconcile(farm):
    return reconcile_cluster(cluster=farm.cluster)


def refresh(*jobs):
    for job in jobs:
        job.refresh_from_db()
    return jobs


def states(job):
    return [event.to_state for event in job.events.order_by("created_at", "id")]


def test_a_job_runs_to_success_and_its_usage_is_recorded(farm):
    job = farm.submit(gpus=2, duration=10)
    cycle(farm)
    refresh(job)
    assert job.state == JobState.RUNNING
    assert len(job.placement) == 1
    farm.fake.advance(11)
    reconcile(farm)
    refresh(job)
    assert job.state == JobState.SUCCEEDED
    assert states(job) == ["queued", "admitted", "running", "succeeded"]
    usage = UsageRecord.objects.get(source=f"job {job.pk} attempt 1")
    assert usage.tenant.name == "alpha"
    assert usage.gpus == 2
    assert usage.gpu_model == "H100"


def test_a_failing_job_is_retried_then_fails_with_its_exit_code(farm):
    job = farm.submit(exit_code=3, duration=1, max_restarts=2)
    for _ in range(3):
        cycle(farm)
        farm.fake.advance(2)
        reconcile(farm)
    refresh(job)
    assert job.state == JobState.FAILED
    assert job.restarts == 2
    assert "exit code 3" in job.reason
    assert "after 2 restarts" in job.reason
    assert job.attempts.count() == 3
    assert states(job).count("restarting") == 2


def test_retries_back_off(farm, settings):
    settings.OGAI_RETRY_BACKOFF_S = 60
    job = farm.submit(exit_code=1, duration=1, max_restarts=1)
    cycle(farm)
    farm.fake.advance(2)
    reconcile(farm)
    cycle(farm)
    refresh(job)
    assert job.state == JobState.QUEUED
    assert "backoff" in job.reason
    Job.objects.filter(pk=job.pk).update(not_before=timezone.now())
    cycle(farm)
    refresh(job)
    assert job.state == JobState.RUNNING


def test_quota_is_never_exceeded_by_own_work(farm):
    jobs = [farm.submit(gpus=4) for _ in range(6)]
    cycle(farm)
    refresh(*jobs)
    own = sum(j.gpus for j in jobs if j.state in ACTIVE_STATES and not j.borrowed)
    borrowed = [j for j in jobs if j.borrowed]
    assert own == 8
    # The idle half of the cluster is lent, and says so.
    assert sum(j.gpus for j in borrowed) == 8
    waiting = [j for j in jobs if j.state == JobState.QUEUED]
    assert len(waiting) == 2
    assert all(j.reason.startswith("waiting") for j in waiting)
    assert sorted(j.position for j in waiting) == [1, 2]


def test_borrowed_capacity_is_reclaimed_when_its_owner_submits(farm):
    mine = [farm.submit(gpus=8), farm.submit(gpus=8)]
    cycle(farm)
    refresh(*mine)
    assert [j.borrowed for j in mine].count(True) == 1
    theirs = farm.submit("beta", gpus=8)
    cycle(farm)
    refresh(theirs, *mine)
    assert theirs.state == JobState.RUNNING
    lender = next(j for j in mine if j.state == JobState.QUEUED)
    assert "reclaimed" in lender.events.get(to_state=JobState.PREEMPTED).reason


def test_a_high_priority_job_preempts_a_lower_one_of_its_tenant(farm):
    low = farm.submit(gpus=8, priority=0)
    other = farm.submit("beta", gpus=8)
    cycle(farm)
    high = farm.submit(gpus=8, priority=10)
    cycle(farm)
    refresh(low, high, other)
    assert high.state == JobState.RUNNING
    assert other.state == JobState.RUNNING
    assert low.state == JobState.QUEUED
    event = low.events.get(to_state=JobState.PREEMPTED)
    assert f"preempted by job {high.pk}" in event.reason
    assert Attempt.objects.get(job=low).state == "preempted"


def test_a_gang_never_starts_partially(farm):
    blocker = farm.submit(gpus=4, duration=100)
    cycle(farm)
    gang = farm.submit(gpus=8, replicas=2)
    cycle(farm)
    refresh(gang)
    assert gang.state == JobState.QUEUED
    assert gang.attempts.count() == 0
    assert gang.reason.startswith("waiting")
    farm.fake.advance(101)
    reconcile(farm)
    cycle(farm)
    refresh(gang, blocker)
    assert gang.state == JobState.RUNNING
    assert sorted(gang.placement) == sorted(set(gang.placement))


def test_a_lost_nodes_attempt_is_restarted_elsewhere(farm):
    job = farm.submit(gpus=1, max_restarts=1)
    cycle(farm)
    refresh(job)
    lost = job.placement[0]
    farm.fake.lose_node(lost)
    reconcile(farm)
    refresh(job)
    assert job.state == JobState.QUEUED
    assert job.excluded_nodes == [lost]
    cycle(farm)
    refresh(job)
    assert job.state == JobState.RUNNING
    assert job.placement[0] != lost


def test_a_worker_lost_between_decision_and_launch_loses_and_duplicates_nothing(
    farm, monkeypatch, settings
):
    monkeypatch.setattr(scheduling, "attempts_launch", lambda cluster, attempts: None)
    job = farm.submit(gpus=2)
    cycle(farm)
    refresh(job)
    assert job.state == JobState.ADMITTED
    assert farm.fake.allocated_gpus(job.placement[0]) == 0
    settings.OGAI_LAUNCH_GRACE_S = 0
    reconcile(farm)
    reconcile(farm)
    refresh(job)
    assert job.state == JobState.RUNNING
    assert job.attempts.count() == 1
    assert farm.fake.allocated_gpus(job.placement[0]) == 2


def test_a_job_past_its_time_limit_is_stopped_with_a_reason(farm):
    job = farm.submit(gpus=1, time_limit_s=60, max_restarts=3)
    cycle(farm)
    Attempt.objects.filter(job=job).update(
        started_at=timezone.now() - timezone.timedelta(seconds=61))
    reconcile(farm)
    refresh(job)
    assert job.state == JobState.FAILED
    assert "time limit of 60 s" in job.reason
    assert job.attempts.count() == 1
    assert farm.fake.allocated_gpus(job.placement[0] if job.placement else "fake-node-000") == 0


def test_cancel_stops_the_workload(farm):
    job = farm.submit(gpus=2)
    cycle(farm)
    refresh(job)
    node = job.placement[0]
    job_cancel(actor=job.owner, job=job)
    cancel_job(job_id=job.pk)
    refresh(job)
    assert job.state == JobState.CANCELLED
    assert job.attempts.get().state == "cancelled"
    assert farm.fake.allocated_gpus(node) == 0


def test_a_job_that_can_never_fit_fails_with_the_reason(farm):
    job = farm.submit(gpus=8, replicas=2)
    farm.cluster.nodes.filter(name="fake-node-001").delete()
    cycle(farm)
    refresh(job)
    assert job.state == JobState.FAILED
    assert job.reason.startswith("can never run")


@pytest.mark.parametrize("starvation", [60])
def test_a_large_job_gets_nodes_reserved_after_the_starvation_bound(farm, settings, starvation):
    settings.OGAI_SCHEDULER_STARVATION_S = starvation
    Quota.objects.filter(tenant__name="alpha").update(gpus=16)
    farm.submit("beta", gpus=1, duration=30)
    cycle(farm)
    large = farm.submit(gpus=8, replicas=2)
    Job.objects.filter(pk=large.pk).update(
        queued_at=timezone.now() - timezone.timedelta(seconds=starvation + 1))
    later = [farm.submit("beta", gpus=1) for _ in range(3)]
    cycle(farm)
    refresh(large, *later)
    assert large.state == JobState.QUEUED
    assert "reserved" in large.reason or any("reserved" in j.reason for j in later)
    assert all(j.state == JobState.QUEUED for j in later)
    farm.fake.advance(31)
    reconcile(farm)
    cycle(farm)
    refresh(large)
    assert large.state == JobState.RUNNING


def test_a_preempted_workload_whose_stop_was_lost_is_stopped_by_reconcile(farm, monkeypatch):
    low = farm.submit(gpus=8, priority=0)
    farm.submit("beta", gpus=8)
    cycle(farm)
    refresh(low)
    node = low.placement[0]
    # The worker dies after deciding the preemption, before stopping the workload.
    monkeypatch.setattr(scheduling, "attempts_stop", lambda cluster, attempts: None)
    monkeypatch.setattr(scheduling, "attempts_launch", lambda cluster, attempts: None)
    farm.submit(gpus=8, priority=10)
    cycle(farm)
    assert farm.fake.allocated_gpus(node) == 8  # still held by the preempted workload
    reconcile(farm)
    assert farm.fake.allocated_gpus(node) == 0
    refresh(low)
    assert low.state == JobState.QUEUED


def test_a_failed_attempt_is_retried_on_another_node(farm):
    job = farm.submit(gpus=1, exit_code=2, duration=1, max_restarts=1)
    cycle(farm)
    refresh(job)
    first = job.placement[0]
    farm.fake.advance(2)
    reconcile(farm)
    refresh(job)
    assert job.excluded_nodes == [first]
    cycle(farm)
    refresh(job)
    assert job.state == JobState.RUNNING
    assert job.placement[0] != first


def test_a_cycle_asked_for_before_another_cycle_looked_is_skipped(farm):
    asked_at = time.time()
    job = farm.submit(gpus=1)
    assert cycle(farm).started == [job.pk]
    later = farm.submit(gpus=1)
    # Its request was made before the cycle above looked: that cycle saw everything it could.
    skipped = scheduling.schedule_cluster(cluster_id=farm.cluster.pk, requested_at=asked_at)
    assert skipped.skipped and skipped.started == []
    refresh(later)
    assert later.state == JobState.QUEUED
    # A request made after that cycle runs and starts the later job.
    ran = scheduling.schedule_cluster(cluster_id=farm.cluster.pk, requested_at=time.time())
    assert not ran.skipped and ran.started == [later.pk]


def test_a_job_too_big_for_the_cluster_fits_once_a_node_sync_brings_bigger_nodes(farm):
    with pytest.raises(ValidationError) as refused:
        farm.submit(gpus=16)
    assert "largest node of cluster farm has 8" in str(refused.value)
    farm.fake.add_nodes(1, gpus=16, gpu_model="H200")
    cluster_sync_nodes(cluster=farm.cluster)
    farm.queues["alpha"].cluster.refresh_from_db()
    Quota.objects.filter(tenant__name="alpha").update(gpus=16)
    job = farm.submit(gpus=16, gpu_model="H200")
    assert cycle(farm).started == [job.pk]
    assert farm.cluster.capacity["gpu_models"]["H200"] == {
        "nodes": 1, "gpus": 16, "largest_gpus": 16,
        "cpu_cores": farm.fake.options["cpu_cores"], "memory_mib": farm.fake.options["memory_mib"],
        "rdma": 0, "largest_rdma": 0}
