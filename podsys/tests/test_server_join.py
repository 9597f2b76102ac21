"""A provisioned server joins a cluster (and can then not be leased) and leaves it again."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from infra_os.choices import LeaseState, ServerAllocation, ServerState
from infra_os.models import AuditEvent, Server
from infra_os.services.leases import lease_create, lease_end
from podsys.allocations import register_allocation_provider
from podsys.models import Cluster
from podsys.services.servers import server_join_cluster, server_leave_cluster


@pytest.fixture
def cluster(db):
    return Cluster.objects.create(name="farm", driver="fake", options={"nodes": 1})


def provisioned(name="bm-01"):
    return Server.objects.create(name=name, state=ServerState.PROVISIONED,
                                 expected_gpu_model="H100", expected_gpu_count=8)


def test_join_and_leave(world, cluster):
    server = provisioned()
    joined = server_join_cluster(actor=world.operator, server=server, cluster=cluster)
    assert (joined.allocation, joined.allocated_to) == (ServerAllocation.CLUSTER, "farm")
    # Joining again changes nothing; leasing it is refused.
    assert server_join_cluster(actor=world.operator, server=server, cluster=cluster).pk == \
        server.pk
    assert AuditEvent.objects.filter(action="server.allocation").count() == 1
    now = timezone.now()
    with pytest.raises(ValidationError, match="node of cluster farm"):
        lease_create(actor=world.operator, server=server, tenant=world.alpha, starts_at=now,
                     ends_at=now + timedelta(hours=1))

    left = server_leave_cluster(actor=world.operator, server=server)
    assert (left.allocation, left.allocated_to) == (ServerAllocation.FREE, "")
    made = lease_create(actor=world.operator, server=server, tenant=world.alpha, starts_at=now,
                        ends_at=now + timedelta(hours=1))
    assert made.state == LeaseState.ACTIVE


def test_a_leased_or_unprovisioned_server_does_not_join(world, cluster):
    server = provisioned()
    later = timezone.now() + timedelta(days=2)
    lease = lease_create(actor=world.operator, server=server, tenant=world.beta,
                         starts_at=later, ends_at=later + timedelta(hours=1))
    with pytest.raises(ValidationError, match=r"leased to beta .* end or cancel the lease"):
        server_join_cluster(actor=world.operator, server=server, cluster=cluster)
    lease_end(actor=world.operator, lease=lease)
    server_join_cluster(actor=world.operator, server=server, cluster=cluster)

    registered = Server.objects.create(name="bm-02")
    with pytest.raises(ValidationError, match="only a provisioned server can join"):
        server_join_cluster(actor=world.operator, server=registered, cluster=cluster)
    cluster.is_active = False
    cluster.save()
    with pytest.raises(ValidationError, match="inactive"):
        server_join_cluster(actor=world.operator, server=provisioned("bm-03"), cluster=cluster)


def test_only_platform_admins_join(world, cluster):
    with pytest.raises(PermissionDenied):
        server_join_cluster(actor=world.alpha_admin, server=provisioned(), cluster=cluster)


def test_a_node_with_work_on_it_does_not_leave(world, cluster, monkeypatch):
    server = provisioned()
    server_join_cluster(actor=world.operator, server=server, cluster=cluster)
    other = Cluster.objects.create(name="other", driver="fake")
    with pytest.raises(ValidationError, match="node of cluster farm, not of other"):
        server_leave_cluster(actor=world.operator, server=server, cluster=other)
    monkeypatch.setattr("podsys.allocations._providers", [])
    register_allocation_provider(lambda ids: {(cluster.pk, "bm-01"): 4})
    with pytest.raises(ValidationError, match="still holds 4 GPUs; cordon the node"):
        server_leave_cluster(actor=world.operator, server=server)
    server.refresh_from_db()
    assert server.allocation == ServerAllocation.CLUSTER


def test_api_join_and_leave(world, api, cluster):
    provisioned()
    client = api.as_user(world.operator)
    url = "/api/v1/podsys/clusters/farm/"
    joined = client.post(f"{url}join-server/", {"server": "bm-01"}, format="json")
    assert joined.status_code == 200, joined.json()
    assert joined.json() == {"id": joined.json()["id"], "name": "bm-01",
                             "allocation": "cluster", "allocated_to": "farm"}
    unknown = client.post(f"{url}join-server/", {"server": "nope"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["code"] == "invalid"
    assert "server" in unknown.json()["fields"]

    denied = api.as_user(world.alpha_admin).post(f"{url}leave-server/", {"server": "bm-01"},
                                                 format="json")
    assert denied.status_code == 403
    client = api.as_user(world.operator)
    left = client.post(f"{url}leave-server/", {"server": "bm-01"}, format="json")
    assert left.status_code == 200 and left.json()["allocation"] == "free"
    again = client.post(f"{url}leave-server/", {"server": "bm-01"}, format="json")
    assert again.status_code == 400
    assert again.json()["message"] == "server: bm-01 is not a node of any cluster."
