"""The fleets API as an operator reads it: a fleet's clusters with their GPUs held and whether
they answer, its pools' nodes booting, idle and busy with their spend this month, and the
autoscaler's decisions. Tenants see none of it."""

from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.utils import timezone

from podsys.choices import PoolNodeState, ScaleEventKind
from podsys.models import Cluster, ElasticPool, Fleet, Node, PoolNode, ScaleEvent
from tests.factories import JobFactory, QueueFactory

FLEETS = "/api/v1/podsys/fleets/"
PROVIDER = "podsys.providers.simulated.SimulatedProvider"


def _fleet(name: str, *, tenant=None, pool_tenant, events: int = 2) -> SimpleNamespace:
    """A fleet of two clusters: `{name}-east` (two nodes of its own, three bought from pool
    `burst`) and `{name}-west`, whose driver has failed for two hours. In the pool: one node
    booting, one with a job on it, one claimed by a waiting job, one empty, one given back (the
    only one with a price: 3 h at 2.50 this month)."""
    now = timezone.now()
    fleet = Fleet.objects.create(name=name, display_name=f"{name.title()} fleet")
    east = Cluster.objects.create(name=f"{name}-east", driver="fake", options={"nodes": 2},
                                  fleet=fleet, tenant=tenant, last_synced_at=now)
    west = Cluster.objects.create(name=f"{name}-west", driver="fake", options={"nodes": 2},
                                  fleet=fleet, tenant=tenant, sync_error="connection refused",
                                  last_synced_at=now - timedelta(hours=2))
    for cluster in (east, west):
        for index in range(2):
            Node.objects.create(cluster=cluster, name=f"{cluster.name}-{index}", gpus=8)
    pool = ElasticPool.objects.create(fleet=fleet, name="burst", cluster=east, provider=PROVIDER,
                                      node_type="h100x8", max_nodes=6, max_spend_per_month=100)
    states = {"b1": PoolNodeState.BOOTING, "b2": PoolNodeState.READY,
              "b3": PoolNodeState.READY, "b4": PoolNodeState.READY}
    for node_name, state in states.items():
        PoolNode.objects.create(pool=pool, tenant=pool_tenant, name=f"{name}-{node_name}",
                                state=state, gpus=8, gpu_model="H100", requested_at=now,
                                claims=[999] if node_name == "b3" else [])
        if state == PoolNodeState.READY:
            Node.objects.create(cluster=east, name=f"{name}-{node_name}", gpus=8)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    PoolNode.objects.create(pool=pool, tenant=pool_tenant, name=f"{name}-b0",
                            state=PoolNodeState.RETURNED, gpus=8, price_per_hour=Decimal("2.5"),
                            requested_at=month, ready_at=month,
                            returned_at=month + timedelta(hours=3))
    queue = QueueFactory(tenant=pool_tenant, cluster=east)
    JobFactory(queue=queue, state="running", gpus_per_replica=4, placement=[f"{name}-east-0"])
    JobFactory(queue=queue, state="running", gpus_per_replica=8, placement=[f"{name}-b2"])
    for minutes in range(events):
        ScaleEvent.objects.create(pool=pool, tenant=pool_tenant if minutes % 2 else None,
                                  kind=ScaleEventKind.UP, nodes=minutes + 1,
                                  reason=f"requested {minutes + 1} h100x8 ({minutes} min ago)",
                                  created_at=now - timedelta(minutes=minutes))
    return SimpleNamespace(fleet=fleet, east=east, west=west, pool=pool)


@pytest.fixture
def fleet(world):
    return _fleet("gpu", pool_tenant=world.alpha)


