"""The fake driver: simulated nodes, a clock the test moves, and injected failures."""

from __future__ import annotations

import pytest

from podsys.drivers.base import FEATURE_SERVICES, DriverError, Phase, Resources, Workload
from podsys.drivers.fake import FakeDriver, fake_cluster, reset_fake_clusters


@pytest.fixture(autouse=True)
def _fresh_clusters():
    reset_fake_clusters()
    yield
    reset_fake_clusters()


def make_driver(cluster: str = "fake-test", **options) -> FakeDriver:
    return FakeDriver(cluster=cluster, options=options)


def job(
    id: str,
    *placement: str,
    gpus: int = 1,
    duration: float | None = None,
    exit_code: int | None = None,
    **fields,
) -> Workload:
    env = dict(fields.pop("env", {}))
    if duration is not None:
        env["OGAI_FAKE_DURATION_S"] = str(duration)
    if exit_code is not None:
        env["OGAI_FAKE_EXIT_CODE"] = str(exit_code)
    return Workload(
        id=id,
        command=("python", "train.py"),
        resources=Resources(gpus=gpus),
        replicas=len(placement),
        placement=placement,
        env=env,
        **fields,
    )


def phase(driver: FakeDriver, handle: str) -> Phase:
    return driver.status([handle])[handle].phase


def test_nodes_follow_the_options():
    driver = make_driver(nodes=3, gpus_per_node=4, gpu_model="A100", memory_mib=1000)
    nodes = driver.nodes()
    assert [n.name for n in nodes] == ["fake-node-000", "fake-node-001", "fake-node-002"]
    assert {(n.gpus, n.gpu_model, n.memory_mib, n.ready) for n in nodes} == {
        (4, "A100", 1000, True)
    }
    assert make_driver().nodes()[0].gpus == 4  # the first creator set the cluster's shape


def test_capacity_is_tracked_and_over_allocation_refused():
    driver = make_driver(nodes=2)
    cluster = fake_cluster("fake-test")
    driver.launch(job("big-1", "fake-node-000", gpus=8))
    assert cluster.allocated_gpus("fake-node-000") == 8
    with pytest.raises(DriverError, match="needs 1 GPUs on fake-node-000; 0 of 8 are free"):
        driver.launch(job("small-1", "fake-node-000"))
    assert phase(driver, "small-1") == Phase.MISSING
    driver.launch(job("small-1", "fake-node-001"))
    assert cluster.allocated_gpus("fake-node-001") == 1
    # Two replicas on one node add up.
    with pytest.raises(DriverError, match="needs 10 GPUs"):
        driver.launch(job("pair-1", "fake-node-001", "fake-node-001", gpus=5))


def test_launch_checks_the_placement():
    driver = make_driver(nodes=2)
    cluster = fake_cluster("fake-test")
    with pytest.raises(DriverError, match="one node per replica"):
        driver.launch(Workload(id="w-1", command=("x",), resources=Resources(), replicas=2))
    with pytest.raises(DriverError, match="no node 'fake-node-999'"):
        driver.launch(job("w-1", "fake-node-999"))
    with pytest.raises(DriverError, match="not B200"):
        driver.launch(
            Workload(
                id="w-1",
                command=("x",),
                resources=Resources(gpus=1, gpu_model="B200"),
                placement=("fake-node-000",),
            )
        )
    cluster.cordon("fake-node-001")
    with pytest.raises(DriverError, match="cordoned"):
        driver.launch(job("w-1", "fake-node-001"))
    cluster.uncordon("fake-node-001")
    driver.launch(job("w-1", "fake-node-001"))


