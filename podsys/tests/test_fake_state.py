"""Shared fakes: with OGAI_FAKE_STATE_DIR set, a fake cluster and a simulated cloud are one
state that every process sees, and their clocks follow the wall clock."""

import multiprocessing
import stat
import time

import pytest

from podsys.drivers.base import Phase, Resources, Workload
from podsys.drivers.fake import FakeDriver, fake_cluster
from podsys.providers.base import NodeState
from podsys.providers.simulated import SimulatedProvider

FAST_TYPE = {"name": "a100x4", "gpu_model": "A100", "gpus": 4, "cpu_cores": 32,
             "memory_mib": 262144, "price_per_hour": 8.0, "boot_s": 2.0}


@pytest.fixture
def shared(settings, tmp_path):
    settings.OGAI_FAKE_STATE_DIR = str(tmp_path / "fakes")
    return tmp_path / "fakes"


def _in_another_process(function, *args):
    """Run `function(*args)` in a forked process (a worker process of its own) and return what
    it returns."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=lambda: results.put(function(*args)))
    child.start()
    found = results.get(timeout=30)
    child.join(timeout=30)
    assert child.exitcode == 0
    return found


def _workload(name: str, seconds: float) -> Workload:
    return Workload(id=name, command=("python", "train.py"),
                    env={"OGAI_FAKE_DURATION_S": str(seconds)},
                    resources=Resources(gpus=8), placement=("fake-node-000",))


def _phase(cluster: str, handle: str) -> str:
    return FakeDriver(cluster=cluster).status([handle])[handle].phase.value


def test_a_workload_launched_by_one_process_is_seen_and_ends_in_another(shared):
    driver = FakeDriver(cluster="east", options={"nodes": 1})
    handle = driver.launch(_workload("job-1", 0.5))

    assert _in_another_process(_phase, "east", handle) == Phase.RUNNING.value
    # The other process sees the node taken, so a second gang on it is refused there too.
    free = _in_another_process(lambda: fake_cluster("east").free_gpus("fake-node-000"))
    assert free == 0

    time.sleep(0.6)  # nobody moves the clock: the wall clock does
    assert _in_another_process(_phase, "east", handle) == Phase.SUCCEEDED.value
    assert driver.status([handle])[handle].phase == Phase.SUCCEEDED
    assert fake_cluster("east").free_gpus("fake-node-000") == 8


def test_bought_nodes_boot_on_the_wall_clock_and_join_the_shared_cluster(shared):
    FakeDriver(cluster="east", options={"nodes": 1})
    provider = SimulatedProvider(name="burst", options={"joins": "east", "types": [FAST_TYPE]})
    bought = provider.request(request_id="r1", node_type="a100x4", count=2)
    booted_at = time.monotonic() + FAST_TYPE["boot_s"]
    assert {node.state for node in bought} == {NodeState.BOOTING}

    def view():
        cloud = SimulatedProvider(name="burst")
        return ([node.state.value for node in cloud.nodes()],
                sorted(node.name for node in FakeDriver(cluster="east").nodes()))

    states, nodes = _in_another_process(view)
    assert states == ["booting", "booting"] and nodes == ["fake-node-000"]
    time.sleep(max(booted_at + 0.1 - time.monotonic(), 0))
    states, nodes = _in_another_process(view)
    assert states == ["ready", "ready"]
    assert nodes == sorted(["fake-node-000", *(node.id for node in bought)])

    provider.delete(bought[0].id)
    assert bought[0].id not in {node.name for node in FakeDriver(cluster="east").nodes()}


def test_the_state_folder_is_private(shared):
    FakeDriver(cluster="east").nodes()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    assert (shared / "cluster-east.pickle").exists()
