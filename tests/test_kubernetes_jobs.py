"""Jobs on a Kubernetes cluster, end to end: the platform's cycle and reconcile drive the
kubernetes driver, which talks to a fake API server over HTTP through the official client."""

import base64
import json
import logging
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from django.conf import settings as django_settings
from kubernetes import client

from aistation.choices import JobState
from aistation.models import Attempt
from aistation.services import scheduling
from aistation.services.attempts import attempt_workload
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.manifests import job_manifests
from aistation.services.notebooks import notebook_start
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.workloads import job_checkpoint_dir, tenant_uid
from aistation.tasks import cancel_job
from infra_os.models import AuditEvent
from podsys.choices import NodeHealth
from podsys.drivers.base import (
    ROLE_LABEL,
    ROLE_MODEL_CLIENT,
    ROLE_MODEL_SERVER,
    DataMount,
    DriverError,
    Phase,
    Resources,
    Workload,
)
from podsys.drivers.kube_schema import check_object
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_check_connection, cluster_create, cluster_sync_nodes
from tests.fakekube import fake_kube  # noqa: F401  (a fixture)
from tests.fakekube.server import CORE_PATH, GROUPED_PATH

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
        # The claim holds the platform's data directory, seen at the same path in the pods.
        options={"default_image": IMAGE, "data_dir": str(settings.DATA_DIR),
                 "artifacts_claim": "ogai-data", "retry_delay_s": 0},
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
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    checkpoints = str(job_checkpoint_dir(job))
    assert {checkpoints, "/dev/shm"} <= set(mounts)  # noqa: S108  (a mount path, not a file)
    assert mounts[checkpoints]["subPath"] and not mounts[checkpoints]["readOnly"]
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


# The tenant boundary on the cluster: what a pod runs as, sees, holds and reaches -------------

NAMESPACE_POLICIES = {"ogai-default-deny", "ogai-allow-dns", "ogai-allow-platform"}
PLATFORM = {"app.kubernetes.io/name": "ogai"}


def set_options(kube, **options):
    kube.cluster.options = {**kube.cluster.options, **options}
    kube.cluster.save(update_fields=["options"])
    return driver_for(kube.cluster)


def health_workload():
    """Shaped as podsys.services.health makes one: the platform's own, no tenant uid."""
    return Workload(id="hc-5", command=("nvidia-smi",), resources=Resources(gpus=8),
                    replicas=2, placement=("gpu-2", "gpu-3"), image=IMAGE,
                    labels={"ogai.health-check": "nccl", "ogai.tenant": "ogai-health"})


def pod_named(kube, workload_id):
    return next(p for p in kube.pods(f"ogai.io/workload={workload_id}"))


