"""Capacity providers: the simulated cloud buys whole gangs, boots them on its clock, runs out
of stock, fails boots on demand, and its ready nodes join a fake cluster."""

from __future__ import annotations

import pytest

from podsys.drivers.base import DriverError, Phase, Resources, Workload
from podsys.drivers.fake import fake_cluster, reset_fake_clusters
from podsys.providers import NodeState, ProviderError, StockOut, provider_for
from podsys.providers.simulated import SimulatedProvider, reset_simulated_clouds

A100X4 = {"name": "a100x4", "gpu_model": "A100", "gpus": 4, "cpu_cores": 32,
          "memory_mib": 262144, "price_per_hour": 8.0, "boot_s": 120}


@pytest.fixture(autouse=True)
def _fresh_state():
    reset_simulated_clouds()
    reset_fake_clusters()
    yield
    reset_simulated_clouds()
    reset_fake_clusters()


def make_provider(name: str = "sim", **options) -> SimulatedProvider:
    return SimulatedProvider(name=name, options=options)


def states(provider: SimulatedProvider) -> dict[str, NodeState]:
    return {node.id: node.state for node in provider.nodes()}


def test_a_request_boots_every_node_and_they_turn_ready_after_boot_s():
    provider = make_provider()
    bought = provider.request(request_id="r1", node_type="h100x8", count=3)
    assert [n.id for n in bought] == ["sim-h100x8-0000", "sim-h100x8-0001", "sim-h100x8-0002"]
    assert {(n.state, n.node_type, n.request_id, n.ready_at) for n in bought} == {
        (NodeState.BOOTING, "h100x8", "r1", None)
    }
    provider.cloud.advance(299)
    assert set(states(provider).values()) == {NodeState.BOOTING}
    provider.cloud.advance(1)
    assert provider.now() == 300
    assert {(n.state, n.requested_at, n.ready_at) for n in provider.nodes()} == {
        (NodeState.READY, 0, 300)
    }


def test_instances_of_one_name_share_a_cloud_and_the_first_sets_its_shape():
    make_provider(types=[A100X4]).request(request_id="r1", node_type="a100x4", count=1)
    other = make_provider()  # its default types are ignored: the cloud exists
    assert [t.name for t in other.types()] == ["a100x4"]
    assert [n.id for n in other.nodes()] == ["sim-a100x4-0000"]
    assert make_provider("elsewhere").nodes() == []


def test_a_repeated_request_id_returns_the_first_nodes_and_buys_nothing():
    provider = make_provider(stock={"h100x8": 2})
    first = provider.request(request_id="r1", node_type="h100x8", count=2)
    provider.cloud.advance(300)
    again = provider.request(request_id="r1", node_type="h100x8", count=2)
    assert [n.id for n in again] == [n.id for n in first]
    assert {n.state for n in again} == {NodeState.READY}
    assert len(provider.nodes()) == 2
    with pytest.raises(ProviderError, match="request r1 was for 2 h100x8 nodes, not 1 h100x8"):
        provider.request(request_id="r1", node_type="h100x8", count=1)


def test_a_gang_is_bought_whole_or_not_at_all():
    provider = make_provider(stock={"h100x8": 2})
    with pytest.raises(StockOut, match="has 2 h100x8 nodes available, not 3"):
        provider.request(request_id="r1", node_type="h100x8", count=3)
    assert provider.nodes() == []
    # The refused request left no trace: its id may be asked again once it fits.
    assert len(provider.request(request_id="r1", node_type="h100x8", count=2)) == 2
    with pytest.raises(StockOut, match="has 0 h100x8 nodes available, not 1"):
        provider.request(request_id="r2", node_type="h100x8", count=1)


def test_deleting_gives_stock_back_and_is_idempotent():
    provider = make_provider()
    provider.cloud.set_stock("h100x8", 1)
    (node,) = provider.request(request_id="r1", node_type="h100x8", count=1)
    provider.delete(node.id)
    provider.delete(node.id)
    provider.delete("no-such-node")
    assert provider.nodes() == []
    (replacement,) = provider.request(request_id="r2", node_type="h100x8", count=1)
    assert replacement.id != node.id
    # The first request still answers for its node, now returned.
    assert provider.request(request_id="r1", node_type="h100x8", count=1)[0].state == (
        NodeState.DELETED
    )


