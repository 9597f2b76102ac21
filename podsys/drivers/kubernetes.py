"""The Kubernetes driver: workloads as Indexed Jobs (batch) or Deployments (services) in a
namespace per tenant, through the official `kubernetes` client.

Options (the cluster's driver options; credentials are merged in by `podsys.runtime`):
`kubeconfig` (YAML text) or `in_cluster: true`, and the manifest settings of
`kube_manifests.KubeOptions` (among them `environments`, the images jobs may name). The objects'
names are the workload id, and every object carries the workload label, so launching twice
creates nothing new (409 is "already launched") and status is one list of pods for the whole
cluster. A tenant's namespace is made to hold before anything runs in it: its Pod Security
labels and its namespace-wide NetworkPolicies are checked (and put right) on every launch.
Errors the API may recover from (5xx, a refused connection) are retried a few times; what
remains is a `DriverError` in the cluster's own words, never with the credentials in it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from urllib3.exceptions import HTTPError

from podsys.drivers.base import (
    FEATURE_WORKDIR,
    ClusterDriver,
    ConnectionReport,
    DriverError,
    EnvironmentInfo,
    NodeInfo,
    Phase,
    ReplicaStatus,
    Workload,
    WorkloadStatus,
)
from podsys.drivers.common import missing, summarize, tail_lines
from podsys.drivers.kube_manifests import (
    GPU,
    INDEX_LABEL,
    MANAGED_BY,
    WORKLOAD_LABEL,
    KubeOptions,
    namespace_for,
    namespace_labels,
    namespace_object,
    render_yaml,
    tenant_policies,
    workload_objects,
)
from podsys.drivers.kube_security import NAMESPACE_POLICIES

T = TypeVar("T")
MANAGED = f"{MANAGED_BY}=ogai"
VOLCANO = ("scheduling.volcano.sh", "v1beta1", "podgroups")
KUEUE_GROUP = "kueue.x-k8s.io"
# Waiting reasons that will not clear on their own: the attempt fails with the cluster's words.
STUCK = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError", "CrashLoopBackOff"}
RETRIES = 3
FOREGROUND = client.V1DeleteOptions(propagation_policy="Foreground")


def api_message(exc: ApiException) -> str:
    """The API server's own message (its Status object), else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {message or exc.reason}"


