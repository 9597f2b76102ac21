"""The nodes API as operators script it: find a node by name, see who cordoned it."""

from podsys.services.clusters import node_set_schedulable
from tests.factories import ClusterFactory, NodeFactory

NODES = "/api/v1/podsys/nodes/"


def test_a_node_is_found_by_name_and_says_who_cordoned_it(api, world):
    first, second = ClusterFactory(name="east"), ClusterFactory(name="west")
    wanted = NodeFactory(cluster=first, name="gpu-07")
    NodeFactory(cluster=second, name="gpu-07")
    NodeFactory(cluster=first, name="gpu-08")
    node_set_schedulable(actor=world.operator, node=wanted, schedulable=False,
                         reason="swapping a PSU")
    client = api.as_user(world.operator)

    rows = client.get(NODES, {"name": "gpu-07"}).json()["results"]
    assert sorted(row["cluster"] for row in rows) == ["east", "west"]
    (row,) = client.get(NODES, {"name": "gpu-07", "cluster": "east"}).json()["results"]
    assert (row["schedulable"], row["cordon_source"], row["health_reason"]) == (
        False, "operator", "swapping a PSU")