def test_the_clock_ends_workloads_with_their_exit_codes():
    driver = make_driver()
    cluster = fake_cluster("fake-test")
    driver.launch(job("ok-1", "fake-node-000", duration=10))
    driver.launch(job("bad-1", "fake-node-001", duration=5, exit_code=2))
    driver.launch(job("forever-1", "fake-node-002"))
    assert phase(driver, "ok-1") == Phase.RUNNING
    cluster.advance(5)
    bad = driver.status(["bad-1"])["bad-1"]
    assert (bad.phase, bad.exit_code, bad.reason) == (Phase.FAILED, 2, "exit code 2")
    cluster.advance(4.9)
    assert phase(driver, "ok-1") == Phase.RUNNING
    assert cluster.allocated_gpus("fake-node-000") == 1
    cluster.advance(0.1)
    ok = driver.status(["ok-1"])["ok-1"]
    assert (ok.phase, ok.exit_code) == (Phase.SUCCEEDED, 0)
    assert cluster.allocated_gpus("fake-node-000") == 0
    cluster.advance(1e6)
    assert phase(driver, "forever-1") == Phase.RUNNING


def test_default_duration_from_options():
    driver = make_driver(default_duration_s=3)
    driver.launch(job("w-1", "fake-node-000"))
    fake_cluster("fake-test").advance(3)
    assert phase(driver, "w-1") == Phase.SUCCEEDED


def test_crash_fails_the_workload_and_the_first_failure_speaks():
    driver = make_driver()
    cluster = fake_cluster("fake-test")
    driver.launch(job("gang-1", "fake-node-000", "fake-node-001", "fake-node-002", gpus=2))
    cluster.advance(1)
    cluster.crash("gang-1", replica=1, exit_code=137)
    cluster.advance(1)
    cluster.crash("gang-1", replica=0, exit_code=1, reason="NCCL timeout")
    result = driver.status(["gang-1"])["gang-1"]
    assert result.phase == Phase.FAILED
    assert (result.exit_code, result.reason) == (137, "exit code 137")
    assert [r.phase for r in result.replicas] == [Phase.FAILED, Phase.FAILED, Phase.RUNNING]
    assert result.replicas[0].reason == "NCCL timeout"
    assert cluster.allocated_gpus("fake-node-001") == 0
    assert cluster.allocated_gpus("fake-node-002") == 2  # still running until cancelled
    with pytest.raises(DriverError):
        cluster.crash("never-launched")


def test_a_lost_node_fails_its_workloads_and_can_come_back():
    driver = make_driver(nodes=2)
    cluster = fake_cluster("fake-test")
    driver.launch(job("on-lost-1", "fake-node-000", "fake-node-001"))
    driver.launch(job("elsewhere-1", "fake-node-001"))
    cluster.lose_node("fake-node-000")
    lost = driver.status(["on-lost-1"])["on-lost-1"]
    assert lost.phase == Phase.FAILED
    assert lost.node_lost == "fake-node-000"
    assert lost.reason == "node fake-node-000 lost"
    assert lost.exit_code is None
    assert phase(driver, "elsewhere-1") == Phase.RUNNING
    node = {n.name: n for n in driver.nodes()}["fake-node-000"]
    assert (node.ready, node.reason) == (False, "node lost")
    with pytest.raises(DriverError, match="not ready"):
        driver.launch(job("w-2", "fake-node-000"))
    cluster.restore_node("fake-node-000")
    assert cluster.allocated_gpus("fake-node-000") == 0
    driver.launch(job("w-2", "fake-node-000", gpus=8))


def test_launch_is_idempotent():
    driver = make_driver()
    cluster = fake_cluster("fake-test")
    assert driver.launch(job("w-1", "fake-node-000", gpus=2)) == "w-1"
    assert driver.launch(job("w-1", "fake-node-000", gpus=2)) == "w-1"
    assert driver.launch(job("w-1", "fake-node-001", gpus=8)) == "w-1"
    assert cluster.allocated_gpus("fake-node-000") == 2
    assert cluster.allocated_gpus("fake-node-001") == 0