def test_no_pod_runs_as_root_holds_a_token_or_sees_the_data_directory(kube, world, settings):
    data = settings.DATA_DIR
    dataset = DataMount(path=str(data / "datasets" / "7" / "v1"), read_only=True)
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=kube.cluster.queues
                     .get(), name="tokenize", command=["python", "-m", "ylink.runners.data"],
                     gpus_per_replica=0, mounts=[dataset])
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING, job.reason
    driver = driver_for(kube.cluster)
    driver.launch(service_workload(checkpoint_dir=str(data / "jobs" / "7-x" / "checkpoints"),
                                   run_as=1_000_000_007))
    driver.launch(health_workload())
    for namespace in ("ogai-alpha", "ogai-ogai-health"):
        labels = kube.get("Namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Every kind of workload got its pods past the restricted level (the fake enforces it).
    pods = kube.objects("Pod")
    kinds = {p["metadata"]["labels"]["ogai.io/workload"] for p in pods}
    assert kinds == {job.attempts.get().workload_id, "svc-7-a1", "hc-5"}
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        claim = {v["name"] for v in spec["volumes"]
                 if v.get("persistentVolumeClaim", {}).get("claimName") == "ogai-data"}
        for mount in spec["containers"][0]["volumeMounts"]:
            assert mount["mountPath"] not in (str(data), "/")
            if mount["name"] in claim:  # never the claim's root: a folder of its own
                assert mount["subPath"] and str(data / mount["subPath"]) == mount["mountPath"]
        env = kube.container_env(pod["metadata"]["name"])
        assert "OGAI_DATA_DIR" not in env
    batch = pod_named(kube, job.attempts.get().workload_id)
    mounts = {m["mountPath"]: m for m in batch["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[dataset.path]["readOnly"] is True
    assert mounts[str(job_checkpoint_dir(job))]["readOnly"] is False
    assert batch["spec"]["securityContext"]["runAsUser"] == tenant_uid(world.alpha.pk)


def test_a_folder_outside_the_data_directory_is_refused_before_anything_is_sent(kube):
    driver = driver_for(kube.cluster)
    sent = len(kube.requests)
    for path in ("/etc", "/", f"{kube.cluster.options['data_dir']}/../etc"):
        escaping = service_workload(data_mounts=(DataMount(path),))
        with pytest.raises(DriverError, match=re.escape(repr(path))):
            driver.launch(escaping)
    assert [r for r in kube.requests[sent:] if r[0] != "GET"] == []
    assert kube.objects("Deployment") == [] and kube.objects("Secret") == []


def test_an_existing_namespace_is_brought_to_the_restricted_level_and_its_policies_back(kube):
    kube.add_namespace("ogai-alpha", labels={"pod-security.kubernetes.io/enforce": "privileged",
                                             "team": "vision"})
    driver = driver_for(kube.cluster)
    driver.launch(service_workload())
    labels = kube.get("Namespace", "ogai-alpha")["metadata"]["labels"]
    assert labels["team"] == "vision"  # the operator's own labels stay
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    names = {p["metadata"]["name"] for p in kube.objects("NetworkPolicy", "ogai-alpha")}
    assert names == NAMESPACE_POLICIES | {"svc-7-a1"}
    # Someone loosens the namespace: the next launch puts it right.
    net = client.NetworkingV1Api(driver.api)
    net.delete_namespaced_network_policy("ogai-default-deny", "ogai-alpha")
    loose = kube.get("NetworkPolicy", "ogai-allow-dns", "ogai-alpha")
    loose["spec"] = {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}  # anywhere
    net.replace_namespaced_network_policy("ogai-allow-dns", "ogai-alpha", loose)
    client.CoreV1Api(driver.api).patch_namespace(
        "ogai-alpha", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}},
        _content_type="application/merge-patch+json")
    driver.launch(replace(service_workload(), id="svc-8-a1"))
    policies = {p["metadata"]["name"]: p for p in kube.objects("NetworkPolicy", "ogai-alpha")}
    assert set(policies) == NAMESPACE_POLICIES | {"svc-7-a1", "svc-8-a1"}
    assert policies["ogai-default-deny"]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policies["ogai-allow-dns"]["spec"]["egress"][0]["ports"][0]["port"] == 53
    labels = kube.get("Namespace", "ogai-alpha")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Once right, a launch only reads them: it writes nothing but the workload's own objects.
    sent = len(kube.request_details)
    driver.launch(replace(service_workload(), id="svc-10-a1"))
    writes = [(r["method"], r["path"]) for r in kube.request_details[sent:] if r["method"] != "GET"]
    assert all(path.endswith(("/networkpolicies", "/services", "/deployments"))
               and method == "POST" for method, path in writes), writes
    assert len(writes) == 3
    # With the platform nowhere configured, no policy lets pods reach it.
    set_options(kube, platform_namespace="").launch(replace(service_workload(), id="svc-9-a1"))
    names = {p["metadata"]["name"] for p in kube.objects("NetworkPolicy", "ogai-alpha")}
    assert "ogai-allow-platform" not in names


def test_a_notebooks_tokens_are_in_its_secret_only_and_go_with_it(kube, world):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=kube.cluster.queues.get(), name="explore", image="lab:1")
    cycle(kube)
    attempt = notebook.job.attempts.get()
    secrets = attempt_workload(attempt).secret_env
    tokens = [secrets["JUPYTER_TOKEN"], secrets["OGAI_TOKEN"]]
    [secret] = kube.objects("Secret", "ogai-alpha")
    assert set(secret["data"]) == {"JUPYTER_TOKEN", "OGAI_TOKEN"}
    assert base64.b64decode(secret["data"]["OGAI_TOKEN"]).decode() == secrets["OGAI_TOKEN"]
    kube.start_pods()
    [pod] = kube.objects("Pod", "ogai-alpha")
    assert pod["status"]["phase"] == "Running"  # the Secret was there before the pod
    env = kube.container_env(pod["metadata"]["name"])
    assert [env["JUPYTER_TOKEN"], env["OGAI_TOKEN"]] == tokens  # the process gets them
    # What a person may read: every other object on the cluster, and the rendered manifests.
    readable = [kube.objects(kind) for kind in ("Pod", "Deployment", "Service", "NetworkPolicy",
                                                "Namespace", "Event")]
    rendered = job_manifests(job=notebook.job)
    for text in (json.dumps(readable), rendered):
        assert all(token not in text for token in tokens)
    assert "JUPYTER_TOKEN" in rendered and "OGAI_TOKEN" in rendered
    job_cancel(actor=world.alpha_member, job=notebook.job)
    cancel_job(job_id=notebook.job.pk)
    assert kube.objects("Secret", "ogai-alpha") == []
    assert {p["metadata"]["name"] for p in kube.objects("NetworkPolicy", "ogai-alpha")} == \
        NAMESPACE_POLICIES


