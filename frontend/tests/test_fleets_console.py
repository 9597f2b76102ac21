"""The fleet pages (platform admins only): the fleets, and one fleet's clusters, pools counted
node by node, and the autoscaler's decisions in words. Rows are made directly: no provider is
asked and no scheduler runs."""

from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import timezone

from podsys.choices import PoolNodeState, ScaleEventKind
from podsys.models import Cluster, ElasticPool, Fleet, Node, PoolNode, ScaleEvent

HTMX = {"HTTP_HX_REQUEST": "true"}
REASON = "requested 2 h100x8 for job 41: 16 GPUs fit on no cluster of the fleet"


@pytest.fixture
def fleet(world):
    """Fleet `lab`: cluster `north` (answering) with pool `burst` (one node booting, one ready
    and empty), and cluster `south`, whose driver has failed for two hours."""
    now = timezone.now()
    fleet = Fleet.objects.create(name="lab", display_name="Lab fleet")
    north = Cluster.objects.create(name="north", driver="fake", options={"nodes": 2},
                                   fleet=fleet, last_synced_at=now)
    south = Cluster.objects.create(name="south", driver="fake", options={"nodes": 2},
                                   fleet=fleet, sync_error="connection refused",
                                   last_synced_at=now - timedelta(hours=2))
    Node.objects.create(cluster=north, name="north-0", gpus=8)
    pool = ElasticPool.objects.create(
        fleet=fleet, name="burst", cluster=north,
        provider="podsys.providers.simulated.SimulatedProvider", node_type="h100x8",
        max_nodes=4, max_spend_per_month=Decimal("250"))
    PoolNode.objects.create(pool=pool, tenant=world.alpha, name="sim-1", gpus=8,
                            state=PoolNodeState.BOOTING, requested_at=now)
    PoolNode.objects.create(pool=pool, tenant=world.alpha, name="sim-2", gpus=8,
                            state=PoolNodeState.READY, requested_at=now, ready_at=now)
    PoolNode.objects.create(pool=pool, tenant=world.alpha, name="sim-0", gpus=8,
                            state=PoolNodeState.RETURNED, requested_at=now - timedelta(hours=1),
                            returned_at=now - timedelta(minutes=30))
    ScaleEvent.objects.create(pool=pool, tenant=world.alpha, kind=ScaleEventKind.UP, nodes=2,
                              reason=REASON, created_at=now)
    ScaleEvent.objects.create(pool=pool, kind=ScaleEventKind.REFUSED, nodes=1,
                              reason="the pool's budget of 250.00 this month is spent",
                              created_at=now - timedelta(minutes=5))
    return SimpleNamespace(fleet=fleet, north=north, south=south, pool=pool, world=world)


def _row(page: str, marker: str) -> str:
    return page.split(marker, 1)[1].split("</tr>", 1)[0]


def test_an_operator_sees_the_fleet_its_pool_counted_and_its_decisions(signed_in, fleet):
    client = signed_in(fleet.world.operator, fleet.world.alpha)
    listed = client.get(reverse("frontend:fleets")).content.decode()
    row = _row(listed, 'data-fleet="lab"')
    assert reverse("frontend:fleet", args=["lab"]) in row
    assert '<td class="num">2</td>' in row and '<td class="num">1</td>' in row  # clusters, pools

    response = client.get(reverse("frontend:fleet", args=["lab"]))
    assert response.status_code == 200
    page = response.content.decode()
    pool = _row(page, 'data-pool="burst"')
    assert 'data-booting="1" data-idle="1" data-busy="0"' in pool
    assert "2 of 4" in pool  # nodes bought of the pool's max
    assert "of 250.00" in pool
    assert "not answering" not in _row(page, 'data-cluster="north"')
    assert "not answering" in _row(page, 'data-cluster="south"')
    events = page.split("data-events", 1)[1]
    assert REASON in events
    assert events.index(REASON) < events.index("budget of 250.00")  # newest first
    assert "Refused (budget)" in events and ">alpha<" in events
    assert response.context["summary"].pools[0].booting == 1


def test_the_poller_gets_the_live_area_alone(signed_in, fleet):
    client = signed_in(fleet.world.operator)
    partial = client.get(reverse("frontend:fleet", args=["lab"]), **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="fleet-live"')
    assert 'class="sidebar"' not in partial
    assert REASON in partial


def test_the_navigation_offers_fleets_to_operators_only(signed_in, fleet):
    def links(user):
        response = signed_in(user).get(reverse("frontend:fleet", args=["lab"])
                                       if user.is_staff else reverse("frontend:clusters"))
        return [(link.label, link.active) for section in response.context["nav_sections"]
                for link in section.links]

    assert ("Fleets", True) in links(fleet.world.operator)
    assert "Fleets" not in [label for label, _ in links(fleet.world.alpha_admin)]


def test_a_tenant_member_is_refused(client, fleet):
    for user in (fleet.world.alpha_admin, fleet.world.alpha_member):
        client.force_login(user)
        for url in (reverse("frontend:fleets"), reverse("frontend:fleet", args=["lab"]),
                    reverse("frontend:fleet", args=["nowhere"])):
            response = client.get(url)
            assert response.status_code == 403, (user, url)
            assert REASON not in response.content.decode()