def test_an_injected_boot_failure_fails_the_node_which_never_joins_and_holds_no_stock():
    fake_cluster("gpu", {"nodes": 0})
    provider = make_provider(joins="gpu", stock={"h100x8": 2})
    provider.cloud.fail_next(1, reason="no capacity in zone a")
    failing, healthy = provider.request(request_id="r1", node_type="h100x8", count=2)
    assert failing.state == NodeState.BOOTING  # it fails when it would have been ready
    provider.cloud.advance(300)
    by_id = {n.id: n for n in provider.nodes()}
    assert (by_id[failing.id].state, by_id[failing.id].reason) == (
        NodeState.FAILED, "no capacity in zone a"
    )
    assert by_id[failing.id].ready_at is None
    assert (by_id[healthy.id].state, by_id[healthy.id].reason) == (NodeState.READY, "")
    assert [n.name for n in fake_cluster("gpu").node_infos()] == [healthy.id]
    # Only the ready node holds stock; the failure affected one node only.
    (third,) = provider.request(request_id="r2", node_type="h100x8", count=1)
    provider.cloud.advance(300)
    assert states(provider)[third.id] == NodeState.READY


def test_ready_nodes_join_the_fake_cluster_and_leave_it_when_deleted():
    cluster = fake_cluster("gpu", {"nodes": 0})
    provider = make_provider(types=[A100X4], joins="gpu")
    bought = provider.request(request_id="r1", node_type="a100x4", count=2)
    assert cluster.node_infos() == []  # booting nodes have not registered yet
    provider.cloud.advance(120)
    joined = cluster.node_infos()
    assert [n.name for n in joined] == [n.id for n in bought]
    assert {(n.gpus, n.gpu_model, n.cpu_cores, n.memory_mib, n.ready) for n in joined} == {
        (4, "A100", 32, 262144, True)
    }
    cluster.launch(Workload(id="job-1-a1", command=("train",), resources=Resources(gpus=4),
                            placement=(bought[0].id,)))
    provider.delete(bought[0].id)
    assert [n.name for n in cluster.node_infos()] == [bought[1].id]
    status = cluster.status("job-1-a1")
    assert (status.phase, status.node_lost) == (Phase.FAILED, bought[0].id)
    with pytest.raises(DriverError, match="has no node"):
        cluster.launch(Workload(id="job-2-a1", command=("train",), resources=Resources(gpus=1),
                                placement=(bought[0].id,)))


def test_the_fake_cluster_never_reuses_a_removed_nodes_name():
    cluster = fake_cluster("c", {"nodes": 2})
    cluster.remove_node("fake-node-001")
    cluster.remove_node("fake-node-001")  # already gone: nothing happens
    assert cluster.add_nodes(1) == ["fake-node-002"]
    with pytest.raises(DriverError, match="already has a node 'fake-node-000'"):
        cluster.add_nodes(1, names=["fake-node-000"])


def test_unknown_types_and_empty_requests_are_refused_in_words():
    provider = make_provider()
    with pytest.raises(ProviderError, match="no node type 'tpu'; known types: h100x8"):
        provider.request(request_id="r1", node_type="tpu", count=1)
    with pytest.raises(ProviderError, match="at least one node, not 0"):
        provider.request(request_id="r1", node_type="h100x8", count=0)
    with pytest.raises(ProviderError, match="known types: h100x8"):
        provider.node_type("tpu")
    assert provider.nodes() == []


def test_the_clock_only_moves_forward():
    provider = make_provider()
    provider.cloud.advance(10)
    with pytest.raises(ValueError, match="only moves forward"):
        provider.cloud.advance(-1)
    assert provider.now() == 10


def test_providers_are_found_by_dotted_path():
    provider = provider_for("podsys.providers.simulated.SimulatedProvider", name="sim",
                            options={"types": [A100X4]})
    assert isinstance(provider, SimulatedProvider)
    assert provider.node_type("a100x4").price_per_hour == 8.0
    with pytest.raises(ProviderError, match="cannot import capacity provider"):
        provider_for("podsys.providers.simulated.Nowhere", name="x")
    with pytest.raises(ProviderError, match="is not a CapacityProvider"):
        provider_for("podsys.drivers.fake.FakeDriver", name="x")
