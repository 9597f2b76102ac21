"""Looking drivers up by name: one instance per cluster in a process."""

from __future__ import annotations

import pytest

from podsys.drivers import get_driver, reset_drivers
from podsys.drivers.base import DriverError, Phase, Resources, Workload
from podsys.drivers.fake import FakeDriver, reset_fake_clusters
from podsys.drivers.local import LocalDriver


@pytest.fixture(autouse=True)
def _fresh():
    reset_drivers()
    reset_fake_clusters()
    yield
    reset_drivers()
    reset_fake_clusters()


def test_one_instance_per_cluster_and_options():
    first = get_driver(cluster="a", driver="fake")
    assert isinstance(first, FakeDriver)
    assert get_driver(cluster="a", driver="fake") is first
    assert get_driver(cluster="a", driver="fake", options={}) is first
    assert get_driver(cluster="b", driver="fake") is not first
    sized = get_driver(cluster="c", driver="fake", options={"nodes": 2, "gpus_per_node": 4})
    same = get_driver(cluster="c", driver="fake", options={"gpus_per_node": 4, "nodes": 2})
    assert sized is same
    assert len(sized.nodes()) == 2


def test_callers_share_the_fake_cluster():
    get_driver(cluster="a", driver="fake").launch(
        Workload(id="w-1", command=("x",), resources=Resources(), placement=("fake-node-000",))
    )
    found = get_driver(cluster="a", driver="fake").status(["w-1"])["w-1"]
    assert found.phase == Phase.RUNNING


def test_dotted_paths_are_accepted(tmp_path):
    driver = get_driver(
        cluster="here", driver="podsys.drivers.local.LocalDriver", options={"root": str(tmp_path)}
    )
    assert isinstance(driver, LocalDriver)
    assert driver.root == tmp_path
    assert get_driver(cluster="here", driver="local", options={"root": str(tmp_path)}) is driver


def test_reset_forgets_instances():
    first = get_driver(cluster="a", driver="fake")
    reset_drivers()
    assert get_driver(cluster="a", driver="fake") is not first


def test_unknown_driver_names_the_known_ones():
    with pytest.raises(DriverError,
                       match=r"unknown cluster driver 'lsf'.*fake, kubernetes, local, slurm"):
        get_driver(cluster="a", driver="lsf")
    with pytest.raises(DriverError, match="cannot import"):
        get_driver(cluster="a", driver="podsys.drivers.nowhere.Driver")
    with pytest.raises(DriverError, match="not a ClusterDriver"):
        get_driver(cluster="a", driver="podsys.drivers.base.NodeInfo")