def test_a_launch_that_fails_leaves_no_secret_behind(kube):
    kube.fail_next("POST", r"/deployments$", status=403)
    driver = driver_for(kube.cluster)
    with pytest.raises(DriverError, match="403"):
        driver.launch(service_workload(secret_env={"OGAI_TOKEN": "ogai_leaked"}))
    assert kube.objects("Secret", "ogai-alpha") == []
    assert kube.objects("Service", "ogai-alpha") == []
    assert "svc-7-a1" not in {p["metadata"]["name"] for p in kube.objects("NetworkPolicy")}


@pytest.fixture
def network(kube):
    """The platform's pod (API and gateway on 8000) in ogai-system, CoreDNS and another system
    pod in kube-system; the cluster's options name the platform's pods."""
    kube.add_namespace("ogai-system")
    kube.platform = kube.add_pod("ogai-system", "ogai-web", PLATFORM, ports=(8000,))
    kube.grafana = kube.add_pod("ogai-system", "grafana", {"app": "grafana"}, ports=(3000,))
    kube.dns = kube.add_pod("kube-system", "coredns", {"k8s-app": "kube-dns"}, ports=(53,))
    kube.metrics = kube.add_pod("kube-system", "metrics-server", {"k8s-app": "metrics"},
                                ports=(443,))
    kube.driver = set_options(kube, platform_pod_labels=PLATFORM, platform_ports=[8000])
    return kube


def test_pods_reach_only_their_gang_dns_and_the_platform(network, world):
    kube = network
    job = kube.submit(gpus=8, replicas=2)
    cycle(kube)
    other = replace(service_workload(), id="job-90-a1", service=False, ports=(), replicas=1,
                    resources=Resources(gpus=0), placement=("gpu-2",),
                    labels={"ogai.job": "90", "ogai.attempt": "1", "ogai.tenant": "beta"})
    kube.driver.launch(other)
    kube.driver.launch(replace(service_workload(), replicas=1, resources=Resources(gpus=0)))
    kube.start_pods()
    rank0, rank1 = sorted(kube.pods(selector(job)), key=lambda p: p["metadata"]["name"])
    beta = pod_named(kube, "job-90-a1")
    model = pod_named(kube, "svc-7-a1")
    allowed = [
        (rank0, rank1, 29500), (rank1, rank0, 40000),  # rendezvous and NCCL, any port
        (rank0, kube.dns, 53), (beta, kube.dns, 53),
        (rank0, kube.platform, 8000), (model, kube.platform, 8000),  # report back, the API
        (kube.platform, model, 8000),  # the gateway calls the replica
    ]
    refused = [
        (rank0, beta, 29500), (beta, rank0, 29500),  # across tenants, either way
        (beta, model, 8000), (rank0, model, 8000),  # a replica takes the gateway only
        (kube.platform, model, 22), (kube.platform, rank0, 29500),
        (rank0, kube.platform, 5432), (rank0, kube.grafana, 3000),  # only the platform's API
        (rank0, kube.metrics, 443), (rank0, kube.dns, 80),
        (rank0, "8.8.8.8", 443), (rank0, "169.254.169.254", 80),  # the internet, the metadata
        ("198.51.100.9", model, 8000), ("198.51.100.9", rank0, 29500),  # from outside
    ]
    for source, target, port in allowed:
        assert kube.can_connect(source, target, port, "UDP" if port == 53 else "TCP"), port
    for source, target, port in refused:
        assert not kube.can_connect(source, target, port), (source, target, port)


