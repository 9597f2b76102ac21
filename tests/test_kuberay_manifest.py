"""A Ray job on Kubernetes is a KubeRay RayJob (ray.io/v1): its pod templates are the driver's
own pods (checked against the client's V1PodTemplateSpec), its entrypoint one quoted string,
and the fake API server (feature `ray`) accepts it."""

from __future__ import annotations

import shlex

import pytest
import requests

from podsys.drivers.base import RaySpec, Resources, Workload
from podsys.drivers.kube_manifests import KubeOptions, workload_objects
from podsys.drivers.kube_ray import ray_job_phase
from podsys.drivers.kube_schema import SchemaError, check_object
from tests.fakekube.server import FakeKube

COMMAND = ("python", "train.py", "--note", "it's $(rm -rf /); fine")


def ray_workload(**fields) -> Workload:
    head = Resources(cpu_cores=2, memory_mib=4096)
    worker = Resources(gpus=1, cpu_cores=4, memory_mib=8192)
    values: dict = {
        "id": "job-7-a1", "command": COMMAND, "replicas": 3,
        "resources": Resources(gpus=1, cpu_cores=4, memory_mib=8192),
        "image": "rayproject/ray:2.60.0", "tenant": "acme", "run_as": 1_000_000_001,
        "labels": {"ogai.job": "7", "ogai.attempt": "1", "ogai.tenant": "acme"},
        "ray": RaySpec(head=head, worker=worker, dashboard=True),
    }
    values.update(fields)
    return Workload(**values)


def ray_job(wl: Workload, **options) -> dict:
    objs = workload_objects(wl, KubeOptions(**options))
    for obj in objs:
        check_object(obj)
    kinds = [obj["kind"] for obj in objs]
    assert kinds[-1] == "RayJob" and "Job" not in kinds and "Service" not in kinds
    return objs[-1]


def test_the_ray_job_is_a_head_and_one_worker_group_of_the_drivers_pods() -> None:
    job = ray_job(ray_workload())
    spec = job["spec"]
    assert job["apiVersion"] == "ray.io/v1"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert shlex.split(spec["entrypoint"]) == list(COMMAND)
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 2
    assert head["rayStartParams"]["include-dashboard"] == "true"
    submitter = spec["submitterPodTemplate"]
    assert submitter["metadata"]["labels"] == {**job["metadata"]["labels"],
                                                "ray.io/node-type": "submitter"}
    limits = submitter["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["cpu"] in ("500m", "0.5")
    for template in (head["template"], workers["template"], submitter):
        check_object(template, "V1PodTemplateSpec")
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = pod["containers"][0]
        assert "command" not in container  # KubeRay starts Ray in it
        assert template["metadata"]["labels"].items() >= job["metadata"]["labels"].items()
    head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker_limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in head_limits and worker_limits["nvidia.com/gpu"] == "1"
    assert "suspend" not in spec


def test_with_kueue_the_ray_job_is_created_suspended_with_its_queue_label() -> None:
    job = ray_job(ray_workload(), kueue_queue="team-a")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_a_broken_pod_template_is_caught_by_the_clients_schema() -> None:
    template = ray_job(ray_workload())["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    template["spec"]["containers"][0]["resources"] = "lots"
    with pytest.raises(SchemaError):
        check_object(template, "V1PodTemplateSpec")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_fake_api_serves_ray_jobs_only_where_kuberay_is_installed(enabled: bool) -> None:
    fake = FakeKube(ray=enabled).start()
    try:
        job = ray_job(ray_workload())
        job["metadata"]["namespace"] = "default"
        answer = requests.post(f"{fake.url}/apis/ray.io/v1/namespaces/default/rayjobs",
                               json=job, headers={"Authorization": f"Bearer {fake.token}"},
                               timeout=10)
        assert answer.status_code == (201 if enabled else 404), answer.text
    finally:
        fake.stop()


def test_ray_job_states_become_the_drivers_phases() -> None:
    assert ray_job_phase({"status": {"jobStatus": "SUCCEEDED"}})[0] == "succeeded"
    assert ray_job_phase({"status": {"jobStatus": "STOPPED"}})[0] == "failed"
    assert ray_job_phase({"status": {"jobDeploymentStatus": "Running"}})[0] == "running"
    assert ray_job_phase({"status": {"jobDeploymentStatus": "Initializing"}})[0] == "pending"
    assert ray_job_phase(None)[0] == "missing"
