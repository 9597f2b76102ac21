"""The fair policy in the platform: a job that has had more service yields to a new one of its
tenant after its minimum run, goes back to its queue with its progress, and is promoted once it
has waited long enough in all. Fake driver; attempts are aged by moving their start back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from aistation.choices import AttemptState, JobState
from aistation.models import Attempt, Job
from aistation.services.jobs import job_cancel
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster


@pytest.fixture
def fair(farm, settings):
    # One GPU-hour drops a level; an attempt runs 10 minutes before it can be preempted.
    settings.OGAI_SCHEDULER_LEVELS_GPU_S = (3600.0,)
    settings.OGAI_SCHEDULER_MIN_RUN_S = 600.0
    settings.OGAI_SCHEDULER_PROMOTE_AFTER_S = 86400.0
    return farm


def running_for(job, seconds: float) -> None:
    Attempt.objects.filter(job=job, state=AttemptState.RUNNING).update(
        started_at=timezone.now() - timedelta(seconds=seconds))


def cycle(farm):
    return schedule_cluster(cluster_id=farm.cluster.pk)


@pytest.fixture(autouse=True)
def beta_holds_the_other_node(fair):
    # Alpha's new jobs cannot borrow around the question: the other node is beta's.
    fair.submit("beta", gpus=8)
    cycle(fair)


def test_a_job_past_a_level_yields_to_a_new_job_of_its_tenant_after_its_minimum_run(fair):
    long = fair.submit(gpus=8)  # alpha's whole quota
    cycle(fair)
    running_for(long, 300)  # 2,400 GPU-seconds: still the top level
    new = fair.submit(gpus=8)
    cycle(fair)
    new.refresh_from_db()
    assert new.state == JobState.QUEUED

    running_for(long, 500)  # 4,000 GPU-seconds: a level down, but not 600 s of run yet
    cycle(fair)
    new.refresh_from_db()
    assert new.state == JobState.QUEUED

    running_for(long, 650)
    cycle(fair)
    long.refresh_from_db()
    new.refresh_from_db()
    assert new.state == JobState.RUNNING
    assert long.state == JobState.QUEUED
    event = long.events.get(to_state=JobState.PREEMPTED)
    assert event.reason == (f"preempted for job {new.pk}, which has had less service: attained "
                            "1.4 GPU-hours, level 0 → 1")
    # It keeps its service and waits again from now; its checkpoint directory stays.
    assert long.attained_gpu_s == pytest.approx(8 * 650, rel=0.01)
    assert (timezone.now() - long.queued_at).total_seconds() < 60
    assert long.attempts.get().state == AttemptState.PREEMPTED


def test_the_preempted_job_runs_again_and_its_waits_add_up(fair):
    long = fair.submit(gpus=8)
    cycle(fair)
    running_for(long, 650)
    new = fair.submit(gpus=8, duration=5)
    cycle(fair)
    Job.objects.filter(pk=long.pk).update(queued_at=timezone.now() - timedelta(seconds=120))
    fair.fake.advance(6)
    reconcile_cluster(cluster=fair.cluster)
    cycle(fair)
    long.refresh_from_db()
    new.refresh_from_db()
    assert new.state == JobState.SUCCEEDED
    assert long.state == JobState.RUNNING
    assert long.attempts.count() == 2
    assert long.waited_s == pytest.approx(120, abs=5)


def test_a_job_that_has_waited_long_in_all_is_promoted_and_not_preempted_again(fair):
    long = fair.submit(gpus=8)
    cycle(fair)
    Job.objects.filter(pk=long.pk).update(waited_s=86400 + 1)
    running_for(long, 5000)
    new = fair.submit(gpus=8)
    cycle(fair)
    long.refresh_from_db()
    new.refresh_from_db()
    assert long.state == JobState.RUNNING
    assert new.state == JobState.QUEUED


def test_a_deep_backlog_of_its_tenant_defers_promotion(fair, settings):
    settings.OGAI_SCHEDULER_PROMOTE_BACKLOG = 1.5
    settings.OGAI_SCHEDULER_PROMOTE_STRETCH = 1.25
    long = fair.submit(gpus=8)
    cycle(fair)
    Job.objects.filter(pk=long.pk).update(waited_s=86400 + 1)
    running_for(long, 5000)
    # Four jobs of alpha's whole quota wait: 4 quotas' worth, so the bound is 1 day x
    # (1 + 1.25 x 2.5), past the long job's wait; it ranks by its service and yields.
    new = [fair.submit(gpus=8) for _ in range(4)]
    cycle(fair)
    long.refresh_from_db()
    assert long.state == JobState.QUEUED
    assert long.events.get(to_state=JobState.PREEMPTED).reason.startswith(
        f"preempted for job {new[0].pk}, which has had less service")


def test_a_fifo_queue_job_is_never_demoted(fair):
    queue = fair.queues["alpha"]
    queue.policy = "fifo"
    queue.save()
    long = fair.submit(gpus=8)
    cycle(fair)
    running_for(long, 5000)
    new = fair.submit(gpus=8)
    cycle(fair)
    long.refresh_from_db()
    assert long.state == JobState.RUNNING
    job_cancel(actor=fair.world.alpha_member, job=new)