def test_a_model_servers_own_tenants_evaluation_reaches_it_and_nothing_else_does(network):
    """An endpoint evaluation calls the replica itself (with the deployment's key): the replica
    takes the model clients of its own namespace, a notebook takes none, another tenant's
    model client is refused."""
    kube = network
    alpha = {"ogai.job": "7", "ogai.attempt": "1", "ogai.tenant": "alpha"}
    one = {"replicas": 1, "resources": Resources(gpus=0)}
    kube.driver.launch(replace(service_workload(), **one,
                               labels={**alpha, ROLE_LABEL: ROLE_MODEL_SERVER}))
    kube.driver.launch(replace(service_workload(), id="nb-8-a1", **one,
                               labels={**alpha, "ogai.job": "8"}))
    for job, tenant in ((20, "alpha"), (21, "beta")):
        kube.driver.launch(replace(
            service_workload(), id=f"job-{job}-a1", service=False, ports=(), **one,
            placement=("gpu-2",), labels={"ogai.job": str(job), "ogai.attempt": "1",
                                          "ogai.tenant": tenant, ROLE_LABEL: ROLE_MODEL_CLIENT}))
    kube.start_pods()
    model, notebook = pod_named(kube, "svc-7-a1"), pod_named(kube, "nb-8-a1")
    evaluation, beta = pod_named(kube, "job-20-a1"), pod_named(kube, "job-21-a1")
    assert kube.can_connect(evaluation, model, 8000)
    assert not kube.can_connect(evaluation, model, 22)
    assert not kube.can_connect(evaluation, notebook, 8000)
    assert not kube.can_connect(beta, model, 8000)


def test_a_platform_outside_the_cluster_is_reached_by_its_addresses_only(kube):
    driver = set_options(kube, platform_namespace="", platform_cidrs=["203.0.113.7/32"])
    driver.launch(replace(service_workload(), replicas=1, resources=Resources(gpus=0)))
    driver.launch(replace(service_workload(), id="job-91-a1", service=False, ports=(),
                          replicas=1, resources=Resources(gpus=0), placement=("gpu-1",)))
    kube.start_pods()
    model, batch = pod_named(kube, "svc-7-a1"), pod_named(kube, "job-91-a1")
    assert kube.can_connect("203.0.113.7", model, 8000)
    assert not kube.can_connect("203.0.113.8", model, 8000)
    assert kube.can_connect(batch, "203.0.113.7", 443)
    assert not kube.can_connect(batch, "203.0.113.8", 443)
    assert not kube.can_connect("203.0.113.7", batch, 29500)  # a batch pod takes no one in


def _granted(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
               and verb in rule["verbs"] for rule in rules)


