"""Jobs moved off a node taken out of service: stopped there, queued again without losing a
restart, and placed elsewhere by the next cycle."""

from __future__ import annotations

import pytest
from django.db.models.query import QuerySet

from aistation.choices import AttemptState, JobState
from aistation.models import Attempt
from aistation.services.evictions import jobs_move_off_node
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from infra_os.models import UsageRecord
from podsys.choices import CordonSource
from podsys.drivers.fake import FakeDriver, fake_cluster
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_sync_nodes
from podsys.signals import node_out_of_service
from podsys.tests.test_health_rule import health  # noqa: F401 - the fixture

REASON = "it failed health check gpu-presence (7 of 8 GPUs found)"


@pytest.fixture
def cycles(monkeypatch):
    asked = []
    monkeypatch.setattr("aistation.services.evictions.request_cycle", asked.append)
    return asked


def _running(farm, **kwargs):
    job = farm.submit(**kwargs)
    farm.cycle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def _node(farm, name: str) -> Node:
    return Node.objects.get(cluster=farm.cluster, name=name)


def test_a_job_is_moved_off_the_node_as_a_preemption_not_a_failure(farm, cycles):
    job = _running(farm, gpus=4, duration=3600, max_restarts=1)
    node = job.placement[0]
    attempt = job.attempts.get()

    moved = jobs_move_off_node(node_id=_node(farm, node).pk, reason=REASON)

    assert moved == [job.pk]
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.PREEMPTED
    assert attempt.reason == f"moved off {node}: {REASON}"
    assert job.state == JobState.QUEUED
    assert job.restarts == 0, "not counted against the job's restarts"
    assert job.excluded_nodes == [], "the cordon keeps it off the node, and lifts"
    assert job.placement == []
    assert list(job.events.order_by("id").values_list("to_state", "reason"))[-2:] == [
        (JobState.PREEMPTED, f"moved off {node}: {REASON}"),
        (JobState.QUEUED, "back in its queue while the node is out of service"),
    ]
    assert farm.fake.allocated_gpus(node) == 0, "stopped on the cluster"
    assert cycles == [farm.cluster.pk]

    Node.objects.filter(pk=_node(farm, node).pk).update(
        schedulable=False, cordon_source=CordonSource.HEALTH_CHECK)  # as the checks leave it
    farm.cycle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.placement and node not in job.placement


def test_a_gang_with_one_replica_there_stops_whole(farm, cycles):
    gang = _running(farm, gpus=8, replicas=2, duration=3600, name="gang")
    assert sorted(gang.placement) == ["fake-node-000", "fake-node-001"]

    assert jobs_move_off_node(node_id=_node(farm, "fake-node-000").pk, reason=REASON) \
        == [gang.pk]
    gang.refresh_from_db()
    assert gang.state == JobState.QUEUED
    assert farm.fake.allocated_gpus("fake-node-001") == 0, "its other replica stopped too"


def test_jobs_on_other_nodes_stay(farm, cycles):
    first = _running(farm, gpus=8, duration=3600, name="first")
    second = _running(farm, gpus=8, duration=3600, name="second")
    assert first.placement != second.placement

    assert jobs_move_off_node(node_id=_node(farm, first.placement[0]).pk, reason=REASON) \
        == [first.pk]
    second.refresh_from_db()
    assert second.state == JobState.RUNNING
    assert farm.fake.allocated_gpus(second.placement[0]) == 8


def test_nothing_to_move_asks_for_no_cycle(farm, cycles):
    assert jobs_move_off_node(node_id=_node(farm, "fake-node-000").pk, reason=REASON) == []
    assert jobs_move_off_node(node_id=999999, reason=REASON) == []
    assert cycles == []


def test_the_signal_reaches_aistation(farm, cycles):
    job = _running(farm, gpus=8, duration=3600)
    node = _node(farm, job.placement[0])
    node_out_of_service.send(sender=Node, node_id=node.pk, reason=REASON)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_node_failing_a_fatal_check_loses_its_jobs_and_gets_work_again_once_it_passes(
        health, cycles):  # noqa: F811 - the fixture
    job = _running(health, gpus=8, duration=3600)
    bad = job.placement[0]
    good = next(n for n in ("fake-node-000", "fake-node-001") if n != bad)
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found")
    for _ in range(3):  # fail, confirm, cordon
        health.tick()
    node = _node(health, bad)
    assert not node.schedulable and node.cordon_source == CordonSource.HEALTH_CHECK

    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.restarts == 0
    assert job.events.filter(to_state=JobState.PREEMPTED).get().reason == (
        f"moved off {bad}: it failed health check gpu-presence (7 of 8 GPUs found)")
    assert cycles == [health.cluster.pk]
    health.cycle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.placement == [good]
    # The only free GPUs are on the cordoned node: a new job waits rather than land there.
    waiting = health.submit(gpus=1, duration=3600, name="new")
    health.cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED

    health.fake.clear_fault(bad)
    health.tick(301)
    health.tick()
    assert _node(health, bad).schedulable
    health.cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.RUNNING and waiting.placement == [bad]


