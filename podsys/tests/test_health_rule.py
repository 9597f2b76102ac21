"""The health rule on the fake driver: a confirmed fatal failure cordons a node and says so (the
jobs it moves are aistation's: aistation/tests/test_evictions.py); a flaky one does not;
warnings never cordon; errors count for nothing; a node the checks cordoned returns when it
passes, an operator's cordon stays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.core.exceptions import ValidationError
from django.utils import timezone

from infra_os.models import AuditEvent
from podsys.choices import CheckSeverity, CheckState, CheckTrigger, CordonSource
from podsys.drivers.base import DriverError
from podsys.drivers.fake import FakeDriver
from podsys.models import HealthCheckRun, Node
from podsys.services.clusters import cluster_sync_nodes, node_set_schedulable
from podsys.services.health import health_check_run_now, health_checks_tick
from podsys.signals import node_out_of_service

CHECKS = {
    "gpu-presence": "podsys.health.checks.GpuPresence",
    "power-slowdown": "podsys.health.checks.PowerSlowdown",
}


@pytest.fixture
def health(farm, settings, monkeypatch, django_capture_on_commit_callbacks):
    """The farm with two checks (one fatal, one warning); `health.tick()` runs one pass, on a
    clock a second (or `seconds`) later, with its after-commit work done; `health.signals`
    records what `node_out_of_service` carried."""
    settings.OGAI_HEALTH_CHECKS = CHECKS
    settings.OGAI_HEALTH_CORDON_AFTER = 2
    settings.OGAI_HEALTH_RETURN_AFTER = 1
    signals = []

    def record(sender, **kwargs):
        signals.append((kwargs["node_id"], kwargs["reason"]))

    node_out_of_service.connect(record)
    monkeypatch.setattr("podsys.services.health._enqueue_tick", lambda cluster_id: None)
    clock = {"now": timezone.now()}

    def tick(seconds: float = 1):
        clock["now"] += timedelta(seconds=seconds)
        with django_capture_on_commit_callbacks(execute=True):
            return health_checks_tick(now=clock["now"])

    def node(name: str) -> Node:
        return Node.objects.get(cluster=farm.cluster, name=name)

    farm.tick, farm.node, farm.signals = tick, node, signals
    yield farm
    node_out_of_service.disconnect(record)


def runs(node: Node, check: str = "gpu-presence") -> list[str]:
    """The node's runs of a check, oldest first, as states."""
    return list(HealthCheckRun.objects.filter(node=node, check_name=check)
                .order_by("created_at", "id").values_list("state", flat=True))


def test_healthy_nodes_pass_every_check_and_stay_in_service(health):
    first = health.tick()
    assert first["started"] == 4  # 2 checks x 2 nodes
    second = health.tick()
    assert second["finished"] == 4
    for name in ("fake-node-000", "fake-node-001"):
        node = health.node(name)
        assert runs(node) == [CheckState.PASSED]
        assert runs(node, "power-slowdown") == [CheckState.PASSED]
        assert node.schedulable and node.cordon_source == CordonSource.NONE
    latest = HealthCheckRun.objects.filter(check_name="gpu-presence").first()
    assert latest.summary == "all 8 GPUs present (H100)"
    assert latest.details["found"] == 8
    # Nothing is due again before the interval.
    assert health.tick()["started"] == 0


def test_a_confirmed_fatal_failure_takes_the_node_out_of_service(health):
    bad = "fake-node-001"
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found", {"found": 7})

    health.tick()
    health.tick()  # the failure is seen: a confirmation run starts at once
    node = health.node(bad)
    assert runs(node) == [CheckState.FAILED, CheckState.RUNNING]
    assert node.schedulable, "one failure is not enough"
    assert not health.signals
    health.tick()  # the confirmation fails too

    node = health.node(bad)
    assert runs(node) == [CheckState.FAILED, CheckState.FAILED]
    assert not node.schedulable
    assert node.cordon_source == CordonSource.HEALTH_CHECK
    assert node.health_reason == "failed health check gpu-presence: 7 of 8 GPUs found"
    assert node.labels["ogai.io/health-gpu-presence"] == "failed"
    assert HealthCheckRun.objects.filter(node=node, check_name="gpu-presence").first() \
        .details == {"found": 7}
    assert AuditEvent.objects.filter(action="node.cordon", actor_name="system",
                                     object_id=str(node.pk)).exists()
    assert health.signals == [
        (node.pk, "it failed health check gpu-presence (7 of 8 GPUs found)")]
    assert health.node("fake-node-000").schedulable
    # Failing on, it is not cordoned again, and nothing is sent twice.
    health.tick(301)
    health.tick()
    assert runs(health.node(bad))[-1] == CheckState.FAILED
    assert len(health.signals) == 1


