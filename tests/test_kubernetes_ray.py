"""Ray jobs on a Kubernetes cluster with KubeRay: the driver creates a `RayJob` (ray.io/v1) and
follows it; its phase is the RayJob's, its replicas the head's and the workers' pods. The fake
API server stores RayJobs but plays no KubeRay: the tests set a RayJob's status and make its
pods as KubeRay would (its pod templates, labelled `ray.io/node-type`)."""

import copy

import pytest
from django.core.exceptions import ValidationError

from aistation.choices import JobState
from aistation.models import Attempt
from aistation.services import scheduling
from aistation.services.attempts import attempt_workload
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.tasks import cancel_job
from podsys.drivers import kube_watch
from podsys.drivers.base import FEATURE_RAY, DriverError, Phase, RaySpec, Resources, Workload
from podsys.drivers.kube_manifests import MANAGED_BY, WORKLOAD_LABEL
from podsys.drivers.kube_schema import check_object
from podsys.drivers.kubernetes import KubernetesDriver
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_create, cluster_sync_nodes
from tests.fakekube.server import FakeKube

IMAGE = "rayproject/ray:2.60.0"
NAMESPACE = "ogai-alpha"
RAY = {"workers": 2, "dashboard": True, "head": {"cpu": 2, "memory_mib": 4096},
       "worker": {"gpus": 8, "cpu": 4, "memory_mib": 8192}}
NO_KUBERAY = "KubeRay is not installed on cluster kube (no ray.io API group)"


@pytest.fixture
def fake_ray():
    """A fake API server with the ray.io API group (KubeRay's CRDs, no controller)."""
    fake = FakeKube(ray=True).start()
    try:
        yield fake
    finally:
        kube_watch.stop_all()
        fake.stop()


def _register(world, settings, fake, **options):
    settings.OGAI_RETRY_BACKOFF_S = 0
    for i in range(4):
        fake.add_node(f"gpu-{i}", gpus=8)
    cluster = cluster_create(
        actor=world.operator, name="kube", driver="kubernetes",
        options={"default_image": IMAGE, "data_dir": str(settings.DATA_DIR),
                 "artifacts_claim": "ogai-data", "retry_delay_s": 0, **options},
        kubeconfig=fake.kubeconfig(),
    )
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)

    def submit(ray=RAY):
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                          name="ray-train", command=["python", "train.py", "--note", "a b"],
                          gpus_per_replica=8, replicas=ray["workers"] + 1, ray=ray)

    fake.cluster = cluster
    fake.submit = submit
    return fake


@pytest.fixture
def kube(world, settings, fake_ray):
    """Four 8-GPU nodes, KubeRay installed, the cluster's option `kuberay` true."""
    return _register(world, settings, fake_ray, kuberay=True)


def cycle(kube):
    return scheduling.schedule_cluster(cluster_id=kube.cluster.pk)


def workload_id(job) -> str:
    return Attempt.objects.filter(job=job).order_by("-number").first().workload_id


def drivers(kube) -> dict[str, KubernetesDriver]:
    """The cluster's driver following watches (its default) and one listing every time."""
    watched = driver_for(kube.cluster)
    listed = KubernetesDriver(cluster="kube", options={**watched.options, "watch": False})
    return {"watch": watched, "list": listed}


def status(kube, handle):
    """The workload's status, the same whether watched or listed."""
    answers = {how: driver.status([handle])[handle] for how, driver in drivers(kube).items()}
    assert answers["watch"] == answers["list"]
    return answers["watch"]


def make_ray_pods(kube, handle, *, run=True):
    """The head and worker pods KubeRay would make from the RayJob's templates."""
    with kube.lock:
        owner = kube.store.get("RayJob", NAMESPACE, handle)
        cluster = owner["spec"]["rayClusterSpec"]
        groups = [("head", cluster["headGroupSpec"], 1)] + [
            ("worker", group, group["replicas"]) for group in cluster["workerGroupSpecs"]]
        for node_type, group, count in groups:
            for i in range(count):
                template = copy.deepcopy(group["template"])
                template["metadata"]["labels"]["ray.io/node-type"] = node_type
                kube._make_pod(owner, f"{handle}-{node_type}-{i}abcd", template, None)
        kube._settle()
    if run:
        kube.start_pods(f"{WORKLOAD_LABEL}={handle}")


def set_ray_status(kube, handle, **status):
    kube.set_status("RayJob", NAMESPACE, handle, status)