def test_on_a_one_node_cluster_a_moved_job_runs_again_on_the_node_once_it_is_back(
        health, cycles):  # noqa: F811 - the fixture
    """The node is not excluded from the job for good: its cordon keeps the job off it only
    while it is out of service."""
    solo = Cluster.objects.create(name="solo", driver="fake",
                                  options={"nodes": 1, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=solo)
    queue = queue_create(actor=health.world.operator, tenant=health.world.alpha, name="solo",
                         cluster=solo)
    job = job_submit(actor=health.world.alpha_member, tenant=health.world.alpha, queue=queue,
                     name="solo", command=["python", "train.py"], gpus_per_replica=8,
                     env={"OGAI_FAKE_DURATION_S": "3600"})
    schedule_cluster(cluster_id=solo.pk)
    job.refresh_from_db()
    (node,) = job.placement
    fake = fake_cluster("solo")
    fake.inject_fault(node, "gpu-presence", "7 of 8 GPUs found")
    for _ in range(3):  # fail, confirm, cordon: a one-node cluster may lose its only node
        health.tick()
    assert Node.objects.get(cluster=solo).cordon_source == CordonSource.HEALTH_CHECK
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    schedule_cluster(cluster_id=solo.pk)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED, "nothing runs on the cordoned node"

    fake.clear_fault(node)
    health.tick(301)
    health.tick()
    assert Node.objects.get(cluster=solo).schedulable
    schedule_cluster(cluster_id=solo.pk)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.placement == [node]


def test_a_job_that_already_ended_there_is_left_to_reconcile(farm, cycles):
    done = _running(farm, gpus=4, duration=3600, name="done")
    node = done.placement[0]
    running = _running(farm, gpus=4, duration=3600, name="running")
    assert running.placement == [node]
    farm.fake.crash(done.attempts.get().workload_id, exit_code=0)  # finished, not yet recorded

    assert jobs_move_off_node(node_id=_node(farm, node).pk, reason=REASON) == [running.pk]
    done.refresh_from_db()
    assert done.state == JobState.RUNNING, "not preempted: it would run again"
    reconcile_cluster(cluster=farm.cluster)
    done.refresh_from_db()
    assert done.state == JobState.SUCCEEDED
    assert not done.events.filter(to_state=JobState.PREEMPTED).exists()


def test_an_attempt_a_cycle_preempted_meanwhile_is_not_moved_again(farm, cycles, monkeypatch):
    job = _running(farm, gpus=8, duration=3600)
    attempt = job.attempts.get()
    locked = []
    select_for_update = QuerySet.select_for_update
    status = FakeDriver.status

    def spy(self, *args, **kwargs):
        locked.append((self.model, kwargs.get("no_key", False)))
        return select_for_update(self, *args, **kwargs)

    def cycle_meanwhile(self, handles):
        # A scheduling cycle preempts the job between the look at the cluster and the move.
        Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.PREEMPTED)
        return status(self, handles)

    monkeypatch.setattr(QuerySet, "select_for_update", spy)
    monkeypatch.setattr(FakeDriver, "status", cycle_meanwhile)
    assert jobs_move_off_node(node_id=_node(farm, job.placement[0]).pk, reason=REASON) == []
    assert not job.events.filter(to_state=JobState.PREEMPTED).exists()
    assert not UsageRecord.objects.filter(source=f"job {job.pk} attempt 1").exists()
    # The cluster row is locked first, as a scheduling cycle locks it.
    assert locked[:1] == [(Cluster, True)]


def test_a_move_that_failed_is_tried_again_at_the_next_tick(
        health, cycles, monkeypatch, caplog):  # noqa: F811 - the fixture
    job = _running(health, gpus=8, duration=3600)
    bad = job.placement[0]
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found")

    broken = {"now": True}
    move = jobs_move_off_node

    def sometimes_broken(**kwargs):
        if broken["now"]:
            raise RuntimeError("the database went away")
        return move(**kwargs)

    monkeypatch.setattr("aistation.services.evictions.jobs_move_off_node", sometimes_broken)
    for _ in range(3):  # fail, confirm, cordon: the receiver fails, the tick goes on
        health.tick()
    assert _node(health, bad).cordon_source == CordonSource.HEALTH_CHECK
    assert any("the database went away" in r.getMessage() for r in caplog.records
               if r.levelname == "ERROR")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    broken["now"] = False
    health.tick()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.events.filter(to_state=JobState.PREEMPTED).get().reason == (
        f"moved off {bad}: it failed health check gpu-presence (7 of 8 GPUs found)")
    assert len(health.signals) == 2, "sent again once"
    health.tick()  # nothing left there: nothing more is sent
    assert len(health.signals) == 2
