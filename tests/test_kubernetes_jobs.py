"""Jobs on a Kubernetes cluster, end to end: the platform's cycle and reconcile drive the
kubernetes driver, which talks to a fake API server over HTTP through the official client."""

import logging
import time
from dataclasses import replace

import pytest

from aistation.choices import JobState
from aistation.models import Attempt
from aistation.services import scheduling
from aistation.services.attempts import attempt_workload
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.tasks import cancel_job
from infra_os.models import AuditEvent
from podsys.choices import NodeHealth
from podsys.drivers.base import Phase, Resources, Workload
from podsys.drivers.kube_schema import check_object
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_check_connection, cluster_create, cluster_sync_nodes
from tests.fakekube import fake_kube  # noqa: F401  (a fixture)

TOKEN_HINT = "kube-secret-token"
IMAGE = "registry.example.org/train:1"


@pytest.fixture
def kube(world, settings, fake_kube):  # noqa: F811
    """Four 8-GPU nodes behind a fake API server, registered as cluster `kube` with a queue
    `default` for tenant alpha."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    for i in range(4):
        fake_kube.add_node(f"gpu-{i}", gpus=8)
    cluster = cluster_create(
        actor=world.operator, name="kube", driver="kubernetes",
        options={"default_image": IMAGE, "data_dir": "/srv/ogai", "artifacts_claim": "ogai-data",
                 "retry_delay_s": 0},
        kubeconfig=fake_kube.kubeconfig(),
    )
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)

    def submit(*, gpus=8, replicas=1, max_restarts=0):
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                          name="train", command=["python", "train.py", "--steps", "10"],
                          gpus_per_replica=gpus, replicas=replicas, max_restarts=max_restarts)

    fake_kube.cluster = cluster
    fake_kube.submit = submit
    return fake_kube


def cycle(kube):
    return scheduling.schedule_cluster(cluster_id=kube.cluster.pk)


def reconcile(kube):
    return reconcile_cluster(cluster=kube.cluster)


def selector(job):
    return f"ogai.io/workload={job.attempts.order_by('-number').first().workload_id}"


def test_nodes_come_from_the_api_with_gpu_labels_taints_and_allocations(kube):
    nodes = {node.name: node for node in kube.cluster.nodes.all()}
    assert set(nodes) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    node = nodes["gpu-0"]
    assert (node.gpus, node.health, node.schedulable) == (8, NodeHealth.HEALTHY, True)
    assert node.gpu_model == node.labels["nvidia.com/gpu.product"] != ""
    assert node.gpu_memory_mib > 0
    assert node.gpus_in_use == 0
    # Where Ansible and metrics scrapes reach it: its InternalIP.
    assert node.address.startswith("192.168.0.")


def test_a_four_replica_job_is_one_indexed_job_and_a_headless_service_and_succeeds(kube):
    job = kube.submit(gpus=8, replicas=4)
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    [k8s_job] = kube.objects("Job", "ogai-alpha")
    [service] = kube.objects("Service", "ogai-alpha")
    check_object(k8s_job)
    check_object(service)
    spec = k8s_job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"],
            spec["backoffLimit"]) == ("Indexed", 4, 4, 0)
    assert service["spec"]["clusterIP"] == "None"
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["python", "train.py", "--steps", "10"]
    assert container["image"] == IMAGE
    env = {e["name"]: e for e in container["env"]}
    assert env["WORLD_SIZE"]["value"] == "4"
    assert env["MASTER_ADDR"]["value"].startswith(f"{k8s_job['metadata']['name']}-0.")
    assert "job-completion-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in ("8", 8)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/srv/ogai", "/dev/shm"} <= mounts  # noqa: S108  (a mount path, not a file)
    hosts = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert sorted(hosts) == sorted(job.placement)
    assert k8s_job["metadata"]["labels"]["ogai.io/job"] == str(job.pk)

    pods = kube.objects("Pod", "ogai-alpha")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(job.placement)
    kube.start_pods()
    kube.finish_pods(label_selector=selector(job), exit_code=0)
    reconcile(kube)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_an_oomkilled_pod_fails_the_attempt_and_the_job_is_retried_on_another_node(kube):
    job = kube.submit(gpus=8, max_restarts=1)
    cycle(kube)
    kube.start_pods()
    [pod] = kube.objects("Pod", "ogai-alpha")
    first_node = pod["spec"]["nodeName"]
    kube.oom(pod["metadata"]["name"])
    reconcile(kube)
    job.refresh_from_db()
    attempt = job.attempts.get(number=1)
    assert attempt.state == "failed"
    assert "OOMKilled" in attempt.reason
    assert job.state == JobState.QUEUED
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.placement != [first_node]


def test_cancel_deletes_every_object(kube, world):
    job = kube.submit(gpus=8, replicas=2)
    cycle(kube)
    kube.start_pods()
    job_cancel(actor=world.alpha_member, job=job)
    cancel_job(job_id=job.pk)
    for kind in ("Job", "Service", "Pod"):
        assert kube.objects(kind, "ogai-alpha") == []


def test_a_server_error_during_launch_is_retried(kube):
    kube.fail_next("POST", r"/jobs$", status=500)
    job = kube.submit(gpus=8)
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert len(kube.objects("Job", "ogai-alpha")) == 1


def test_launching_again_is_already_launched(kube):
    job = kube.submit(gpus=8)
    cycle(kube)
    attempt = Attempt.objects.get(job=job)
    driver = driver_for(kube.cluster)
    assert driver.launch(attempt_workload(attempt)) == attempt.workload_id
    assert len(kube.objects("Job", "ogai-alpha")) == 1
    assert len(kube.objects("Service", "ogai-alpha")) == 1


def test_a_node_going_notready_takes_the_lost_node_path(kube):
    job = kube.submit(gpus=8, max_restarts=1)
    cycle(kube)
    kube.start_pods()
    job.refresh_from_db()
    [node] = job.placement
    kube.set_node_ready(node, False)
    reconcile(kube)
    job.refresh_from_db()
    assert job.attempts.get(number=1).state == "failed"
    assert node in job.excluded_nodes
    cluster_sync_nodes(cluster=kube.cluster)
    assert kube.cluster.nodes.get(name=node).health == NodeHealth.NOT_READY
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and node not in job.placement


def test_the_connection_check_says_what_the_cluster_offers(kube, world):
    report = cluster_check_connection(actor=world.operator, cluster=kube.cluster)
    assert report.ok
    assert report.details["gpus"] == 32 and report.details["kueue"] is False
    assert "nvidia.com/gpu" in report.message and "Kubernetes v" in report.message


def test_the_kubeconfig_never_shows(kube, world, api, caplog):
    caplog.set_level(logging.DEBUG)
    token = kube.token
    client = api.as_user(world.operator)
    created = client.post("/api/v1/podsys/clusters/", {
        "name": "kube2", "driver": "kubernetes", "kubeconfig": kube.kubeconfig(),
        "options": {"default_image": IMAGE}}, format="json")
    assert created.status_code == 201, created.content
    listed = client.get("/api/v1/podsys/clusters/kube2/")
    kube.refuse_connections()
    checked = client.post("/api/v1/podsys/clusters/kube2/check/")
    assert checked.status_code == 200 and checked.json()["ok"] is False
    kube.accept_connections()
    refused = client.post("/api/v1/podsys/clusters/", {
        "name": "kube3", "driver": "kubernetes", "kubeconfig": f"not: [a kubeconfig {token}"},
        format="json")
    assert refused.status_code == 400
    texts = [created.content.decode(), listed.content.decode(), checked.content.decode(),
             refused.content.decode(), caplog.text,
             *(str(e.changes) for e in AuditEvent.objects.all())]
    assert all(token not in text for text in texts)
    stored = kube.cluster.__class__.objects.get(name="kube2").credentials
    assert stored and token not in stored


def test_logs_come_from_each_replica_with_a_tail(kube):
    job = kube.submit(gpus=8, replicas=2)
    cycle(kube)
    kube.start_pods()
    attempt = job.attempts.get()
    pods = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p
            for p in kube.objects("Pod", "ogai-alpha")}
    kube.set_logs(pods["1"]["metadata"]["name"], "step 1\nstep 2\nstep 3\n")
    driver = driver_for(kube.cluster)
    assert driver.logs(attempt.workload_id, replica=1, tail=2) == "step 2\nstep 3\n"
    assert driver.logs(attempt.workload_id, replica=0) == ""


def test_a_pod_the_cluster_cannot_place_stays_pending_in_the_schedulers_words(kube):
    job = kube.submit(gpus=8)
    cycle(kube)
    workload = attempt_workload(job.attempts.get())
    # Placed (by someone else's view of the cluster) on a node the cluster does not have.
    elsewhere = replace(workload, id="job-999-a1", placement=("gpu-9",))
    driver = driver_for(kube.cluster)
    driver.launch(elsewhere)
    status = driver.status([elsewhere.id])[elsewhere.id]
    assert status.phase == Phase.PENDING
    assert "Unschedulable" in status.replicas[0].reason


def test_an_image_that_cannot_be_pulled_fails_the_attempt_with_the_clusters_words(kube):
    kube.fail_image_pulls(IMAGE)
    job = kube.submit(gpus=8)
    cycle(kube)
    kube.start_pods()
    reconcile(kube)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "ImagePullBackOff" in job.reason and IMAGE in job.reason


def test_the_check_sees_kueue_and_volcano(kube, world):
    kube.kueue = True
    kube.volcano = True
    report = cluster_check_connection(actor=world.operator, cluster=kube.cluster)
    assert report.details["kueue"] and report.details["volcano"]
    assert "Kueue is installed" in report.message


def test_finished_jobs_are_deleted_past_the_retention_with_their_logs_kept(kube):
    job = kube.submit(gpus=8, replicas=2)
    cycle(kube)
    kube.start_pods()
    for pod in kube.objects("Pod", "ogai-alpha"):
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        kube.set_logs(pod["metadata"]["name"], f"rank {index} done\n")
    kube.finish_pods(label_selector=selector(job), exit_code=0)
    reconcile(kube)
    workload = job.attempts.get().workload_id
    driver = driver_for(kube.cluster)
    assert driver.cleanup(now=time.time()) == 0  # within the retention (an hour by default)
    assert len(kube.objects("Job", "ogai-alpha")) == 1
    assert driver.cleanup(now=time.time() + 3601) == 1
    for kind in ("Job", "Service", "Pod"):
        assert kube.objects(kind, "ogai-alpha") == []
    assert driver.logs(workload, replica=1) == "rank 1 done\n"
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_the_inventory_counts_every_pods_gpus_and_keeps_taints_and_cordons(kube):
    kube.add_node("gpu-cordoned", gpus=4, unschedulable=True,
                  taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    job = kube.submit(gpus=8)
    cycle(kube)
    cluster_sync_nodes(cluster=kube.cluster)
    job.refresh_from_db()
    [busy] = job.placement
    nodes = {node.name: node for node in kube.cluster.nodes.all()}
    assert nodes[busy].gpus_in_use == 8
    assert nodes["gpu-cordoned"].schedulable is False
    assert nodes["gpu-cordoned"].taints == ["nvidia.com/gpu=present:NoSchedule"]
    assert "cordoned" in nodes["gpu-cordoned"].health_reason


def service_workload(**fields):
    return Workload(id="svc-7-a1", command=("python", "-m", "serve"),
                    resources=Resources(gpus=1, cpu_cores=2, memory_mib=4096), replicas=2,
                    ports=(8000,), service=True, image=IMAGE,
                    labels={"ogai.job": "7", "ogai.attempt": "1", "ogai.tenant": "alpha"},
                    **fields)


def test_a_service_is_a_deployment_behind_a_service_and_answers_at_its_endpoint(kube):
    driver = driver_for(kube.cluster)
    workload = service_workload()
    driver.launch(workload)
    [deployment] = kube.objects("Deployment", "ogai-alpha")
    assert deployment["spec"]["replicas"] == 2
    assert driver.status([workload.id])[workload.id].phase == Phase.PENDING
    kube.start_pods()
    assert driver.status([workload.id])[workload.id].phase == Phase.RUNNING
    assert driver.endpoint(workload.id) == "http://svc-7-a1.ogai-alpha.svc:8000"
    # A pod evicted under a service is replaced: the replacement speaks for it, not the dead.
    evicted = kube.objects("Pod", "ogai-alpha")[0]["metadata"]["name"]
    kube.finish_pod(evicted, exit_code=137, reason="Evicted")
    assert driver.status([workload.id])[workload.id].phase == Phase.PENDING
    kube.start_pods()
    assert driver.status([workload.id])[workload.id].phase == Phase.RUNNING
    driver.cancel(workload.id)
    for kind in ("Deployment", "Service", "Pod"):
        assert kube.objects(kind, "ogai-alpha") == []


def test_with_volcano_a_gang_is_a_pod_group_of_all_its_replicas(kube, world):
    kube.volcano = True
    cluster = cluster_create(actor=world.operator, name="kube-volcano", driver="kubernetes",
                             options={"default_image": IMAGE, "scheduler": "volcano",
                                      "retry_delay_s": 0},
                             kubeconfig=kube.kubeconfig())
    driver = driver_for(cluster)
    workload = replace(service_workload(), id="job-8-a1", service=False, ports=(),
                       placement=("gpu-0", "gpu-1"))
    driver.launch(workload)
    [group] = kube.objects("PodGroup", "ogai-alpha")
    assert group["spec"]["minMember"] == 2
    [job] = kube.objects("Job", "ogai-alpha")
    assert job["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    driver.cancel(workload.id)
    assert kube.objects("PodGroup", "ogai-alpha") == []