def test_a_ray_job_is_launched_as_one_ray_job_of_the_drivers_pods(kube):
    job = kube.submit()
    cycle(kube)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING, job.reason
    [ray_job] = kube.objects("RayJob", NAMESPACE)
    handle = workload_id(job)
    assert ray_job["metadata"]["name"] == handle
    assert kube.objects("Job", NAMESPACE) == [] and kube.objects("Service", NAMESPACE) == []
    assert [p["metadata"]["name"] for p in kube.objects("NetworkPolicy", NAMESPACE)
            if p["metadata"].get("labels", {}).get(WORKLOAD_LABEL)] == [handle]
    cluster = ray_job["spec"]["rayClusterSpec"]
    assert cluster["workerGroupSpecs"][0]["replicas"] == 2
    for template in (cluster["headGroupSpec"]["template"],
                     cluster["workerGroupSpecs"][0]["template"]):
        check_object(template, "V1PodTemplateSpec")
        labels = template["metadata"]["labels"]
        # KubeRay copies them to its pods: the driver finds them by these.
        assert labels[WORKLOAD_LABEL] == handle and labels[MANAGED_BY] == "ogai"
    # Launching again is "already launched" (409), the same workload.
    attempt = Attempt.objects.get(job=job)
    assert driver_for(kube.cluster).launch(attempt_workload(attempt)) == handle
    assert len(kube.objects("RayJob", NAMESPACE)) == 1