def test_the_node_returns_to_service_when_the_check_passes_again(health):
    bad = "fake-node-001"
    health.fake.inject_fault(bad, "gpu-presence", "GPU 3: Unknown Error")
    for _ in range(3):
        health.tick()
    assert not health.node(bad).schedulable

    health.fake.clear_fault(bad)
    health.tick(301)  # the interval has passed
    health.tick()
    node = health.node(bad)
    assert runs(node)[-1] == CheckState.PASSED
    assert node.schedulable
    assert node.cordon_source == CordonSource.NONE
    assert node.health_reason == ""
    assert "ogai.io/health-gpu-presence" not in node.labels
    assert AuditEvent.objects.filter(action="node.uncordon", actor_name="system").exists()


def test_a_flaky_check_that_fails_once_then_passes_never_cordons(health):
    node = "fake-node-000"
    health.fake.inject_fault(node, "gpu-presence", "flaky")
    health.tick()  # launched: its probe finds the fault
    health.fake.clear_fault(node, "gpu-presence")
    health.tick()  # failed; the confirmation run passes
    health.tick()
    found = health.node(node)
    assert runs(found) == [CheckState.FAILED, CheckState.PASSED]
    assert found.schedulable
    assert "ogai.io/health-gpu-presence" not in found.labels
    assert not health.signals


def test_a_warning_check_never_cordons_but_labels_the_node(health):
    node = "fake-node-000"
    health.fake.inject_fault(node, "power-slowdown", "GPU 2: power brake")
    for seconds in (1, 1, 301, 1, 301, 1):
        health.tick(seconds)
    found = health.node(node)
    assert runs(found, "power-slowdown") == [CheckState.FAILED] * 3
    assert found.schedulable
    assert found.labels["ogai.io/health-power-slowdown"] == "failed"
    health.fake.clear_fault(node)
    health.tick(301)
    health.tick()
    assert "ogai.io/health-power-slowdown" not in health.node(node).labels


def test_an_operator_cordon_is_never_lifted_by_passing_checks(health):
    node = health.node("fake-node-000")
    node_set_schedulable(actor=health.world.operator, node=node, schedulable=False,
                         reason="maintenance")
    node.refresh_from_db()
    assert node.cordon_source == CordonSource.OPERATOR
    for _ in range(2):
        health.tick()
    node.refresh_from_db()
    assert runs(node) == [CheckState.PASSED]
    assert not node.schedulable
    assert node.health_reason == "maintenance"
    # And a fatal failure there keeps the operator's cordon as it is.
    health.fake.inject_fault(node.name, "gpu-presence", "0 of 8 GPUs found")
    for seconds in (301, 1, 1):
        health.tick(seconds)
    node.refresh_from_db()
    assert node.cordon_source == CordonSource.OPERATOR
    assert node.labels["ogai.io/health-gpu-presence"] == "failed"
    health.fake.clear_fault(node.name)
    for seconds in (301, 1):
        health.tick(seconds)
    node.refresh_from_db()
    assert not node.schedulable and node.cordon_source == CordonSource.OPERATOR
    # The operator uncordons: the node is theirs again.
    node_set_schedulable(actor=health.world.operator, node=node, schedulable=True)
    node.refresh_from_db()
    assert node.schedulable and node.cordon_source == CordonSource.NONE


def test_errors_count_neither_for_nor_against_a_node(health):
    node = "fake-node-000"
    health.fake.inject_fault(node, "gpu-presence", "0 of 8 GPUs found")
    health.tick()
    health.fake.inject_fault(node, "gpu-presence", hang=True)  # the confirmation hangs
    health.tick()
    health.tick(121)  # past gpu-presence's timeout: cancelled, an error
    found = health.node(node)
    assert runs(found) == [CheckState.FAILED, CheckState.ERROR]
    error = HealthCheckRun.objects.filter(node=found, state=CheckState.ERROR).get()
    assert error.summary == "timed out after 120 s"
    assert found.schedulable, "an error is not a second failure"
    # The next scheduled run fails: with the error skipped, that is two failures in a row.
    health.fake.inject_fault(node, "gpu-presence", "0 of 8 GPUs found")
    health.tick(301)
    health.tick()
    found = health.node(node)
    assert runs(found) == [CheckState.FAILED, CheckState.ERROR, CheckState.FAILED]
    assert not found.schedulable


