"""Ray clusters (`Workload.ray`) on the local driver: a head and a worker, each a replica in a
sandbox of its own, run an entrypoint that uses both nodes; the cluster ends with it, and a
cancel leaves no Ray process of the workload behind. Ray starts slowly (about 15 s a cluster on
two cores), so each test starts one cluster."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from podsys.drivers.base import FEATURE_RAY, Phase, RaySpec, Resources, Workload
from podsys.drivers.local import LocalDriver
from podsys.drivers.local_ray import RAY_MISSING

pytest.importorskip("ray", reason=RAY_MISSING)

DEADLINE_S = 90.0
TENANT_UID = 1_000_000_044

TWO_NODES = textwrap.dedent("""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init()
    alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    print("alive", len(alive), flush=True)

    @ray.remote(num_cpus=0)
    def where():
        return ray.get_runtime_context().get_node_id()

    ran = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote() for node in alive])
    print("ran on", len(set(ran)), "nodes:", " ".join(sorted(ran)), flush=True)
""")
HOLD = "import time; print('entrypoint started', flush=True); time.sleep(600)"


def ray_workload(id: str, code: str, *, tenant: str = "beta") -> Workload:
    small = Resources(cpu_cores=1, memory_mib=400)
    return Workload(id=id, command=(sys.executable, "-c", code), resources=small, replicas=2,
                    tenant=tenant, run_as=TENANT_UID if tenant else None,
                    ray=RaySpec(head=small, worker=small, ready_timeout_s=60))


def ray_processes(driver: LocalDriver, handle: str) -> list[str]:
    """The Ray daemons (gcs_server, raylet) of this workload still running: those listening
    on its ports."""
    state = driver._load(handle)
    assert state and state["ray"]
    marks = [f"--gcs_server_port={state['ray']['head']['gcs']}"] + [
        f"--node_manager_port={node['node_manager']}" for node in state["ray"]["nodes"]]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(mark in cmdline for mark in marks) and ("raylet" in cmdline
                                                      or "gcs_server" in cmdline):
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def wait_for(predicate, what: str, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def driver(tmp_path: Path):
    driver = LocalDriver(cluster="ray", options={"root": str(tmp_path / "cluster"),
                                                 "grace_s": 5})
    assert driver.supports(FEATURE_RAY)
    yield driver
    for folder in (tmp_path / "cluster" / "workloads").glob("*"):
        driver.cancel(folder.name)


def test_ray_head_and_worker_run_an_entrypoint_on_both_nodes(driver: LocalDriver) -> None:
    handle = driver.launch(ray_workload("ray-two-nodes", TWO_NODES))
    seen: dict = {}

    def ended() -> bool:
        seen["ray"] = seen.get("ray") or ray_processes(driver, handle)
        status = driver.status([handle])[handle]
        return status if status.phase in (Phase.SUCCEEDED, Phase.FAILED) else None

    status = wait_for(ended, "the Ray job to end")
    log = driver.logs(handle)
    assert status.phase == Phase.SUCCEEDED, log + driver.logs(handle, replica=1)
    assert "alive 2" in log
    assert "ran on 2 nodes:" in log
    assert seen["ray"], "the cluster's daemons were never seen running"
    assert ray_processes(driver, handle) == []
    addresses = driver.ray_addresses(handle)
    assert addresses and addresses["gcs"].startswith("127.0.0.1:")
    assert addresses["dashboard"] == ""


def test_cancelled_ray_cluster_leaves_no_ray_process(driver: LocalDriver) -> None:
    handle = driver.launch(ray_workload("ray-cancelled", HOLD))
    wait_for(lambda: "entrypoint started" in driver.logs(handle), "the entrypoint to start")
    assert ray_processes(driver, handle)
    driver.cancel(handle)
    assert driver.status([handle])[handle].phase == Phase.FAILED
    wait_for(lambda: not ray_processes(driver, handle), "every Ray process to stop", 15)
