"""A job's network (`network: {attachments, rdma}`) through the platform: the API validates it
and refuses in words what the cluster does not offer; RDMA devices are placed like GPUs (a
replica fits a node only if both fit) and count against the tenant's RDMA quota; the workload
carries it to the driver."""

from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError

from aistation.choices import JobState
from aistation.models import Job
from aistation.services.jobs import job_submit
from aistation.services.manifests import job_manifests
from aistation.services.queues import queue_create
from aistation.services.workloads import attempt_workload
from infra_os.services.quotas import quota_update
from podsys.drivers.fake import fake_cluster
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_sync_nodes

JOBS = "/api/v1/aistation/jobs/"


@pytest.fixture
def ib(world, settings):
    """A fake cluster `ib` of 2 nodes x 8 GPUs x 2 RDMA devices offering network `ib-a`, and
    alpha's queue `ib` on it; `farm` (no RDMA, no networks) is beside it."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    cluster = Cluster.objects.create(name="ib", driver="fake", options={
        "nodes": 2, "gpus_per_node": 8, "rdma_per_node": 2, "networks": ["ib-a", "ib-b"]})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="ib", cluster=cluster)

    def submit(*, gpus=1, replicas=1, rdma=0, networks=(), name="work", duration=None,
               **extra):
        env = {"OGAI_FAKE_DURATION_S": str(duration)} if duration is not None else {}
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name=name,
                          command=["python", "train.py"], env=env, gpus_per_replica=gpus,
                          replicas=replicas, rdma_per_replica=rdma, networks=list(networks),
                          **extra)

    from aistation.services.scheduling import schedule_cluster

    def cycle():
        return schedule_cluster(cluster_id=cluster.pk)

    return SimpleNamespace(cluster=cluster, queue=queue, submit=submit, cycle=cycle,
                           fake=fake_cluster("ib"))


def spec(**changes):
    base = {"tenant": "alpha", "queue": "ib", "name": "train",
            "command": ["python", "-c", "print(1)"], "resources": {"gpus": 1}}
    base.update(changes)
    return base


def fresh(job: Job) -> Job:
    job.refresh_from_db()
    return job


# -- the API --------------------------------------------------------------------------------


def test_the_api_takes_a_network_and_shows_it(api, world, ib):
    response = api.as_user(world.alpha_member).post(
        JOBS, spec(network={"attachments": ["ib-a"], "rdma": 2}), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["network"] == {"attachments": ["ib-a"], "rdma": 2}
    job = Job.objects.get(pk=body["id"])
    assert (job.networks, job.rdma_per_replica) == (["ib-a"], 2)
    # Left out: the default network only, shown so.
    response = api.as_user(world.alpha_member).post(JOBS, spec(), format="json")
    assert response.json()["network"] == {"attachments": [], "rdma": 0}


@pytest.mark.parametrize(("network", "field"), [
    ({"rdma": -1}, "network.rdma"),
    ({"rdma": "2"}, "network.rdma"),
    ({"rdma": 1.5}, "network.rdma"),
    ({"rdma": True}, "network.rdma"),
    ({"attachments": ["IB_A"]}, "network.attachments"),
    ({"attachments": ["ib-a", "ib-a"]}, "network.attachments"),
    ({"attachments": "ib-a"}, "network.attachments"),
    ({"bandwidth": 100}, "network.bandwidth"),
    ({"attachments": ["ib-c"]}, "network.attachments"),
    ({"rdma": 3}, "network.rdma"),
])
def test_a_bad_network_answers_400_naming_the_field(api, world, ib, network, field):
    response = api.as_user(world.alpha_member).post(JOBS, spec(network=network), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert any(name == field or name.startswith(f"{field}.") or name.startswith(f"{field}[")
               for name in body["fields"]), body
    assert not Job.objects.exists()


def test_an_unknown_attachment_is_refused_naming_those_offered(api, world, ib):
    response = api.as_user(world.alpha_member).post(
        JOBS, spec(network={"attachments": ["ib-c"]}), format="json")
    assert response.json()["fields"]["network.attachments"] == [
        "Cluster ib offers no network 'ib-c' to tenant alpha; it offers ib-a, ib-b."]


def test_rdma_on_a_cluster_without_any_is_refused_at_submission_in_words(api, world, farm):
    response = api.as_user(world.alpha_member).post(
        JOBS, spec(queue="default", network={"rdma": 1}), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["fields"]["network.rdma"] == [
        "Cluster farm offers no RDMA devices: no node advertises fake RDMA devices (option "
        "rdma_per_node); ask for rdma: 0 or submit to a cluster that has them."]
    response = api.as_user(world.alpha_member).post(
        JOBS, spec(queue="default", network={"attachments": ["ib-a"]}), format="json")
    assert response.json()["fields"]["network.attachments"] == [
        "Cluster farm offers no network 'ib-a' to tenant alpha; it offers none."]
    assert not Job.objects.exists()


def test_more_rdma_than_the_gang_can_hold_is_refused(ib):
    with pytest.raises(ValidationError) as info:
        ib.submit(rdma=2, replicas=3)
    assert info.value.message_dict["replicas"] == [
        "3 replicas of 2 RDMA devices need 6; cluster ib has 4."]


def test_a_kubernetes_cluster_without_an_rdma_resource_says_so(world):
    cluster = Cluster.objects.create(name="kube", driver="kubernetes",
                                     options={"default_image": "img"})
    Node.objects.create(cluster=cluster, name="n1", gpus=8, cpu_cores=64, memory_mib=512 * 1024)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="k", cluster=cluster)
    with pytest.raises(ValidationError) as info:
        job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                   command=["true"], rdma_per_replica=1)
    assert info.value.message_dict["network.rdma"] == [
        "Cluster kube offers no RDMA devices: it names no RDMA resource (its driver option "
        "rdma_resource); ask for rdma: 0 or submit to a cluster that has them."]
    cluster.options = {"default_image": "img", "rdma_resource": "rdma/rdma_shared_device_a"}
    cluster.save()
    with pytest.raises(ValidationError) as info:
        job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                   command=["true"], rdma_per_replica=1)
    assert info.value.message_dict["network.rdma"] == [
        "Cluster kube offers no RDMA devices: no node advertises rdma/rdma_shared_device_a; "
        "ask for rdma: 0 or submit to a cluster that has them."]


# -- placement ------------------------------------------------------------------------------


def test_nodes_report_their_rdma_devices(ib):
    assert sorted(Node.objects.filter(cluster=ib.cluster).values_list("rdma_devices", flat=True)
                  ) == [2, 2]


def test_a_gang_needing_2_rdma_each_never_lands_twice_on_a_node_offering_2(ib):
    job = ib.submit(gpus=1, replicas=2, rdma=2)
    ib.cycle()
    job = fresh(job)
    assert job.state == JobState.RUNNING
    # Its GPUs would fit one node twice over: the RDMA devices spread it.
    assert len(set(job.placement)) == 2
    assert sorted(n.rdma_allocated for n in ib.fake._nodes.values()) == [2, 2]


def test_a_replica_waits_in_words_while_the_rdma_devices_are_held(ib):
    first = ib.submit(gpus=1, replicas=2, rdma=2, name="first", duration=100)
    second = ib.submit(gpus=1, rdma=1, name="second")
    plain = ib.submit(gpus=1, name="plain")
    ib.cycle()
    assert fresh(first).state == JobState.RUNNING
    # GPUs are free on both nodes (7 each), RDMA devices on none.
    second = fresh(second)
    assert second.state == JobState.QUEUED
    assert "1 RDMA device asked, 0 free on node" in second.reason, second.reason
    assert fresh(plain).state == JobState.RUNNING  # the GPUs alone still take work


def test_a_gang_waits_in_words_when_rdma_binds(ib):
    ib.submit(gpus=1, rdma=1, name="holder", duration=100)
    gang = ib.submit(gpus=1, replicas=2, rdma=2, name="gang")
    ib.cycle()
    gang = fresh(gang)
    assert gang.state == JobState.QUEUED
    assert "RDMA devices" in gang.reason, gang.reason


def test_the_rdma_quota_counts_rdma_devices(ib, world):
    quota_update(actor=world.operator, quota=world.alpha.quota, rdma_devices=2)
    first = ib.submit(gpus=1, rdma=2, name="first", duration=100)
    second = ib.submit(gpus=1, rdma=1, name="second")
    ib.cycle()
    assert fresh(first).state == JobState.RUNNING
    second = fresh(second)
    assert second.state == JobState.QUEUED
    assert second.reason == "waiting: tenant quota 2/2 RDMA devices in use, job needs 1"
    # One bigger than the whole quota never fits, and says so.
    big = ib.submit(gpus=1, replicas=2, rdma=2, name="big")
    ib.cycle()
    big = fresh(big)
    assert big.state == JobState.FAILED
    assert "more than the tenant's RDMA quota of 2" in big.reason, big.reason


def test_the_workload_carries_the_network_to_the_driver(ib):
    job = ib.submit(gpus=1, rdma=1, networks=["ib-b", "ib-a"])
    ib.cycle()
    attempt = fresh(job).attempts.get()
    workload = attempt_workload(attempt)
    assert workload.resources.rdma == 1
    assert workload.networks == ("ib-b", "ib-a")
    text = job_manifests(job=job)
    assert "network: attachments ib-b, ib-a; 1 RDMA device per replica" in text, text


def test_a_rerun_keeps_the_network(ib, world):
    from aistation.services.jobs import job_cancel, job_rerun
    job = ib.submit(gpus=1, rdma=1, networks=["ib-a"])
    job_cancel(actor=world.alpha_member, job=job)
    again = job_rerun(actor=world.alpha_member, job=fresh(job))
    assert (again.networks, again.rdma_per_replica) == (["ib-a"], 1)


def test_submitting_rdma_to_a_local_cluster_without_devices_is_refused(world, tmp_path,
                                                                       settings):
    settings.OGAI_SINGLE_TENANT = True  # no bubblewrap needed for this one
    cluster = Cluster.objects.create(name="here", driver="local", options={
        "root": str(tmp_path / "cluster"), "rdma_device_dir": str(tmp_path / "none")})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)
    with pytest.raises(ValidationError) as info:
        job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                   command=["true"], rdma_per_replica=1)
    assert info.value.message_dict["network.rdma"] == [
        f"Cluster here offers no RDMA devices: this machine has no RDMA devices (none in "
        f"{tmp_path / 'none'}); ask for rdma: 0 or submit to a cluster that has them."]
    with pytest.raises(ValidationError) as info:
        job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                   command=["true"], networks=["ib"])
    assert info.value.message_dict["network.attachments"] == [
        "Cluster here attaches no extra networks (the local driver runs jobs on this "
        "machine's own network; it attaches no extra networks); leave network.attachments "
        "empty."]
    # With devices it is taken.
    (tmp_path / "ib").mkdir()
    (tmp_path / "ib" / "mlx5_0").mkdir()
    cluster.options = {**cluster.options, "rdma_device_dir": str(tmp_path / "ib")}
    cluster.save()
    cluster_sync_nodes(cluster=cluster)
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="x",
                     command=["true"], rdma_per_replica=1)
    assert job.rdma_per_replica == 1