def test_the_ray_job_status_runs_then_succeeds_the_same_watched_or_listed(kube):
    job = kube.submit()
    cycle(kube)
    handle = workload_id(job)
    first = status(kube, handle)
    assert first.phase == Phase.PENDING and first.reason.startswith("RayJob")
    assert [r.reason for r in first.replicas] == ["no pod yet"] * 3

    set_ray_status(kube, handle, jobDeploymentStatus="Initializing")
    make_ray_pods(kube, handle)
    assert status(kube, handle).phase == Phase.PENDING  # the pods run; the job not yet

    assert driver_for(kube.cluster).ray_addresses(handle) is None  # not up yet
    set_ray_status(kube, handle, jobDeploymentStatus="Running", jobStatus="RUNNING",
                   rayClusterName=f"{handle}-raycluster-x7k2p")
    head = f"{handle}-raycluster-x7k2p-head-svc.{NAMESPACE}.svc"
    for driver in drivers(kube).values():
        assert driver.ray_addresses(handle) == {
            "gcs": f"{head}:6379", "client": f"ray://{head}:10001",
            "dashboard": f"http://{head}:8265"}
    running = status(kube, handle)
    assert running.phase == Phase.RUNNING
    assert [r.phase for r in running.replicas] == [Phase.RUNNING] * 3
    assert all(r.node.startswith("gpu-") for r in running.replicas)
    reconcile_cluster(cluster=kube.cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    set_ray_status(kube, handle, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED",
                   endTime="2026-12-06T05:00:00Z")
    # KubeRay shuts the cluster down: its pods go.
    for pod in kube.pods(f"{WORKLOAD_LABEL}={handle}"):
        kube.delete_object("Pod", pod["metadata"]["name"], NAMESPACE)
    done = status(kube, handle)
    assert (done.phase, done.exit_code) == (Phase.SUCCEEDED, 0)
    assert driver_for(kube.cluster).ray_addresses(handle) is None
    assert [r.phase for r in done.replicas] == [Phase.SUCCEEDED] * 3
    reconcile_cluster(cluster=kube.cluster)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_failed_entrypoint_fails_the_job_with_the_ray_jobs_message(kube):
    job = kube.submit()
    cycle(kube)
    handle = workload_id(job)
    make_ray_pods(kube, handle)
    set_ray_status(kube, handle, jobDeploymentStatus="Running", jobStatus="RUNNING")
    assert status(kube, handle).phase == Phase.RUNNING
    set_ray_status(kube, handle, jobDeploymentStatus="Complete", jobStatus="FAILED",
                   message="Job entrypoint command failed with exit code 3")
    failed = status(kube, handle)
    assert failed.phase == Phase.FAILED
    assert failed.reason == "Ray job FAILED: Job entrypoint command failed with exit code 3"
    reconcile_cluster(cluster=kube.cluster)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "exit code 3" in job.reason


def test_a_ray_pod_that_cannot_start_fails_the_job_in_the_clusters_words(kube):
    job = kube.submit()
    cycle(kube)
    handle = workload_id(job)
    kube.fail_image_pulls(IMAGE)
    make_ray_pods(kube, handle)
    stuck = status(kube, handle)
    assert stuck.phase == Phase.FAILED
    assert "ImagePull" in stuck.reason or "ErrImagePull" in stuck.reason


def test_cancel_deletes_the_ray_job_and_its_pods(kube, world):
    job = kube.submit()
    cycle(kube)
    handle = workload_id(job)
    make_ray_pods(kube, handle)
    set_ray_status(kube, handle, jobDeploymentStatus="Running", jobStatus="RUNNING")
    job_cancel(actor=world.alpha_member, job=job)
    cancel_job(job_id=job.pk)
    for kind in ("RayJob", "Pod", "NetworkPolicy", "Secret"):
        assert [o for o in kube.objects(kind, NAMESPACE)
                if o["metadata"].get("labels", {}).get(WORKLOAD_LABEL) == handle] == []
    # What the watches had last read of it: ended by cancel, not ended on its own.
    assert status(kube, handle).phase == Phase.MISSING


def test_logs_of_a_ray_job_are_its_pods_and_the_entrypoints_output(kube):
    job = kube.submit()
    cycle(kube)
    handle = workload_id(job)
    make_ray_pods(kube, handle)
    kube.set_logs(f"{handle}-head-0abcd", "head says hi\n")
    kube.set_logs(f"{handle}-worker-1abcd", "worker two\n")
    driver = driver_for(kube.cluster)
    assert driver.logs(handle) == "head says hi\n"
    assert driver.logs(handle, replica=2) == "worker two\n"
    # KubeRay's submitter Job runs `ray job submit` (which follows the entrypoint's output) in
    # the RayJob's submitter template: replica 0's log shows it after the head's.
    with kube.lock:
        owner = kube.store.get("RayJob", NAMESPACE, handle)
        kube._make_pod(owner, f"{handle}-submit", copy.deepcopy(
            owner["spec"]["submitterPodTemplate"]), None)
        kube._settle()
    kube.start_pods("ray.io/node-type=submitter")
    kube.set_logs(f"{handle}-submit", "epoch 1 loss 2.5\nepoch 2 loss 1.9\n")
    assert driver.logs(handle) == ("head says hi\n[ogai] the entrypoint's output (ray job "
                                   "submit):\nepoch 1 loss 2.5\nepoch 2 loss 1.9\n")
    assert driver.logs(handle, tail=1) == "epoch 2 loss 1.9\n"
    assert driver.logs(handle, replica=2) == "worker two\n"
    assert status(kube, handle).replicas[0].node.startswith("gpu-")  # not the submitter
    with pytest.raises(DriverError, match="no replica 3"):
        driver.logs(handle, replica=3)


def test_the_connection_check_reports_kuberay(kube):
    report = driver_for(kube.cluster).check_connection()
    assert report.ok and report.details["kuberay"] is True
    assert "KubeRay is installed" in report.message


def test_without_the_kuberay_option_a_ray_job_is_refused_at_submission(world, settings,
                                                                      fake_ray):
    kube = _register(world, settings, fake_ray)
    driver = driver_for(kube.cluster)
    assert not driver.supports(FEATURE_RAY)
    assert driver.unsupported[FEATURE_RAY].startswith(NO_KUBERAY)
    # Where KubeRay is there but not switched on, the connection check says so.
    report = driver_for(kube.cluster).check_connection()
    assert "option 'kuberay' is true" in report.message
    with pytest.raises(ValidationError) as refused:
        kube.submit()
    assert NO_KUBERAY in str(refused.value)
    assert kube.objects("RayJob", NAMESPACE) == []


def test_a_cluster_without_kuberay_launches_no_ray_job(world, settings):
    fake = FakeKube().start()
    try:
        kube = _register(world, settings, fake)
        report = driver_for(kube.cluster).check_connection()
        assert report.details["kuberay"] is False and "no KubeRay" in report.message
        driver = driver_for(kube.cluster)
        # A launch that bypassed submission is refused in words, with nothing created.
        workload = Workload(id="ray-1", command=("python", "x.py"), replicas=2,
                            resources=Resources(cpu_cores=1, memory_mib=1024),
                            image=IMAGE, tenant="alpha", labels={"ogai.tenant": "alpha"},
                            ray=RaySpec(head=Resources(cpu_cores=1),
                                        worker=Resources(cpu_cores=1)))
        with pytest.raises(DriverError, match="KubeRay is not installed"):
            driver.launch(workload)
        assert fake.objects("NetworkPolicy", NAMESPACE) == []
    finally:
        kube_watch.stop_all()
        fake.stop()


def test_an_option_kuberay_that_is_not_a_boolean_is_refused():
    with pytest.raises(DriverError, match="'kuberay' must be true or false"):
        KubernetesDriver(cluster="kube", options={"kuberay": "yes"})


def test_the_kuberay_option_on_a_cluster_without_kuberay_fails_the_connection_check(
        world, settings):
    fake = FakeKube().start()
    try:
        kube = _register(world, settings, fake, kuberay=True)
        report = driver_for(kube.cluster).check_connection()
        assert not report.ok
        assert "option 'kuberay' is true but KubeRay is not installed" in report.message
    finally:
        kube_watch.stop_all()
        fake.stop()
