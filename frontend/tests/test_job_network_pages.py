"""A job's network in the console: the submit form takes it (and refuses in words what the
cluster does not offer), the job's page shows it, the cluster's node inventory shows each
node's RDMA devices, and the quota page its RDMA limit."""

import pytest
from django.urls import reverse

from aistation.models import Job
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

SPEC = {
    "name": "ib-train", "command": "python train.py", "env": "", "image": "",
    "gpus_per_replica": "1", "gpu_model": "", "cpu_per_replica": "1",
    "memory_mib_per_replica": "1024", "replicas": "2", "priority": "", "max_restarts": "0",
    "time_limit_s": "",
}


@pytest.fixture
def ib(world):
    cluster = Cluster.objects.create(name="ib", driver="fake", options={
        "nodes": 2, "gpus_per_node": 8, "rdma_per_node": 2, "networks": ["ib-a"]})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="ib", cluster=cluster)
    return cluster, queue


def test_the_form_submits_a_network_and_the_job_page_shows_it(signed_in, world, ib):
    _, queue = ib
    client = signed_in(world.alpha_member)
    assert "Network of each replica" in client.get(reverse("frontend:job-submit")).content.decode()
    response = client.post(reverse("frontend:job-submit"), {
        **SPEC, "queue": queue.pk, "networks": "ib-a", "rdma_per_replica": "2"})
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert (job.networks, job.rdma_per_replica) == (["ib-a"], 2)
    page = client.get(response.url).content.decode()
    assert "attaches <span class=\"mono\">ib-a</span> · 2 RDMA devices per replica" in page
    # A copy keeps it.
    copy = client.get(reverse("frontend:job-submit"), {"from": job.pk}).context["form"]
    assert copy.initial["networks"] == "ib-a" and copy.initial["rdma_per_replica"] == 2


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"networks": "ib-z"}, "networks", "Cluster ib offers no network 'ib-z' to tenant alpha; "
                                       "it offers ib-a."),
    ({"networks": "IB"}, "networks", "is not a network name"),
    ({"rdma_per_replica": "3"}, "rdma_per_replica", "3 RDMA devices per replica, but the "
                                                    "largest node of cluster ib"),
])
def test_the_form_refuses_what_the_cluster_does_not_offer(signed_in, world, ib, change, field,
                                                          words):
    _, queue = ib
    response = signed_in(world.alpha_member).post(reverse("frontend:job-submit"),
                                                  {**SPEC, "queue": queue.pk, **change})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert words in " ".join(errors[field]), errors
    assert not Job.objects.exists()


def test_a_job_without_a_network_says_so(signed_in, world, ib):
    _, queue = ib
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                     command=["true"])
    page = signed_in(world.alpha_member).get(reverse("frontend:job", args=[job.pk]))
    assert "The cluster's default network" in page.content.decode()


def test_the_node_inventory_shows_rdma_devices(signed_in, world, ib):
    cluster, queue = ib
    job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
               command=["true"], rdma_per_replica=2)
    schedule_cluster(cluster_id=cluster.pk)
    page = signed_in(world.alpha_member).get(reverse("frontend:cluster", args=["ib"]))
    text = page.content.decode()
    assert "2 <span class=\"stat-unit\">of 4 RDMA devices allocated</span>" in text
    assert text.count('data-resource="rdma"') == 3  # the summary and each node's card
    assert "<strong>2</strong> / 2 devices" in text and "<strong>0</strong> / 2 devices" in text


def test_a_cluster_without_rdma_shows_none(signed_in, world, farm):
    page = signed_in(world.alpha_member).get(reverse("frontend:cluster", args=["farm"]))
    assert 'data-resource="rdma"' not in page.content.decode()


def test_the_quota_page_shows_and_edits_the_rdma_limit(signed_in, world):
    client = signed_in(world.operator)
    session = client.session
    session["tenant_id"] = world.alpha.pk
    session.save()
    response = client.post(reverse("frontend:quota-edit"), {
        "gpus": "8", "cpu_cores": "0", "memory_gib": "0", "storage_gib": "0",
        "rdma_devices": "4", "gpu_model_limits": ""})
    world.alpha.quota.refresh_from_db()
    assert response.status_code == 302, response.context["form"].errors
    assert world.alpha.quota.rdma_devices == 4