def test_a_launch_the_driver_refuses_is_an_error(health):
    health.fake.lose_node("fake-node-001")  # not synced yet: the platform still tries
    health.tick()
    node = health.node("fake-node-001")
    assert runs(node) == [CheckState.ERROR]
    run = HealthCheckRun.objects.get(node=node, check_name="gpu-presence")
    assert run.summary == "could not start: node fake-node-001 is not ready"
    assert node.schedulable


def test_nodes_not_ready_or_lost_are_not_checked(health):
    health.fake.lose_node("fake-node-001")
    cluster_sync_nodes(cluster=health.cluster)
    assert health.node("fake-node-001").health == "not_ready"
    health.tick()
    assert not HealthCheckRun.objects.filter(node__name="fake-node-001").exists()
    assert HealthCheckRun.objects.filter(node__name="fake-node-000").count() == 2


def test_a_node_sync_keeps_the_checks_labels_and_the_cordon_reason(health):
    bad = "fake-node-000"
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found")
    for _ in range(3):
        health.tick()
    cluster_sync_nodes(cluster=health.cluster)
    node = health.node(bad)
    assert node.labels["ogai.io/health-gpu-presence"] == "failed"
    assert node.health_reason == "failed health check gpu-presence: 7 of 8 GPUs found"
    assert not node.schedulable


def test_an_exclusive_check_waits_while_the_node_is_busy(health, settings):
    settings.OGAI_HEALTH_CHECKS = {"pcie-bandwidth": "podsys.health.checks.PcieBandwidth"}
    # GPUs held by anything, as the cluster reports them (jobs count the same way).
    Node.objects.filter(name="fake-node-000").update(gpus_in_use=6)
    health.tick()
    waiting = HealthCheckRun.objects.get(node__name="fake-node-000")
    assert waiting.state == CheckState.PENDING
    assert waiting.summary == "deferred: node busy (6 GPUs in use)"
    assert runs(health.node("fake-node-001"), "pcie-bandwidth") == [CheckState.RUNNING]
    health.tick()
    waiting.refresh_from_db()
    assert waiting.state == CheckState.PENDING

    Node.objects.filter(name="fake-node-000").update(gpus_in_use=0)
    health.tick()  # starts now
    health.tick()
    assert runs(health.node("fake-node-000"), "pcie-bandwidth") == [CheckState.PASSED]


def test_a_node_under_an_exclusive_check_takes_no_job_until_it_ends(health, settings):
    settings.OGAI_HEALTH_CHECKS = {"pcie-bandwidth": "podsys.health.checks.PcieBandwidth"}
    first = health.submit(gpus=8)
    health.cycle()
    first.refresh_from_db()
    (busy,) = first.placement  # its check waits; the other node's starts
    checked = ({"fake-node-000", "fake-node-001"} - {busy}).pop()
    health.fake.inject_fault(checked, "pcie-bandwidth", hang=True)  # still measuring
    health.tick()
    node = health.node(checked)
    assert runs(node, "pcie-bandwidth") == [CheckState.RUNNING]
    assert not node.schedulable and node.cordon_source == CordonSource.CHECK_RUNNING

    second = health.submit(gpus=8)
    health.cycle()
    second.refresh_from_db()
    assert second.state == "queued", "the check holds every GPU of the only free node"

    health.fake.clear_fault(checked)
    health.fake.crash(HealthCheckRun.objects.get(node=node).workload_id, exit_code=0)
    health.tick()
    node.refresh_from_db()
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    health.cycle()
    second.refresh_from_db()
    assert second.placement == [checked]


def test_an_all_reduce_check_runs_as_one_workload_over_free_nodes(health, settings):
    settings.OGAI_HEALTH_CHECKS = {"nccl-allreduce": "podsys.health.checks.NcclAllReduce"}
    Node.objects.filter(name="fake-node-000").update(gpus_in_use=8)
    health.tick()
    alone = HealthCheckRun.objects.get(node__name="fake-node-001")
    assert alone.state == CheckState.PENDING
    assert alone.summary == "deferred: waiting for another free node"

    Node.objects.filter(name="fake-node-000").update(gpus_in_use=0)
    health.tick()
    health.tick()
    gang = HealthCheckRun.objects.all()
    assert sorted(gang.values_list("state", flat=True)) == [CheckState.PASSED] * 2
    assert len(set(gang.values_list("workload_id", flat=True))) == 1
    assert gang[0].summary.startswith("all-reduce bus bandwidth")