class KubernetesDriver(ClusterDriver):
    unsupported: dict[str, str] = {}

    def __init__(self, *, cluster: str, options: dict | None = None) -> None:
        super().__init__(cluster=cluster, options=options)
        try:
            self.kube = KubeOptions.from_options(self.options)
        except ValueError as exc:
            raise DriverError(f"cluster {cluster}: {exc}") from exc
        if not self.kube.artifacts_claim:
            self.unsupported = {**self.unsupported, FEATURE_WORKDIR: (
                "a working folder reaches the pods from the artifacts volume, which this "
                "cluster has not: set its 'artifacts_claim' and 'data_dir'")}
        self.retry_delay_s = float(self.options.get("retry_delay_s", 0.5))
        self._api: client.ApiClient | None = None

    # -- the connection -----------------------------------------------------------------------

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            configuration = client.Configuration()
            try:
                if self.options.get("in_cluster"):
                    config.load_incluster_config(client_configuration=configuration)
                else:
                    kubeconfig = yaml.safe_load(self.options.get("kubeconfig") or "")
                    config.load_kube_config_from_dict(
                        kubeconfig, client_configuration=configuration)
            except Exception as exc:
                raise DriverError(
                    f"cluster {self.cluster}: the credentials could not be loaded "
                    f"({type(exc).__name__}); register the cluster again with a valid "
                    "kubeconfig") from None
            configuration.retries = 0  # retried here, with the API's words kept
            self._api = client.ApiClient(configuration)
        return self._api

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the API, retrying server errors and refused connections."""
        for attempt in range(RETRIES):
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                if (exc.status is not None and exc.status < 500) or attempt == RETRIES - 1:
                    raise
            except HTTPError as exc:
                if attempt == RETRIES - 1:
                    raise DriverError(f"cluster {self.cluster}: cannot reach the API server "
                                      f"to {what} ({type(exc).__name__})") from None
            time.sleep(self.retry_delay_s * (attempt + 1))
        raise AssertionError("unreachable")

    def _checked(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return self._call(what, fn, *args, **kwargs)
        except ApiException as exc:
            raise DriverError(f"cluster {self.cluster}: {what}: {api_message(exc)}") from None

    def check_connection(self) -> ConnectionReport:
        """Server version, GPUs the device plugin advertises, and Kueue or Volcano."""
        try:
            version = self._checked("read the version", client.VersionApi(self.api).get_code)
            groups = self._checked("list API groups", client.ApisApi(self.api).get_api_versions)
            nodes = self.nodes()
        except DriverError as exc:
            return ConnectionReport(ok=False, message=str(exc))
        names = {group.name for group in groups.groups or []}
        gpu_nodes = [node for node in nodes if node.gpus]
        gpus = sum(node.gpus for node in gpu_nodes)
        details = {
            "server_version": version.git_version, "nodes": len(nodes),
            "gpu_nodes": len(gpu_nodes), "gpus": gpus,
            "kueue": KUEUE_GROUP in names, "volcano": VOLCANO[0] in names,
        }
        words = [f"Kubernetes {version.git_version}, {len(nodes)} nodes"]
        if gpu_nodes:
            words.append(f"the NVIDIA device plugin advertises {gpus} nvidia.com/gpu on "
                         f"{len(gpu_nodes)} nodes")
        else:
            words.append("no node advertises nvidia.com/gpu: is the NVIDIA device plugin "
                         "installed?")
        words.append("Kueue is installed" if details["kueue"] else "no Kueue")
        words.append("Volcano is installed" if details["volcano"] else "no Volcano")
        return ConnectionReport(ok=True, message="; ".join(words) + ".", details=details)

    # -- nodes --------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        core = client.CoreV1Api(self.api)
        listed = self._checked("list nodes", core.list_node)
        pods = self._checked("list pods", core.list_pod_for_all_namespaces,
                             field_selector="status.phase!=Succeeded,status.phase!=Failed")
        allocated: dict[str, int] = {}
        for pod in pods.items:
            if pod.spec.node_name:
                allocated[pod.spec.node_name] = (
                    allocated.get(pod.spec.node_name, 0) + _pod_gpus(pod))
        return [_node_info(node, allocated.get(node.metadata.name, 0)) for node in listed.items]

    # -- workloads ----------------------------------------------------------------------------

    def _namespace(self, workload: Workload) -> str:
        tenant = workload.labels.get("ogai.tenant", "")
        try:
            return namespace_for(tenant, self.kube)
        except ValueError as exc:
            raise DriverError(str(exc)) from None

    def _ensure_namespace(self, namespace: str, tenant: str) -> None:
        """The tenant's namespace, with the Pod Security level and the namespace-wide
        NetworkPolicies, whether OGAI made it or found it (an older OGAI's, or an operator's)."""
        try:
            wanted = namespace_labels(tenant)
            policies = tenant_policies(tenant, self.kube)
        except ValueError as exc:
            raise DriverError(str(exc)) from None
        core = client.CoreV1Api(self.api)
        try:
            found = self._call("read the namespace", core.read_namespace, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise DriverError(f"cluster {self.cluster}: read namespace {namespace}: "
                                  f"{api_message(exc)}") from None
            found = None
        if found is None:
            try:
                self._call("create the namespace", core.create_namespace,
                           namespace_object(tenant, self.kube))
            except ApiException as exc:
                if exc.status != 409:
                    raise DriverError(f"cluster {self.cluster}: create namespace {namespace}: "
                                      f"{api_message(exc)}") from None
        elif any((found.metadata.labels or {}).get(k) != v for k, v in wanted.items()):
            # A merge patch, whatever the client's default: the namespace's other labels stay.
            self._checked(f"label namespace {namespace}", core.patch_namespace, namespace,
                          {"metadata": {"labels": wanted}},
                          _content_type="application/merge-patch+json")
        self._ensure_policies(namespace, policies)

    def _ensure_policies(self, namespace: str, policies: list[dict]) -> None:
        """Create the namespace-wide policies that are missing, replace those that differ
        (the cluster's options changed) and delete those no longer wanted."""
        net = client.NetworkingV1Api(self.api)
        listed = self._checked("list network policies", net.list_namespaced_network_policy,
                               namespace, label_selector=f"{MANAGED},!{WORKLOAD_LABEL}")
        found = {item.metadata.name: item for item in listed.items}
        for policy in policies:
            name = policy["metadata"]["name"]
            current = found.get(name)
            if current is None:
                try:
                    self._call(f"create network policy {name}",
                               net.create_namespaced_network_policy, namespace, policy)
                except ApiException as exc:
                    if exc.status != 409:
                        raise DriverError(f"cluster {self.cluster}: create network policy "
                                          f"{name}: {api_message(exc)}") from None
            elif self.api.sanitize_for_serialization(current.spec) != policy["spec"]:
                self._checked(f"replace network policy {name}",
                              net.replace_namespaced_network_policy, name, namespace, policy)
        wanted = {policy["metadata"]["name"] for policy in policies}
        for name in sorted(set(found) & set(NAMESPACE_POLICIES) - wanted):
            self._delete(f"delete network policy {name}", net.delete_namespaced_network_policy,
                         name, namespace)

    def _delete(self, what: str, delete: Callable[..., Any], name: str, namespace: str,
                **kwargs: Any) -> None:
        """Delete one object; one already gone is fine."""
        try:
            self._call(what, delete, name, namespace, **kwargs)
        except ApiException as exc:
            if exc.status != 404:
                raise DriverError(f"cluster {self.cluster}: {what}: {api_message(exc)}") from None

    def environments(self) -> list[EnvironmentInfo]:
        """The images the cluster's `environments` option names, the default first."""
        listed = [EnvironmentInfo(name=name, where=image,
                                  default=name == self.kube.default_environment)
                  for name, image in self.kube.environments.items()]
        return sorted(listed, key=lambda env: not env.default)

    def render(self, workload: Workload) -> str:
        """The objects launch would create, as multi-document YAML; nothing is sent."""
        try:
            return render_yaml(workload_objects(workload, self.kube))
        except ValueError as exc:
            raise DriverError(str(exc)) from None

    def launch(self, workload: Workload) -> str:
        namespace = self._namespace(workload)
        try:
            objects = workload_objects(workload, self.kube)
        except ValueError as exc:
            raise DriverError(str(exc)) from None
        self._ensure_namespace(namespace, workload.labels.get("ogai.tenant", ""))
        created: list[str] = []
        for obj in objects:
            kind = obj["kind"]
            try:
                self._call(f"create {kind} {workload.id}", self._creator(kind), namespace, obj)
                created.append(kind)
            except ApiException as exc:
                if exc.status == 409:  # launched before: the same name, so the same workload
                    continue
                # All or nothing: a Secret left behind would keep the tokens on the cluster.
                for made in reversed(created):
                    with contextlib.suppress(DriverError):
                        self._delete(f"delete {made} {workload.id}", self._deleter(made),
                                     workload.id, namespace, body=FOREGROUND)
                raise DriverError(f"cluster {self.cluster}: create {kind} {workload.id}: "
                                  f"{api_message(exc)}") from None
        return workload.id

    def _creator(self, kind: str) -> Callable[[str, dict], Any]:
        if kind == "Secret":
            return client.CoreV1Api(self.api).create_namespaced_secret
        if kind == "NetworkPolicy":
            return client.NetworkingV1Api(self.api).create_namespaced_network_policy
        if kind == "Service":
            return client.CoreV1Api(self.api).create_namespaced_service
        if kind == "Job":
            return client.BatchV1Api(self.api).create_namespaced_job
        if kind == "Deployment":
            return client.AppsV1Api(self.api).create_namespaced_deployment
        if kind == "PodGroup":
            custom = client.CustomObjectsApi(self.api)
            return lambda namespace, body: custom.create_namespaced_custom_object(
                *VOLCANO[:2], namespace, VOLCANO[2], body)
        raise DriverError(f"no way to create a {kind}")

    def _deleter(self, kind: str) -> Callable[..., Any]:
        """delete(name, namespace, body=...) for a kind of the workload's objects."""
        core = client.CoreV1Api(self.api)
        if kind == "PodGroup":
            custom = client.CustomObjectsApi(self.api)
            return lambda name, namespace, body: custom.delete_namespaced_custom_object(
                *VOLCANO[:2], namespace, VOLCANO[2], name, body=body)
        return {
            "Job": client.BatchV1Api(self.api).delete_namespaced_job,
            "Deployment": client.AppsV1Api(self.api).delete_namespaced_deployment,
            "Service": core.delete_namespaced_service,
            "NetworkPolicy": client.NetworkingV1Api(self.api).delete_namespaced_network_policy,
            "Secret": core.delete_namespaced_secret,
        }[kind]

    def _owned(self) -> tuple[dict[str, list[Any]], dict[str, Any], dict[str, bool]]:
        """The managed pods by workload, the managed Jobs and Deployments by workload, and
        which nodes are ready: one list each for the whole cluster."""
        core = client.CoreV1Api(self.api)
        pods = self._checked("list pods", core.list_pod_for_all_namespaces,
                             label_selector=MANAGED)
        jobs = self._checked("list jobs", client.BatchV1Api(self.api).list_job_for_all_namespaces,
                             label_selector=MANAGED)
        deployments = self._checked(
            "list deployments", client.AppsV1Api(self.api).list_deployment_for_all_namespaces,
            label_selector=MANAGED)
        nodes = self._checked("list nodes", core.list_node)
        by_workload: dict[str, list[Any]] = {}
        for pod in pods.items:
            name = (pod.metadata.labels or {}).get(WORKLOAD_LABEL)
            if name:
                by_workload.setdefault(name, []).append(pod)
        owners = {
            (item.metadata.labels or {}).get(WORKLOAD_LABEL, item.metadata.name): item
            for item in [*jobs.items, *deployments.items]
        }
        ready = {node.metadata.name: _ready(node)[0] for node in nodes.items}
        return by_workload, owners, ready

    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        if not handles:
            return {}
        by_workload, owners, ready = self._owned()
        result = {}
        for handle in handles:
            owner = owners.get(handle)
            pods = by_workload.get(handle, [])
            if owner is None and not pods:
                result[handle] = missing(handle)
                continue
            result[handle] = self._workload_status(handle, owner, pods, ready)
        return result

    def _workload_status(self, handle: str, owner: Any, pods: list[Any],
                         ready: dict[str, bool]) -> WorkloadStatus:
        expected = _expected_replicas(owner, len(pods))
        newest: dict[int, Any] = {}
        if isinstance(owner, client.V1Deployment):
            # A Deployment replaces its pods: the replicas are its newest live pods, not the
            # ones being deleted or evicted (which would otherwise speak for a healthy service).
            live = [pod for pod in pods if pod.metadata.deletion_timestamp is None
                    and pod.status.phase not in ("Failed", "Succeeded")]
            newest = dict(enumerate(sorted(live, key=_created, reverse=True)[:expected]))
        else:
            for position, pod in enumerate(sorted(pods, key=_created)):
                newest[_pod_index(pod, position)] = pod
        replicas = []
        node_lost = ""
        for index in range(expected):
            pod = newest.get(index)
            if pod is None:
                replicas.append(ReplicaStatus(index=index, phase=Phase.PENDING,
                                              reason="no pod yet"))
                continue
            replica = _replica(index, pod)
            node = pod.spec.node_name or ""
            if node and not ready.get(node, False) and replica.phase in (
                    Phase.RUNNING, Phase.PENDING):
                node_lost = node_lost or node
                replica = ReplicaStatus(index=index, phase=Phase.FAILED, node=node,
                                        reason=f"node {node} is NotReady or gone")
            replicas.append(replica)
        return summarize(handle, replicas, node_lost=node_lost)

    def cancel(self, handle: str) -> None:
        by_workload, owners, _ = self._owned()
        owner = owners.get(handle)
        pods = by_workload.get(handle, [])
        namespace = (owner.metadata.namespace if owner is not None
                     else pods[0].metadata.namespace if pods else None)
        if namespace is None:
            return
        # The pods first (their owners, in the foreground), then what they used: their Secret
        # and NetworkPolicy go with them.
        kinds = ["Job", "Deployment", "Service", "NetworkPolicy", "Secret"]
        if self.kube.scheduler == "volcano":
            kinds.append("PodGroup")
        for kind in kinds:
            self._delete(f"delete {kind} {handle}", self._deleter(kind), handle, namespace,
                         body=FOREGROUND)

    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str:
        by_workload, owners, _ = self._owned()
        owner = owners.get(handle)
        replicas = getattr(owner.spec, "completions", None) if owner is not None else None
        if replicas is not None and not 0 <= replica < replicas:
            raise DriverError(f"workload {handle} has no replica {replica}")
        pods = [pod for position, pod in enumerate(sorted(by_workload.get(handle, []),
                                                          key=_created))
                if _pod_index(pod, position) == replica]
        if not pods:  # cleaned up: the logs kept before
            kept = self._kept_log(handle, replica)
            if kept is not None and kept.exists():
                return tail_lines(kept.read_text(errors="replace"), tail)
            if owner is None and handle not in by_workload:
                raise DriverError(f"no workload {handle!r} on cluster {self.cluster}")
            return ""  # not started yet
        return self._pod_log(handle, pods[-1], tail)

    def _pod_log(self, handle: str, pod: Any, tail: int | None) -> str:
        # Raw bytes: the client (36.x) would hand back the repr of the bytes as the text.
        kwargs: dict[str, Any] = {"container": "main", "_preload_content": False}
        if tail is not None:
            kwargs["tail_lines"] = max(0, tail)
        try:
            response = self._call(
                "read logs", client.CoreV1Api(self.api).read_namespaced_pod_log,
                pod.metadata.name, pod.metadata.namespace, **kwargs)
            text = response.data.decode("utf-8", errors="replace")
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise DriverError(f"cluster {self.cluster}: logs of {handle}: "
                              f"{api_message(exc)}") from None
        return tail_lines(text or "", tail)

    def _kept_log(self, handle: str, replica: int) -> Path | None:
        if not self.kube.logs_dir:
            return None
        return Path(self.kube.logs_dir) / handle / f"replica-{replica}.log"

    def cleanup(self, now: float | None = None) -> int:
        """Delete finished Jobs (their Service, pods and PodGroup with them) once
        `ttl_after_finished_s` has passed since they ended, after keeping every replica's log
        under `logs_dir`. Without a logs_dir, or with a TTL of 0, nothing is deleted."""
        ttl = self.kube.ttl_after_finished_s
        if ttl <= 0 or not self.kube.logs_dir:
            return 0
        now = time.time() if now is None else now
        by_workload, owners, _ = self._owned()
        deleted = 0
        for handle, owner in owners.items():
            ended = _ended_at(owner)
            if ended is None or ended + ttl > now:
                continue
            for position, pod in enumerate(sorted(by_workload.get(handle, []), key=_created)):
                kept = self._kept_log(handle, _pod_index(pod, position))
                assert kept is not None
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(self._pod_log(handle, pod, None))
            self.cancel(handle)
            deleted += 1
        return deleted

    def endpoint(self, handle: str) -> str | None:
        _, owners, _ = self._owned()
        owner = owners.get(handle)
        if not isinstance(owner, client.V1Deployment):
            return None
        containers = owner.spec.template.spec.containers or []
        ports = [p.container_port for c in containers for p in (c.ports or [])]
        port = ports[0] if ports else 80
        return f"http://{handle}.{owner.metadata.namespace}.svc:{port}"


# -- reading the API's objects -------------------------------------------------------------------


def _ready(node: Any) -> tuple[bool, str]:
    for condition in node.status.conditions or []:
        if condition.type == "Ready":
            return condition.status == "True", condition.message or condition.reason or ""
    return False, "no Ready condition"


def _node_info(node: Any, allocated: int) -> NodeInfo:
    labels = dict(node.metadata.labels or {})
    allocatable = node.status.allocatable or {}
    ready, message = _ready(node)
    cordoned = bool(node.spec.unschedulable)
    taints = tuple(
        f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in node.spec.taints or [])
    memory = labels.get("nvidia.com/gpu.memory", "")
    reason = "" if ready else f"NotReady: {message}"
    if cordoned:
        reason = (reason + "; " if reason else "") + "cordoned"
    return NodeInfo(
        name=node.metadata.name,
        gpus=int(parse_quantity(allocatable.get(GPU, "0"))),
        gpu_model=labels.get("nvidia.com/gpu.product", ""),
        gpu_memory_mib=int(memory) if memory.isdigit() else 0,
        cpu_cores=float(parse_quantity(allocatable.get("cpu", "0"))),
        memory_mib=int(parse_quantity(allocatable.get("memory", "0")) / (1024 * 1024)),
        labels=labels,
        ready=ready,
        schedulable=not cordoned,
        reason=reason,
        taints=taints,
        gpus_allocated=allocated,
        address=_internal_address(node),
    )


def _internal_address(node: Any) -> str:
    addresses = {a.type: a.address for a in (node.status.addresses or []) if a.address}
    return addresses.get("InternalIP") or addresses.get("Hostname") or ""


def _ended_at(owner: Any) -> float | None:
    """When a Job completed or failed (a Deployment never ends)."""
    if not isinstance(owner, client.V1Job):
        return None
    for condition in owner.status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            moment = condition.last_transition_time or owner.status.completion_time
            return moment.timestamp() if moment is not None else None
    return None


def _pod_gpus(pod: Any) -> int:
    total = 0
    for container in pod.spec.containers or []:
        limits = (container.resources.limits if container.resources else None) or {}
        total += int(parse_quantity(limits.get(GPU, "0")))
    return total


def _created(pod: Any) -> Any:
    return (pod.metadata.creation_timestamp or "", pod.metadata.name)


def _pod_index(pod: Any, position: int) -> int:
    """Indexed Jobs label each pod with its completion index; a Deployment's pods are
    numbered in creation order."""
    index = (pod.metadata.labels or {}).get(INDEX_LABEL) or (
        pod.metadata.annotations or {}).get(INDEX_LABEL)
    return int(index) if index is not None and str(index).isdigit() else position


def _expected_replicas(owner: Any, found: int) -> int:
    if owner is None:
        return found
    # (Listed objects carry no kind: their model class says what they are.)
    if isinstance(owner, client.V1Job):
        return int(owner.spec.completions or found or 1)
    return int(owner.spec.replicas or found or 1)


def _replica(index: int, pod: Any) -> ReplicaStatus:
    """A pod's phase and container states, in the cluster's own words."""
    node = pod.spec.node_name or ""
    phase = pod.status.phase
    statuses = pod.status.container_statuses or []
    terminated = next((s.state.terminated for s in statuses
                       if s.state and s.state.terminated), None)
    waiting = next((s.state.waiting for s in statuses if s.state and s.state.waiting), None)
    if phase == "Succeeded":
        return ReplicaStatus(index=index, phase=Phase.SUCCEEDED, node=node, exit_code=0)
    if phase == "Failed" or (terminated is not None and terminated.exit_code):
        code = terminated.exit_code if terminated is not None else None
        words = (terminated.reason if terminated is not None else "") or pod.status.reason or ""
        message = (terminated.message if terminated is not None else "") or pod.status.message
        reason = words or "Failed"
        if code is not None:
            reason += f" (exit code {code})"
        if message:
            reason += f": {message.strip()}"
        return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, exit_code=code,
                             reason=reason)
    if waiting is not None and waiting.reason in STUCK:
        reason = waiting.reason + (f": {waiting.message}" if waiting.message else "")
        return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, reason=reason)
    if phase == "Running":
        return ReplicaStatus(index=index, phase=Phase.RUNNING, node=node)
    reason = "pending"
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            reason = f"{condition.reason or 'Unschedulable'}: {condition.message or ''}".strip()
    if waiting is not None:
        reason = waiting.reason + (f": {waiting.message}" if waiting.message else "")
    return ReplicaStatus(index=index, phase=Phase.PENDING, node=node, reason=reason)
