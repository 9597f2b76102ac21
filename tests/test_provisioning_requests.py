"""A pool on a Kubernetes cluster whose own autoscaler buys the nodes: the platform asks with
ProvisioningRequests (the fake API server has the CRD; the test plays cluster-autoscaler)."""

import pytest
from django.utils import timezone

from aistation.choices import JobState
from aistation.services.autoscale import fleet_autoscale
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from infra_os.models import Quota
from podsys.choices import PoolNodeState
from podsys.models import Node, NodeRequest, PoolNode
from podsys.providers.base import NodeState, ProviderError
from podsys.providers.provisioning import ATOMIC, ProvisioningRequestProvider
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_create, cluster_sync_nodes
from podsys.services.fleets import fleet_create, pool_create
from tests.fakekube import FakeKube

PROVIDER = "podsys.providers.provisioning.ProvisioningRequestProvider"
TYPES = [{"name": "h100x8", "gpu_model": "H100", "gpus": 8, "cpu_cores": 64,
          "memory_mib": 524288, "price_per_hour": 20.0, "boot_s": 300,
          "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}]
ON_DEMAND = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


@pytest.fixture
def kube(world, settings):
    """A Kubernetes cluster of two 8-GPU nodes with the ProvisioningRequest CRD, in fleet
    `gpu`, alpha's fleet queue on it, and a pool asking its autoscaler for h100x8 nodes."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    fake = FakeKube(provisioning=True).start()
    for i in range(2):
        fake.add_node(f"gpu-{i}", gpus=8)
    cluster = cluster_create(actor=world.operator, name="kube", driver="kubernetes",
                             options={"default_image": "train:1", "retry_delay_s": 0},
                             kubeconfig=fake.kubeconfig())
    cluster_sync_nodes(cluster=cluster)
    fleet = fleet_create(actor=world.operator, name="gpu", clusters=[cluster])
    Quota.objects.filter(tenant=world.alpha).update(gpus=64)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="fleet",
                         cluster=cluster, fleet=fleet)
    pool = pool_create(actor=world.operator, fleet=fleet, name="autoscaled", cluster=cluster,
                       provider=PROVIDER, node_type="h100x8", max_nodes=4,
                       provider_options={"types": TYPES, "namespace": "capacity"})

    def submit(gpus=8, replicas=1):
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                          name="train", command=["python", "train.py"], gpus_per_replica=gpus,
                          replicas=replicas)

    fake.cluster, fake.pool, fake.submit = cluster, pool, submit
    yield fake
    fake.stop()


def provider(kube):
    found = ProvisioningRequestProvider(name="autoscaled",
                                        options={"types": TYPES, "namespace": "capacity"})
    found.attach(driver_for(kube.cluster))
    return found


def test_a_gang_is_asked_for_in_one_atomic_request_and_named_once_provisioned(kube):
    ask = provider(kube)
    nodes = ask.request(request_id="r1", node_type="h100x8", count=2)
    assert [n.state for n in nodes] == [NodeState.BOOTING] * 2
    request = kube.get("ProvisioningRequest", "r1", "capacity")
    assert request["spec"] == {"provisioningClassName": ATOMIC,
                               "podSets": [{"podTemplateRef": {"name": "r1"}, "count": 2}]}
    template = kube.get("PodTemplate", "r1", "capacity")["template"]["spec"]
    assert template["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert template["nodeSelector"] == ON_DEMAND
    assert ask.request(request_id="r1", node_type="h100x8", count=2)[0].id == nodes[0].id
    with pytest.raises(ProviderError, match="was for 2 nodes, not 3"):
        ask.request(request_id="r1", node_type="h100x8", count=3)
    # Provisioned, but the nodes have not joined: still booting.
    kube.provision("capacity", "r1")
    assert {n.state for n in ask.nodes()} == {NodeState.BOOTING}
    for name in ("p5-a", "p5-b"):
        kube.add_node(name, labels=ON_DEMAND)
    kube.add_node("other", labels={"node.kubernetes.io/instance-type": "g5.xlarge"})
    ready = ask.nodes()
    assert [(n.state, n.node_name) for n in ready] == [(NodeState.READY, "p5-a"),
                                                       (NodeState.READY, "p5-b")]
    # A second request never takes the first one's nodes.
    ask.request(request_id="r2", node_type="h100x8", count=1)
    kube.provision("capacity", "r2", nodes=[])
    kube.add_node("p5-c", labels=ON_DEMAND)
    by_request = {n.request_id: n.node_name for n in ask.nodes() if n.request_id == "r2"}
    assert by_request == {"r2": "p5-c"}
    ask.delete(ready[0].id)  # withdraws the whole request
    assert kube.get("ProvisioningRequest", "r1", "capacity") is None
    assert kube.get("PodTemplate", "r1", "capacity") is None
    ask.delete(ready[1].id)  # already gone: nothing to do


def test_the_autoscalers_refusal_fails_the_request_in_its_words(kube):
    ask = provider(kube)
    ask.request(request_id="r1", node_type="h100x8", count=2)
    kube.provision("capacity", "r1", failed="max node group size reached")
    [first, _] = ask.nodes()
    assert first.state == NodeState.FAILED
    assert first.reason == "the cluster's autoscaler: max node group size reached"


def test_a_cluster_without_the_crd_says_so(world, settings):
    fake = FakeKube().start()
    try:
        cluster = cluster_create(actor=world.operator, name="plain", driver="kubernetes",
                                 options={"retry_delay_s": 0}, kubeconfig=fake.kubeconfig())
        ask = ProvisioningRequestProvider(name="p", options={"types": TYPES})
        ask.attach(driver_for(cluster))
        with pytest.raises(ProviderError, match="no ProvisioningRequest CRD"):
            ask.nodes()
    finally:
        fake.stop()


def test_a_job_that_fits_nowhere_starts_on_the_nodes_the_autoscaler_made(kube):
    kube.submit(gpus=8, replicas=2)
    schedule_cluster(cluster_id=kube.cluster.pk)
    gang = kube.submit(gpus=8, replicas=2)
    fleet_autoscale(pool=kube.pool, now=timezone.now())
    request = NodeRequest.objects.get()
    assert request.nodes == 2 and request.jobs == [gang.pk]
    assert kube.get("ProvisioningRequest", request.request_id, "capacity") is not None
    kube.provision("capacity", request.request_id, nodes=[])
    for name in ("p5-a", "p5-b"):
        kube.add_node(name, labels=ON_DEMAND)
    fleet_autoscale(pool=kube.pool, now=timezone.now())
    bought = sorted(PoolNode.objects.filter(state=PoolNodeState.READY)
                    .values_list("name", flat=True))
    assert bought == ["p5-a", "p5-b"]
    assert Node.objects.filter(cluster=kube.cluster, name__in=bought).count() == 2
    schedule_cluster(cluster_id=kube.cluster.pk)
    gang.refresh_from_db()
    assert gang.state in (JobState.ADMITTED, JobState.RUNNING)
    assert sorted(gang.placement) == ["p5-a", "p5-b"]