def test_an_operator_runs_a_check_now(health):
    node = health.node("fake-node-000")
    health.tick()
    health.tick()
    # Within the interval nothing is due, but an operator may ask.
    started = health_check_run_now(actor=health.world.operator, node=node,
                                   check_name="gpu-presence")
    assert [run.trigger for run in started] == [CheckTrigger.MANUAL]
    again = health_check_run_now(actor=health.world.operator, node=node)
    assert {run.check_name for run in again} == set(CHECKS)
    assert started[0] in again, "a check already waiting is not started twice"
    health.tick()
    health.tick()
    assert runs(node) == [CheckState.PASSED, CheckState.PASSED]


def test_a_failure_judged_after_a_later_run_passed_does_not_cordon(health):
    bad = "fake-node-001"
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found")
    health.tick()  # launched: its probe finds the fault, not judged yet
    node = health.node(bad)
    for _ in range(2):  # meanwhile, later runs passed there
        HealthCheckRun.objects.create(node=node, check_name="gpu-presence",
                                      severity=CheckSeverity.FATAL, trigger=CheckTrigger.MANUAL,
                                      state=CheckState.PASSED, summary="all 8 GPUs present")
    health.tick()
    node = health.node(bad)
    assert runs(node) == [CheckState.FAILED, CheckState.PASSED, CheckState.PASSED]
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    assert not health.signals


def held_message(out: int, total: int) -> str:
    return (f"not cordoned: {out} of {total} nodes are already out of service after health "
            "checks; check the checks or the fleet")