def test_cancel_frees_gpus_and_is_idempotent():
    driver = make_driver()
    cluster = fake_cluster("fake-test")
    driver.launch(job("w-1", "fake-node-000", "fake-node-001", gpus=8))
    driver.cancel("w-1")
    assert cluster.allocated_gpus("fake-node-000") == 0
    result = driver.status(["w-1"])["w-1"]
    assert (result.phase, result.reason, result.exit_code) == (Phase.FAILED, "cancelled", -15)
    driver.cancel("w-1")
    driver.cancel("never-launched")
    driver.launch(job("w-2", "fake-node-000", gpus=8))
    driver.launch(job("done-1", "fake-node-002", duration=1))
    cluster.advance(1)
    driver.cancel("done-1")  # finished: nothing changes
    assert phase(driver, "done-1") == Phase.SUCCEEDED


def test_driver_instances_of_one_cluster_share_it():
    first, second = make_driver("shared"), make_driver("shared")
    other = make_driver("other")
    first.launch(job("w-1", "fake-node-000", gpus=8))
    assert phase(second, "w-1") == Phase.RUNNING
    assert phase(other, "w-1") == Phase.MISSING
    with pytest.raises(DriverError):
        second.launch(job("w-2", "fake-node-000"))
    reset_fake_clusters()
    assert phase(first, "w-1") == Phase.MISSING


def test_logs_are_synthetic_lines():
    driver = make_driver()
    cluster = fake_cluster("fake-test")
    cluster.advance(12)
    driver.launch(job("w-1", "fake-node-000", "fake-node-003", duration=3, exit_code=1))
    cluster.append_log("w-1", "step 1 loss 2.5", replica=1)
    assert driver.logs("w-1", replica=1) == (
        "replica 1 started on fake-node-003 at t=12.0\nstep 1 loss 2.5\n"
    )
    cluster.advance(3)
    assert driver.logs("w-1", tail=1) == "replica 0 ended at t=15.0: exit code 1\n"
    with pytest.raises(DriverError):
        driver.logs("never-launched")
    with pytest.raises(DriverError):
        driver.logs("w-1", replica=2)


def test_services_have_an_endpoint():
    driver = make_driver()
    driver.launch(job("svc-1", "fake-node-002", service=True))
    driver.launch(job("svc-2", "fake-node-001", service=True, ports=(9000,)))
    driver.launch(job("batch-1", "fake-node-000"))
    assert driver.endpoint("svc-1") == "http://fake-node-002:8000"
    assert driver.endpoint("svc-2") == "http://fake-node-001:9000"
    assert driver.endpoint("batch-1") is None
    assert driver.supports(FEATURE_SERVICES)
    assert driver.unsupported == {}


def test_add_nodes_continues_the_names():
    driver = make_driver(nodes=2)
    cluster = fake_cluster("fake-test")
    assert cluster.add_nodes(2, gpus=4, gpu_model="L40S") == ["fake-node-002", "fake-node-003"]
    nodes = {n.name: n for n in driver.nodes()}
    assert (nodes["fake-node-003"].gpus, nodes["fake-node-003"].gpu_model) == (4, "L40S")
    assert nodes["fake-node-000"].gpu_model == "H100"


def test_thousands_of_workloads_on_a_thousand_nodes():
    driver = make_driver("big", nodes=1000, gpus_per_node=8)
    cluster = fake_cluster("big")
    handles = []
    for i in range(5000):
        handles.append(driver.launch(job(f"w-{i}", f"fake-node-{i % 1000:03d}", duration=i % 7)))
    # w-0, w-1000 … w-4000 landed there; w-0 had no duration, so it already ended.
    assert cluster.allocated_gpus("fake-node-000") == 4
    statuses = driver.status(handles)
    assert sum(s.phase == Phase.RUNNING for s in statuses.values()) == 5000 - 715
    cluster.advance(7)
    assert {s.phase for s in driver.status(handles).values()} == {Phase.SUCCEEDED}
    assert sum(cluster.allocated_gpus(n.name) for n in driver.nodes()) == 0