def test_an_operator_reads_a_fleet_with_its_clusters_and_pools(api, world, fleet):
    client = api.as_user(world.operator)
    listed = client.get(FLEETS).json()
    assert listed["count"] == 1
    body = client.get(f"{FLEETS}gpu/").json()
    assert body == listed["results"][0]
    assert (body["name"], body["display_name"]) == ("gpu", "Gpu fleet")
    assert body["clusters"] == [
        # 2 own nodes and the 2 ready pool nodes; 4 GPUs held on gpu-east-0, 8 on gpu-b2
        {"name": "gpu-east", "driver": "fake", "nodes": 5, "gpus": 40, "gpus_held": 12,
         "lost": False},
        {"name": "gpu-west", "driver": "fake", "nodes": 2, "gpus": 16, "gpus_held": 0,
         "lost": True},
    ]
    assert body["pools"] == [
        {"name": "burst", "cluster": "gpu-east", "node_type": "h100x8", "max_nodes": 6,
         "booting": 1, "idle": 1, "busy": 2, "spend_this_month": "7.50",
         "max_spend_per_month": "100.00"},
    ]


def test_a_cluster_that_failed_briefly_is_not_lost(api, world, fleet, settings):
    settings.OGAI_CLUSTER_LOST_S = 3 * 3600  # west failed 2 h ago: not long enough
    body = api.as_user(world.operator).get(f"{FLEETS}gpu/").json()
    assert [cluster["lost"] for cluster in body["clusters"]] == [False, False]


def test_the_events_come_newest_first_a_page_at_a_time(api, world):
    _fleet("gpu", pool_tenant=world.alpha, events=5)
    client = api.as_user(world.operator)
    page = client.get(f"{FLEETS}gpu/events/", {"limit": 2}).json()
    assert page["count"] == 5
    assert [(row["reason"], row["tenant"], row["nodes"], row["kind"], row["pool"])
            for row in page["results"]] == [
        ("requested 1 h100x8 (0 min ago)", None, 1, "up", "burst"),
        ("requested 2 h100x8 (1 min ago)", "alpha", 2, "up", "burst"),
    ]
    rest = client.get(f"{FLEETS}gpu/events/", {"limit": 2, "offset": 4}).json()["results"]
    assert [row["nodes"] for row in rest] == [5]
    assert "created_at" in rest[0]


def test_a_tenant_admin_gets_no_fleet_not_even_of_its_own_clusters(api, world):
    """The attack: alpha's admin asks for a fleet of alpha's own clusters whose pool buys nodes
    for alpha, by its name, for its events, and tries to write."""
    _fleet("mine", tenant=world.alpha, pool_tenant=world.alpha)
    client = api.as_user(world.alpha_admin)
    listed = client.get(FLEETS).json()
    assert (listed["count"], listed["results"]) == (0, [])
    for url in (f"{FLEETS}mine/", f"{FLEETS}mine/events/"):
        response = client.get(url)
        assert response.status_code == 404, url
        assert response.json()["code"] == "not_found"
    for method in ("post", "put", "patch", "delete"):
        assert getattr(client, method)(f"{FLEETS}mine/", {}, format="json").status_code in (
            403, 404, 405), method
    assert client.post(FLEETS, {"name": "evil"}, format="json").status_code in (403, 405)
    assert Fleet.objects.count() == 1
    assert api.as_user(world.alpha_member).get(f"{FLEETS}mine/events/").status_code == 404


def test_anonymous_callers_are_refused(api, fleet):
    for url in (FLEETS, f"{FLEETS}gpu/", f"{FLEETS}gpu/events/"):
        assert api.get(url).status_code == 401, url


def test_the_fleet_list_pins_its_query_count(api, world, django_assert_num_queries):
    for name in ("one", "two", "three"):
        _fleet(name, pool_tenant=world.alpha)
    client = api.as_user(world.operator)
    # count, page, clusters, their nodes, GPUs held (jobs), pools, pool nodes; then each pool's
    # spend: the same however many clusters and nodes the fleets have.
    with django_assert_num_queries(7 + 3):
        assert client.get(FLEETS).json()["count"] == 3
    with django_assert_num_queries(7 + 1):
        assert client.get(FLEETS, {"limit": 1}).json()["count"] == 3
    # the fleet, then its one pool's figures as above, less the count
    with django_assert_num_queries(6 + 1):
        client.get(f"{FLEETS}two/")
    with django_assert_num_queries(3):  # the fleet, count, page
        assert client.get(f"{FLEETS}two/events/").json()["count"] == 2