def test_the_fleet_guard_keeps_most_of_a_cluster_in_service(health, caplog):
    health.fake.add_nodes(6)
    cluster_sync_nodes(cluster=health.cluster)  # 8 nodes: the checks may take 2 out
    # An operator's cordon does not count against the checks' share.
    node_set_schedulable(actor=health.world.operator, node=health.node("fake-node-007"),
                         schedulable=False, reason="maintenance")
    bad = ["fake-node-000", "fake-node-001", "fake-node-002"]
    for name in bad:
        health.fake.inject_fault(name, "gpu-presence", "0 of 8 GPUs found")
    for _ in range(3):
        health.tick()

    cordoned = [name for name in bad
                if health.node(name).cordon_source == CordonSource.HEALTH_CHECK]
    assert len(cordoned) == 2
    (held,) = set(bad) - set(cordoned)
    node = health.node(held)
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    assert node.labels["ogai.io/health-gpu-presence"] == "failed"
    message = held_message(2, 8)
    latest = HealthCheckRun.objects.filter(node=node, check_name="gpu-presence").first()
    assert latest.summary == f"0 of 8 GPUs found ({message})"
    event = AuditEvent.objects.get(action="node.cordon_held", object_id=str(node.pk))
    assert event.actor_name == "system"
    assert event.changes["reason"] == f"failed health check gpu-presence: 0 of 8 GPUs found; " \
                                      f"{message}"
    assert any(message in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert sorted(node_id for node_id, _ in health.signals) == sorted(
        health.node(name).pk for name in cordoned), "its work stays"

    # One cordoned node repaired and back: the held node's next failure takes it out.
    health.fake.clear_fault(cordoned[0])
    for seconds in (301, 1, 301, 1):
        health.tick(seconds)
    assert health.node(cordoned[0]).schedulable
    assert health.node(held).cordon_source == CordonSource.HEALTH_CHECK
    assert AuditEvent.objects.filter(action="node.cordon_held").count() == 1, "said once"


def test_a_small_cluster_may_lose_one_node_to_the_checks(health):
    for name in ("fake-node-000", "fake-node-001"):
        health.fake.inject_fault(name, "gpu-presence", "0 of 8 GPUs found")
    for _ in range(3):
        health.tick()
    states = sorted(health.node(name).cordon_source for name in ("fake-node-000",
                                                                 "fake-node-001"))
    assert states == sorted([CordonSource.HEALTH_CHECK, CordonSource.NONE])
    assert HealthCheckRun.objects.filter(
        summary__endswith=f"({held_message(1, 2)})").count() == 1


@pytest.fixture
def exclusive(health, settings):
    settings.OGAI_HEALTH_CHECKS = {"pcie-bandwidth": "podsys.health.checks.PcieBandwidth"}
    return health


def test_a_start_that_breaks_after_the_node_was_held_gives_it_back(exclusive, monkeypatch):
    def interrupted(self, workload):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(FakeDriver, "launch", interrupted)
    with pytest.raises(SoftTimeLimitExceeded):
        exclusive.tick()
    node = exclusive.node("fake-node-000")
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    run = HealthCheckRun.objects.get(node=node)
    assert run.state == CheckState.ERROR
    assert run.summary == "could not start: SoftTimeLimitExceeded: SoftTimeLimitExceeded()"


def test_a_start_that_breaks_before_the_launch_holds_no_node(exclusive, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no facts today")

    monkeypatch.setattr("podsys.services.health.node_facts", broken)
    with pytest.raises(RuntimeError):
        exclusive.tick()
    node = exclusive.node("fake-node-000")
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    assert runs(node, "pcie-bandwidth") == [CheckState.PENDING]
    monkeypatch.undo()
    exclusive.tick()
    exclusive.tick()
    assert runs(exclusive.node("fake-node-000"), "pcie-bandwidth") == [CheckState.PASSED]


def test_each_tick_gives_back_a_node_held_for_a_check_that_no_longer_runs(exclusive):
    exclusive.fake.inject_fault("fake-node-000", "pcie-bandwidth", hang=True)
    Node.objects.filter(name="fake-node-001").update(gpus_in_use=8)  # its check waits
    exclusive.tick()
    assert exclusive.node("fake-node-000").cordon_source == CordonSource.CHECK_RUNNING
    # As a worker killed between holding the node and launching the check leaves it.
    Node.objects.filter(name="fake-node-001").update(schedulable=False,
                                                     cordon_source=CordonSource.CHECK_RUNNING)
    assert exclusive.tick()["released"] == 1
    stale = exclusive.node("fake-node-001")
    assert stale.schedulable and stale.cordon_source == CordonSource.NONE
    running = exclusive.node("fake-node-000")
    assert not running.schedulable and running.cordon_source == CordonSource.CHECK_RUNNING


HELD = "held while health check pcie-bandwidth runs"


def test_a_node_returning_while_an_exclusive_check_runs_there_stays_held(health, settings):
    settings.OGAI_HEALTH_CHECKS = {**CHECKS,
                                   "pcie-bandwidth": "podsys.health.checks.PcieBandwidth"}
    bad = "fake-node-001"
    health.fake.inject_fault(bad, "gpu-presence", "7 of 8 GPUs found")
    health.fake.inject_fault(bad, "pcie-bandwidth", hang=True)  # still measuring throughout
    for _ in range(3):  # fail, confirm, cordon
        health.tick()
    assert health.node(bad).cordon_source == CordonSource.HEALTH_CHECK
    assert runs(health.node(bad), "pcie-bandwidth") == [CheckState.RUNNING]

    health.fake.clear_fault(bad, "gpu-presence")
    health.tick(301)
    health.tick()  # gpu-presence passes again while pcie-bandwidth holds every GPU
    node = health.node(bad)
    assert runs(node)[-1] == CheckState.PASSED
    assert not node.schedulable, "no job may land on the GPUs the check holds"
    assert node.cordon_source == CordonSource.CHECK_RUNNING
    assert node.health_reason == HELD

    pcie = HealthCheckRun.objects.get(node=node, check_name="pcie-bandwidth")
    health.fake.crash(pcie.workload_id, exit_code=0)
    health.tick()
    node = health.node(bad)
    assert node.schedulable and node.cordon_source == CordonSource.NONE
    assert node.health_reason == ""


def test_a_node_held_for_a_check_is_not_uncordoned_but_may_be_cordoned(exclusive):
    operator = exclusive.world.operator
    exclusive.fake.inject_fault("fake-node-000", "pcie-bandwidth", hang=True)
    Node.objects.filter(name="fake-node-001").update(gpus_in_use=8)  # its check waits
    exclusive.tick()
    node = exclusive.node("fake-node-000")
    assert node.cordon_source == CordonSource.CHECK_RUNNING
    assert node.health_reason == HELD

    with pytest.raises(ValidationError) as raised:
        node_set_schedulable(actor=operator, node=node, schedulable=True)
    assert raised.value.message_dict["node"] == [
        "Node fake-node-000 is held while health check pcie-bandwidth runs; it returns by "
        "itself when the check ends."]
    assert exclusive.node("fake-node-000").cordon_source == CordonSource.CHECK_RUNNING

    # The operator's cordon wins over the hold ...
    node_set_schedulable(actor=operator, node=node, schedulable=False, reason="maintenance")
    node = exclusive.node("fake-node-000")
    assert (node.schedulable, node.cordon_source, node.health_reason) == (
        False, CordonSource.OPERATOR, "maintenance")
    # ... and lifting it while the check still runs leaves the node held until the check ends.
    node_set_schedulable(actor=operator, node=node, schedulable=True)
    node = exclusive.node("fake-node-000")
    assert (node.schedulable, node.cordon_source, node.health_reason) == (
        False, CordonSource.CHECK_RUNNING, HELD)

    node_set_schedulable(actor=operator, node=node, schedulable=False, reason="maintenance")
    run = HealthCheckRun.objects.get(node=node)
    exclusive.fake.crash(run.workload_id, exit_code=0)
    exclusive.tick()  # the check ends: the operator's cordon stays
    node = exclusive.node("fake-node-000")
    assert (node.schedulable, node.cordon_source, node.health_reason) == (
        False, CordonSource.OPERATOR, "maintenance")
    node_set_schedulable(actor=operator, node=node, schedulable=True)
    assert exclusive.node("fake-node-000").schedulable


def test_checks_end_past_their_timeout_when_the_cluster_cannot_be_asked(exclusive, monkeypatch,
                                                                          caplog):
    exclusive.fake.inject_fault("fake-node-000", "pcie-bandwidth", hang=True)
    Node.objects.filter(name="fake-node-001").update(gpus_in_use=8)  # its check waits
    exclusive.tick()
    assert exclusive.node("fake-node-000").cordon_source == CordonSource.CHECK_RUNNING

    def unreachable(self, handles):
        raise DriverError("connection refused")

    monkeypatch.setattr(FakeDriver, "status", unreachable)
    exclusive.tick(300)  # within its 600 s: it may still answer
    run = HealthCheckRun.objects.get(node__name="fake-node-000")
    assert run.state == CheckState.RUNNING
    exclusive.tick(600)
    run.refresh_from_db()
    assert run.state == CheckState.ERROR
    assert run.summary.startswith("could not ask the cluster: connection refused")
    node = exclusive.node("fake-node-000")
    assert node.schedulable and node.cordon_source == CordonSource.NONE


def test_a_tick_without_a_driver_still_gives_back_held_nodes(exclusive, monkeypatch):
    exclusive.fake.inject_fault("fake-node-000", "pcie-bandwidth", hang=True)
    Node.objects.filter(name="fake-node-001").update(gpus_in_use=8)
    exclusive.tick()
    # As a worker killed between holding the node and launching the check leaves it.
    Node.objects.filter(name="fake-node-001").update(
        schedulable=False, cordon_source=CordonSource.CHECK_RUNNING, health_reason=HELD)

    def no_driver(cluster):
        raise DriverError("the fake driver is not installed")

    monkeypatch.setattr("podsys.services.health.driver_for", no_driver)
    assert exclusive.tick()["released"] == 1
    stale = exclusive.node("fake-node-001")
    assert (stale.schedulable, stale.cordon_source, stale.health_reason) == (
        True, CordonSource.NONE, "")
    assert exclusive.node("fake-node-000").cordon_source == CordonSource.CHECK_RUNNING
    exclusive.tick(800)  # the running check ends past its timeout all the same
    run = HealthCheckRun.objects.get(node__name="fake-node-000")
    assert run.state == CheckState.ERROR
    assert run.summary.startswith("could not ask the cluster: the fake driver is not installed")
    assert exclusive.node("fake-node-000").schedulable


def test_a_manual_run_takes_the_cluster_lock_a_scheduled_one_takes(health, monkeypatch):
    from django.db.models.query import QuerySet

    from podsys.models import Cluster

    locked = []
    original = QuerySet.select_for_update

    def spy(self, *args, **kwargs):
        locked.append((self.model, kwargs.get("no_key", False)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(QuerySet, "select_for_update", spy)
    health_check_run_now(actor=health.world.operator, node=health.node("fake-node-000"),
                         check_name="gpu-presence")
    assert locked[:1] == [(Cluster, True)]
