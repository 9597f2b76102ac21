"""A Ray workload (`Workload.ray`) on Kubernetes: a KubeRay `RayJob` (ray.io/v1).

Its head group and its one worker group are pod templates built like every other pod of the
driver (`kube_manifests.pod_spec`: the tenant's namespace, the restricted security context, no
service-account token, the job's labels, env and volumes), but without a command: KubeRay runs
`ray start` in the template's first container itself. The job's command is the RayJob's
`entrypoint`, one shell string KubeRay hands to `ray job submit`: it is built with
`shlex.join` from the argument list, never by pasting user input into a string.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from podsys.drivers.base import Resources, Workload

RAY_API_VERSION = "ray.io/v1"
RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAY_PLURAL = "rayjobs"
WORKER_GROUP = "workers"
# How long KubeRay keeps a finished RayJob's cluster (for its logs) before deleting it.
TTL_AFTER_FINISHED_S = 600
# RayJob.status.jobStatus (Ray's own job states) and jobDeploymentStatus (KubeRay's).
FINISHED_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
# KubeRay's `ray job submit` pod: what KubeRay's default asks (half a CPU, up to 1 GiB), in the
# driver's own pod template, which a restricted namespace admits (KubeRay's default is not).
SUBMITTER = Resources(cpu_cores=0.5, memory_mib=1024)
# Its role among the workload's pods (ray.io/node-type, beside KubeRay's head and worker).
SUBMITTER_TYPE = "submitter"
RAY_NODE_TYPE = "ray.io/node-type"
# The head's ports (KubeRay's defaults, on the head Service `<RayCluster>-head-svc`).
GCS_PORT, CLIENT_PORT, DASHBOARD_PORT = 6379, 10001, 8265


def _node_workload(workload: Workload, node: Resources, replicas: int) -> Workload:
    """The workload as one group's pods see it: the node's resources, no command of its
    own (KubeRay starts Ray), placed on the nodes chosen for that group's replicas."""
    resources = dataclasses.replace(workload.resources, gpus=node.gpus,
                                    cpu_cores=node.cpu_cores, memory_mib=node.memory_mib)
    return dataclasses.replace(workload, command=(), resources=resources, replicas=replicas,
                               placement=())


def _group_template(pod_template: dict) -> dict:
    spec = pod_template["spec"]
    # KubeRay names the pods and their Services itself.
    spec.pop("subdomain", None)
    return pod_template


def ray_job_object(workload: Workload, namespace: str, labels: dict[str, str], *,
                   pod_template: Any, kueue_queue: str = "") -> dict:
    """The RayJob of `workload`; `pod_template(workload)` builds a pod template the way the
    driver builds every pod's."""
    spec = workload.ray
    if spec is None:
        raise ValueError(f"workload {workload.id!r} is not a Ray cluster")
    if not workload.command or not all(isinstance(arg, str) for arg in workload.command):
        raise ValueError("a Ray job's entrypoint must be a non-empty list of strings")
    workers = workload.replicas - 1
    head_params = {"dashboard-host": "0.0.0.0",  # noqa: S104 - the pod's own network
                   "num-cpus": str(max(1, int(spec.head.cpu_cores))),
                   "include-dashboard": "true" if spec.dashboard else "false"}
    worker_params = {"num-cpus": str(max(1, int(spec.worker.cpu_cores)))}
    cluster: dict[str, Any] = {
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": _group_template(pod_template(_node_workload(workload, spec.head, 1))),
        },
        "workerGroupSpecs": [{
            "groupName": WORKER_GROUP,
            "replicas": workers, "minReplicas": workers, "maxReplicas": workers,
            "rayStartParams": worker_params,
            "template": _group_template(pod_template(
                _node_workload(workload, spec.worker, max(workers, 1)))),
        }] if workers else [],
    }
    submitter = _group_template(pod_template(_node_workload(workload, SUBMITTER, 1)))
    submitter["metadata"].setdefault("labels", {})[RAY_NODE_TYPE] = SUBMITTER_TYPE
    job_labels = dict(labels)
    job_spec: dict[str, Any] = {
        # One string for `ray job submit`: each argument quoted, so none is re-split.
        "entrypoint": shlex.join(workload.command),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
        # The platform retries whole attempts itself.
        "backoffLimit": 0,
        "rayClusterSpec": cluster,
        # Its first container, without a command, becomes `ray job submit`, which follows
        # the entrypoint's output: that pod's log is the job's.
        "submitterPodTemplate": submitter,
    }
    if workload.time_limit_s:
        job_spec["activeDeadlineSeconds"] = int(workload.time_limit_s)
    if kueue_queue:
        # Kueue admits a suspended RayJob when its queue has quota, then unsuspends it.
        job_labels["kueue.x-k8s.io/queue-name"] = kueue_queue
        job_spec["suspend"] = True
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": workload.id, "namespace": namespace, "labels": job_labels},
        "spec": job_spec,
    }


def ray_job_phase(obj: dict | None) -> tuple[str, str]:
    """(phase, reason) of a RayJob as read back: "pending", "running", "succeeded" or
    "failed" (the driver's Phase values), from its `jobDeploymentStatus` and `jobStatus`."""
    if obj is None:
        return "missing", "the RayJob is gone"
    status = obj.get("status") or {}
    job = str(status.get("jobStatus") or "")
    deployment = str(status.get("jobDeploymentStatus") or "")
    message = str(status.get("message") or "")
    if job == "SUCCEEDED":
        return "succeeded", ""
    if job in ("FAILED", "STOPPED") or deployment == "Failed":
        return "failed", f"Ray job {job or deployment}: {message}".rstrip(": ")
    if job == "RUNNING" or deployment == "Running":
        return "running", ""
    return "pending", f"RayJob {deployment or 'new'}" + (f": {message}" if message else "")


def ray_cluster_addresses(obj: dict) -> dict[str, str] | None:
    """Where a RayJob's cluster is reached inside the Kubernetes cluster: its head Service
    (KubeRay names it after the RayCluster it made, `<name>-head-svc`), once KubeRay says the
    cluster is up and the entrypoint submitted (jobDeploymentStatus Running); None before and
    after."""
    status = obj.get("status") or {}
    name = status.get("rayClusterName")
    if status.get("jobDeploymentStatus") != "Running" or not name:
        return None
    host = f"{name}-head-svc.{obj['metadata']['namespace']}.svc"
    head = ((obj.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {}
    dashboard = (head.get("rayStartParams") or {}).get("include-dashboard") == "true"
    return {"gcs": f"{host}:{GCS_PORT}", "client": f"ray://{host}:{CLIENT_PORT}",
            "dashboard": f"http://{host}:{DASHBOARD_PORT}" if dashboard else ""}
