"""RDMA devices and extra networks on the local and fake drivers: the local driver offers RDMA
only where the host lists RDMA devices (/sys/class/infiniband, or its `rdma_device_dir`
option) and never attaches networks; the fake driver's nodes offer what its options say and it
refuses what a real cluster could not do."""

import pytest
import yaml

from podsys.drivers.base import FEATURE_NETWORKS, FEATURE_RDMA, DriverError, Resources, Workload
from podsys.drivers.fake import FakeDriver
from podsys.drivers.local import LocalDriver


def local(tmp_path, devices: list[str] | None) -> LocalDriver:
    folder = tmp_path / "infiniband"
    if devices is not None:
        folder.mkdir()
        for name in devices:
            (folder / name).mkdir()
    return LocalDriver(cluster="here", options={"root": str(tmp_path / "root"),
                                                "node_name": "box",
                                                "rdma_device_dir": str(folder)})


def workload(**resources) -> Workload:
    return Workload(id="job-1-a1", command=("true",), resources=Resources(**resources),
                    placement=("box",))


def test_the_local_driver_refuses_rdma_without_rdma_devices(tmp_path):
    driver = local(tmp_path, None)
    assert not driver.supports(FEATURE_RDMA)
    assert driver.unsupported[FEATURE_RDMA] == (
        f"this machine has no RDMA devices (none in {tmp_path / 'infiniband'})")
    assert driver.nodes()[0].rdma == 0
    for act in (driver.render, driver.launch):
        with pytest.raises(DriverError, match="asks for RDMA devices: this machine has no RDMA"):
            act(workload(rdma=1))


def test_this_machine_has_none_where_the_kernel_lists_them(tmp_path):
    driver = LocalDriver(cluster="here", options={"root": str(tmp_path)})
    assert driver.rdma_device_dir.as_posix() == "/sys/class/infiniband"
    assert driver.supports(FEATURE_RDMA) == bool(driver._rdma_devices())


def test_the_local_driver_offers_the_hosts_rdma_devices(tmp_path):
    driver = local(tmp_path, ["mlx5_0", "mlx5_1"])
    assert driver.supports(FEATURE_RDMA)
    assert driver.nodes()[0].rdma == 2
    shown = yaml.safe_load(driver.render(workload(rdma=1)))
    assert shown["network"] == {"asked": "1 RDMA device per replica",
                                "rdma_devices_here": ["mlx5_0", "mlx5_1"]}
    with pytest.raises(DriverError, match="asks for 3 RDMA devices per replica; this machine "
                                          "has 2"):
        driver.render(workload(rdma=3))
    plain = yaml.safe_load(driver.render(workload()))
    assert plain["network"]["asked"] == "default network only"


def test_the_local_driver_attaches_no_networks(tmp_path):
    driver = local(tmp_path, ["mlx5_0"])
    assert not driver.supports(FEATURE_NETWORKS)
    attached = Workload(id="job-1-a1", command=("true",), resources=Resources(),
                        placement=("box",), networks=("ib",))
    with pytest.raises(DriverError, match="cannot attach networks"):
        driver.render(attached)


def test_the_fake_drivers_nodes_offer_rdma_and_it_refuses_more(settings):
    driver = FakeDriver(cluster="ibfake", options={"nodes": 1, "gpus_per_node": 8,
                                                   "rdma_per_node": 2, "networks": ["ib-a"]})
    [node] = driver.nodes()
    assert (node.rdma, node.rdma_allocated) == (2, 0)
    assert driver.network_offer().attachments == ("ib-a",)
    first = Workload(id="job-1-a1", command=("true",), resources=Resources(gpus=1, rdma=2),
                     placement=(node.name,), networks=("ib-a",))
    driver.launch(first)
    assert driver.nodes()[0].rdma_allocated == 2
    second = Workload(id="job-2-a1", command=("true",), resources=Resources(gpus=1, rdma=1),
                      placement=(node.name,))
    with pytest.raises(DriverError, match=r"needs 1 RDMA devices on .*; 0 of 2 are free"):
        driver.launch(second)
    stranger = Workload(id="job-3-a1", command=("true",), resources=Resources(),
                        placement=(node.name,),
                        networks=("ib-z",))
    with pytest.raises(DriverError, match="offers no network 'ib-z'; it offers ib-a"):
        driver.launch(stranger)
    driver.cancel("job-1-a1")
    assert driver.nodes()[0].rdma_allocated == 0
    shown = yaml.safe_load(driver.render(first))
    assert shown["network"] == "attachments ib-a; 2 RDMA devices per replica"
    assert shown["resources"]["rdma"] == 2 and shown["networks"] == ["ib-a"]
