"""The cluster driver contract, run against every driver that runs workloads: the `local`
driver (processes on this machine), the `slurm` driver (a real Slurm started by the tests) and
the `kubernetes` driver (the official client against the fake API server, whose kubelet runs
the pods' commands here). What one driver promises the layers above, every driver keeps."""

import sys
import textwrap
import time
from pathlib import Path

import pytest

from podsys.drivers.base import DriverError, Phase, Resources, Workload
from podsys.drivers.kubernetes import KubernetesDriver
from podsys.drivers.local import LocalDriver
from podsys.drivers.slurm import SlurmDriver
from tests.fakekube import FakeKube
from tests.fakekube.kubelet import Kubelet
from tests.slurm_cluster import SlurmCluster, shared_folder

FINISHED = {Phase.SUCCEEDED, Phase.FAILED}
STOPPED = {Phase.FAILED, Phase.MISSING}


@pytest.fixture(scope="module")
def slurm():
    with SlurmCluster.temporary(accounting=False) as cluster:
        yield cluster


@pytest.fixture(params=["local", "slurm", "kubernetes"])
def driver(request):
    with shared_folder() as folder:
        if request.param == "local":
            yield LocalDriver(cluster="contract", options={"root": str(folder / "local"),
                                                           "grace_s": 2})
        elif request.param == "kubernetes":
            with FakeKube() as kube, Kubelet(kube):
                kube.add_node("node-1", gpus=0)
                yield KubernetesDriver(cluster="contract", options={
                    "kubeconfig": kube.kubeconfig(), "default_image": "python:3.11",
                    "retry_delay_s": 0})
        else:
            cluster = request.getfixturevalue("slurm")
            yield SlurmDriver(cluster="contract", options={
                "slurm_conf": str(cluster.conf), "shared_dir": str(folder / "slurm"),
                "grace_s": 2})


def _workload(workload_id: str, body: str, **fields) -> Workload:
    return Workload(id=workload_id, command=(sys.executable, "-c", textwrap.dedent(body)),
                    resources=Resources(cpu_cores=1, memory_mib=128),
                    labels={"ogai.tenant": "contract"}, **fields)


def _wait(driver, handle, phases, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = driver.status([handle])[handle]
        if status.phase in phases or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_a_gang_runs_to_success_each_replica_with_its_rank_and_its_own_log(driver):
    handle = driver.launch(_workload("contract-ok", """
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
    """, replicas=2))
    status = _wait(driver, handle, FINISHED)
    assert status.phase == Phase.SUCCEEDED and status.exit_code == 0
    assert [r.phase for r in status.replicas] == [Phase.SUCCEEDED, Phase.SUCCEEDED]
    assert "rank 0 of 2" in driver.logs(handle, replica=0)
    assert "rank 1 of 2" in driver.logs(handle, replica=1)
    assert driver.logs(handle, replica=1, tail=1).strip() == "rank 1 of 2"
    with pytest.raises(DriverError):
        driver.logs(handle, replica=2)
    # What the log store's shipper reads: every line once, from where it last stopped.
    chunk = driver.read_log(handle, replica=1, offset=0, final=True)
    assert chunk.lines[-1] == "rank 1 of 2"
    assert driver.read_log(handle, replica=1, offset=chunk.offset, final=True).lines == ()


def test_a_failure_carries_the_exit_code_of_the_rank_that_failed(driver):
    handle = driver.launch(_workload("contract-fail", "import sys; sys.exit(3)"))
    status = _wait(driver, handle, FINISHED)
    assert status.phase == Phase.FAILED
    # The reason names the code (a driver may say more: Kubernetes' "Error", "OOMKilled").
    assert status.exit_code == 3 and "exit code 3" in status.reason


def test_launching_the_same_id_twice_runs_it_once(driver):
    with shared_folder() as folder:
        marker = Path(folder, "runs")
        workload = _workload("contract-once", f"""
            with open({str(marker)!r}, "a") as runs:
                runs.write("ran\\n")
        """)
        assert driver.launch(workload) == driver.launch(workload)
        assert _wait(driver, workload.id, FINISHED).phase == Phase.SUCCEEDED
        time.sleep(1)
        assert marker.read_text() == "ran\n"


def test_cancel_stops_a_running_workload_and_is_harmless_after(driver):
    handle = driver.launch(_workload("contract-cancel", """
        import time
        print("up", flush=True)
        time.sleep(600)
    """))
    assert _wait(driver, handle, {Phase.RUNNING}).phase == Phase.RUNNING
    driver.cancel(handle)
    # Stopped: ended as failed, or gone with its objects (Kubernetes deletes them).
    status = _wait(driver, handle, STOPPED, timeout=30)
    assert status.phase in STOPPED
    driver.cancel(handle)


def test_unknown_workloads_are_missing_never_errors(driver):
    assert driver.status(["contract-none"])["contract-none"].phase == Phase.MISSING
    driver.cancel("contract-none")
    with pytest.raises(DriverError):
        driver.logs("contract-none")


def test_an_id_that_is_not_a_dns_label_is_refused(driver):
    with pytest.raises(DriverError, match="DNS-1123"):
        driver.launch(_workload("Not_A_Label", "print(1)"))