def test_the_service_accounts_rights_cover_every_call_the_driver_makes(kube, world):
    """platform/kubernetes/rbac/rbac.yaml, against what the driver really sends in a workload's
    whole life: a namespace found without its labels, launches with secrets, status, logs,
    cancel."""
    rbac = Path(django_settings.BASE_DIR) / "platform" / "kubernetes" / "rbac" / "rbac.yaml"
    documents = yaml.safe_load_all(rbac.read_text())
    rules = [rule for doc in documents if doc["kind"] == "ClusterRole" for rule in doc["rules"]]
    kube.add_namespace("ogai-alpha")  # made by someone else: patched
    driver = driver_for(kube.cluster)
    cluster_check_connection(actor=world.operator, cluster=kube.cluster)
    driver.launch(service_workload(secret_env={"OGAI_TOKEN": "t"}))
    driver.launch(health_workload())
    kube.start_pods()
    driver.status(["svc-7-a1", "hc-5"])
    driver.logs("svc-7-a1")
    set_options(kube, platform_namespace="").launch(replace(service_workload(), id="svc-8-a1"))
    driver.cancel("svc-7-a1")
    driver.cancel("hc-5")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    calls = set()
    for request in kube.request_details:
        match = CORE_PATH.match(request["path"]) or GROUPED_PATH.match(request["path"])
        if match is None:  # discovery
            assert any(request["path"] == url or (url.endswith("*") and request["path"]
                                                       .startswith(url[:-1]))
                       for rule in rules for url in rule.get("nonResourceURLs", [])), request
            continue
        parts = match.groupdict()
        resource = parts["plural"] + (f"/{parts['sub']}" if parts["sub"] else "")
        verb = verbs.get(request["method"]) or (
            "get" if parts["name"] else
            "watch" if request["query"].get("watch") in ("true", "1") else "list")
        calls.add((parts.get("group") or "", resource, verb))
    assert {("", "secrets", "create"), ("", "secrets", "delete"), ("", "namespaces", "patch"),
            ("networking.k8s.io", "networkpolicies", "create")} <= calls
    assert ("", "secrets", "get") not in calls and ("", "secrets", "list") not in calls
    for group, resource, verb in sorted(calls):
        assert _granted(rules, group, resource, verb), (group, resource, verb)


RDMA = "rdma/rdma_shared_device_a"


def test_an_rdma_job_runs_in_the_tenants_rdma_namespace_on_nodes_that_offer_devices(kube, world):
    """From submission to a running pod: the nodes' RDMA devices in the inventory, placement by
    them, the pod with the attachment, the devices and IPC_LOCK in the tenant's RDMA namespace
    (Pod Security `privileged` there, enforced by the fake API server), and the devices held."""
    for name in ("ib-0", "ib-1"):
        kube.add_node(name, gpus=8, extended={RDMA: "2"})
    set_options(kube, rdma_resource=RDMA, networks={
        "ib": {"definition": "net-system/ib-sriov", "interface": "ib0", "hcas": ["mlx5_0"]}})
    cluster_sync_nodes(cluster=kube.cluster)
    nodes = {node.name: node for node in kube.cluster.nodes.all()}
    assert (nodes["ib-0"].rdma_devices, nodes["ib-0"].rdma_in_use) == (2, 0)
    assert nodes["gpu-0"].rdma_devices == 0

    job = job_submit(actor=world.alpha_member, tenant=world.alpha,
                     queue=kube.cluster.queues.get(name="default"), name="allreduce",
                     command=["python", "train.py"], gpus_per_replica=8, replicas=2,
                     rdma_per_replica=2, networks=["ib"])
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert sorted(job.placement) == ["ib-0", "ib-1"]
    assert kube.objects("Job", "ogai-alpha") == []
    [k8s_job] = kube.objects("Job", "ogai-alpha-rdma")
    pod = k8s_job["spec"]["template"]
    annotations = json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])
    assert annotations == [{"name": "ib-sriov", "namespace": "net-system", "interface": "ib0"}]
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"][RDMA] in ("2", 2)
    assert container["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"],
                                                            "drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["NCCL_IB_HCA"], env["NCCL_SOCKET_IFNAME"]) == ("mlx5_0", "ib0")
    assert len(kube.pods(selector(job))) == 2  # admitted by the namespace's Pod Security level

    cluster_sync_nodes(cluster=kube.cluster)
    held = {node.name: node.rdma_in_use for node in kube.cluster.nodes.all()}
    assert (held["ib-0"], held["ib-1"]) == (2, 2)
