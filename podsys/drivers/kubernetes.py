"""The Kubernetes driver: workloads as Indexed Jobs (batch) or Deployments (services) in a
namespace per tenant, through the official `kubernetes` client.

Options (the cluster's driver options; credentials are merged in by `podsys.runtime`):
`kubeconfig` (YAML text) or `in_cluster: true`, and the manifest settings of
`kube_manifests.KubeOptions` (among them `environments`, the images jobs may name). The objects'
names are the workload id, and every object carries the workload label, so launching twice
creates nothing new (409 is "already launched").

Status, nodes, cancel, logs and cleanup read the cluster's managed pods, Jobs and Deployments
and its nodes (and, for the GPUs in use, its unfinished pods) from watches (`kube_watch`):
listed once per process, then followed, so a reconcile costs what changed, not the cluster's
size, and a workload that ends and is deleted between two reconciles still reads as ended
(its objects' last states are kept a while). Options `watch` (default true; false lists every
collection on every call, as before), `watch_lag_s` (how long a call waits for the watches to
catch up with the cluster's current version, default 0.5) and `watch_idle_s` (watches nobody
read for this long stop, default 600). Both ways read the objects as the API's JSON (dicts)
through the same code, so they answer the same. A tenant's namespace is made to hold before
anything runs in it: its Pod Security labels and its namespace-wide NetworkPolicies are
checked (and put right) on every launch.
A Ray job (`Workload.ray`) is a KubeRay `RayJob` (`kube_ray`), on a cluster whose option
`kuberay` is true (KubeRay installed: the `ray.io` API group, which `check_connection` reports;
the driver makes no API call when it is made, so the option says it): its phase is the RayJob's
(`ray_job_phase`), its replicas the head's and the workers' pods; replica 0's log adds the
submitter pod's (the entrypoint's output) and its addresses are the head Service's.
Errors the API may recover from (5xx, a refused connection) are retried a few times; what
remains is a `DriverError` in the cluster's own words, never with the credentials in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from urllib3.exceptions import HTTPError

from podsys.drivers import kube_watch
from podsys.drivers.base import (
    FEATURE_RAY,
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
    namespace_labels,
    namespace_object,
    render_yaml,
    tenant_policies,
    wants_rdma_namespace,
    workload_namespace,
    workload_objects,
)
from podsys.drivers.kube_networks import check_namespace_owner, node_rdma, pod_rdma
from podsys.drivers.kube_ray import (
    RAY_GROUP,
    RAY_NODE_TYPE,
    RAY_PLURAL,
    RAY_VERSION,
    SUBMITTER_TYPE,
    ray_cluster_addresses,
    ray_job_phase,
)
from podsys.drivers.kube_security import NAMESPACE_POLICIES
from podsys.drivers.kube_watch import Collection, Store, Transport, WatchOptions

T = TypeVar("T")
MANAGED = f"{MANAGED_BY}=ogai"
VOLCANO = ("scheduling.volcano.sh", "v1beta1", "podgroups")
RAY = (RAY_GROUP, RAY_VERSION, RAY_PLURAL)
# KubeRay labels the pods of a Ray cluster "head" or "worker".
KUEUE_GROUP = "kueue.x-k8s.io"
# Waiting reasons that will not clear on their own: the attempt fails with the cluster's words.
STUCK = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError", "CrashLoopBackOff"}
RETRIES = 3
FOREGROUND = client.V1DeleteOptions(propagation_policy="Foreground")
Obj = dict[str, Any]
NO_MEMO: dict = {}  # with lists: nothing is kept from one call to the next


def _slim_pod(pod: Obj) -> Obj:
    """What status, nodes and logs read of a pod (a store of 50,000 whole pods is large).
    A field the code below starts to read must be kept here."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "kind": "Pod",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                          "labels", "annotations", "creationTimestamp",
                                          "deletionTimestamp") if k in meta},
        "spec": {"nodeName": spec.get("nodeName"),
                 "containers": [{"name": c.get("name"), "resources": c.get("resources") or {}}
                                for c in spec.get("containers") or []]},
        "status": {k: status[k] for k in ("phase", "reason", "message", "conditions",
                                          "containerStatuses") if k in status},
    }


# What the driver follows: the managed pods, Jobs and Deployments (indexed by workload), the
# nodes, and every unfinished pod (the GPUs in use on each node, OGAI's or not).
PODS = Collection("pods", "Pod", "/api/v1/pods", label_selector=MANAGED,
                  index_label=WORKLOAD_LABEL, slim=_slim_pod)
JOBS = Collection("jobs", "Job", "/apis/batch/v1/jobs", label_selector=MANAGED,
                  index_label=WORKLOAD_LABEL)
DEPLOYMENTS = Collection("deployments", "Deployment", "/apis/apps/v1/deployments",
                         label_selector=MANAGED, index_label=WORKLOAD_LABEL)
# Read only on a cluster with KubeRay (elsewhere the path is not served).
ENTRYPOINT_LOG_HEADING = "[ogai] the entrypoint's output (ray job submit):\n"
RAYJOBS = Collection("ray jobs", "RayJob", f"/apis/{RAY_GROUP}/{RAY_VERSION}/{RAY_PLURAL}",
                     label_selector=MANAGED, index_label=WORKLOAD_LABEL)
NODES = Collection("nodes", "Node", "/api/v1/nodes")
UNFINISHED_PODS = Collection("unfinished pods", "Pod", "/api/v1/pods",
                             field_selector="status.phase!=Succeeded,status.phase!=Failed",
                             slim=_slim_pod)


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
        kuberay = self.options.get("kuberay", False)
        if not isinstance(kuberay, bool):
            raise DriverError(f"cluster {cluster}: option 'kuberay' must be true or false, "
                              f"not {kuberay!r}")
        self.kuberay = kuberay
        if not kuberay:
            self.unsupported = {**self.unsupported, FEATURE_RAY: (
                f"KubeRay is not installed on cluster {cluster} (no {RAY_GROUP} API group); "
                "once it is, set the cluster's option 'kuberay' to true")}
        self.retry_delay_s = float(self.options.get("retry_delay_s", 0.5))
        try:
            self.watching = WatchOptions.from_options(self.options)
        except ValueError as exc:
            raise DriverError(f"cluster {cluster}: {exc}") from exc
        self._api: client.ApiClient | None = None

    # -- the connection -----------------------------------------------------------------------

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            self._api = self._new_api()
        return self._api

    def _new_api(self) -> client.ApiClient:
        """A client of the cluster (the watches have their own, kept by the process)."""
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
        return client.ApiClient(configuration)

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
        """Server version, GPUs the device plugin advertises, Kueue or Volcano, and KubeRay
        (whether the `kuberay` option says what the cluster has)."""
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
            "kuberay": RAY_GROUP in names,
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
        if details["kuberay"] and self.kuberay:
            words.append("KubeRay is installed")
        elif details["kuberay"]:
            words.append("KubeRay is installed, but Ray jobs are off until the cluster's option "
                         "'kuberay' is true")
        elif self.kuberay:
            # Every read of the workloads lists RayJobs, so none can be followed: not ok.
            words.append(f"the option 'kuberay' is true but KubeRay is not installed (no "
                         f"{RAY_GROUP} API group), so no workload can be followed: install "
                         "KubeRay or set 'kuberay' to false")
        else:
            words.append("no KubeRay")
        ok = details["kuberay"] or not self.kuberay
        return ConnectionReport(ok=ok, message="; ".join(words) + ".", details=details)

    # -- nodes --------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        rdma = self.kube.rdma_resource
        with self._reading(NODES, UNFINISHED_PODS) as ((nodes, pods), memo):
            # With watches, what was derived from an object is kept by its resourceVersion.
            known_held, known_nodes = memo.get("pod_held", {}), memo.get("node_info", {})
            held: dict[tuple, tuple[int, int]] = {}
            allocated: dict[str, tuple[int, int]] = {}
            for key, pod in pods.objects.items():
                if name := pod["spec"].get("nodeName"):
                    version = (key, pod["metadata"].get("resourceVersion"))
                    found = known_held.get(version)
                    if found is None:
                        found = (_pod_gpus(pod), pod_rdma(pod, rdma))
                    held[version] = found
                    gpus, devices = allocated.get(name, (0, 0))
                    allocated[name] = (gpus + found[0], devices + found[1])
            infos: dict[tuple, NodeInfo] = {}
            for _, node in sorted(nodes.objects.items()):
                name = node["metadata"]["name"]
                used = allocated.get(name, (0, 0))
                seen = (name, node["metadata"].get("resourceVersion"), used)
                info = known_nodes.get(seen)
                infos[seen] = (_node_info(node, used[0], rdma=rdma, rdma_allocated=used[1])
                               if info is None else info)
            if memo is not NO_MEMO:
                memo["pod_held"], memo["node_info"] = held, infos
            return list(infos.values())

    # -- reading the cluster: watched, or listed -----------------------------------------------

    @contextlib.contextmanager
    def _reading(self, *collections: Collection) -> Iterator[tuple[list[Store], dict]]:
        """The stores of these collections, current (see `kube_watch`), held still while the
        caller reads them: the watches' (under their locks), or one list each; and the
        watches' memo (`NO_MEMO`, empty and not kept, with lists)."""

        def listing(what: str, fn: Callable[[], T]) -> T:
            return self._checked(what, fn)

        if not self.watching.watch:
            transport = Transport(self.api)
            stores = []
            for collection in collections:
                listed = listing(f"list {collection.name}", partial(transport.list, collection))
                stores.append(Store.of(collection, listed.get("items") or [], ""))
            yield stores, NO_MEMO
            return
        watch = kube_watch.cluster_watch(self.cluster, self.options, self._new_api,
                                         self.watching.idle_s)
        informers = watch.sync(list(collections), self.watching.lag_s, listing)
        with contextlib.ExitStack() as held:
            for name in sorted(informers):  # always in the same order
                held.enter_context(informers[name].lock)
            yield [informers[c.name].store for c in collections], watch.memo

    @contextlib.contextmanager
    def _workloads(self, *, with_nodes: bool = False) -> Iterator[_Workloads]:
        wanted = (PODS, JOBS, DEPLOYMENTS, *((RAYJOBS,) if self.kuberay else ()),
                  *((NODES,) if with_nodes else ()))
        with self._reading(*wanted) as (stores, memo):
            rest = stores[3:]
            rayjobs = rest.pop(0) if self.kuberay else None
            yield _Workloads(stores[0], stores[1], stores[2], rayjobs=rayjobs,
                             nodes=rest[0] if with_nodes else None, memo=memo)

    # -- workloads ----------------------------------------------------------------------------

    def _namespace(self, workload: Workload) -> str:
        """The tenant's namespace, or its RDMA namespace for a workload holding RDMA devices
        (`kube_networks`)."""
        try:
            return workload_namespace(workload, self.kube)
        except ValueError as exc:
            raise DriverError(str(exc)) from None

    def _ensure_namespace(self, namespace: str, tenant: str, *, rdma: bool = False) -> None:
        """The tenant's namespace (or its RDMA namespace), with the Pod Security level and the
        namespace-wide NetworkPolicies, whether OGAI made it or found it (an older OGAI's, or an
        operator's); never one labelled for another tenant or kind."""
        try:
            wanted = namespace_labels(tenant, rdma)
            policies = tenant_policies(tenant, self.kube, rdma)
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
                           namespace_object(tenant, self.kube, rdma))
            except ApiException as exc:
                if exc.status != 409:
                    raise DriverError(f"cluster {self.cluster}: create namespace {namespace}: "
                                      f"{api_message(exc)}") from None
        else:
            try:
                check_namespace_owner(found.metadata.labels, wanted)
            except ValueError as exc:
                raise DriverError(f"cluster {self.cluster}: namespace {namespace}: "
                                  f"{exc}") from None
            if any((found.metadata.labels or {}).get(k) != v for k, v in wanted.items()):
                # A merge patch, whatever the client's default: the namespace's other labels
                # stay.
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
        if workload.ray is not None and not self.supports(FEATURE_RAY):
            raise DriverError(f"workload {workload.id} is a Ray cluster: "
                              f"{self.unsupported[FEATURE_RAY]}")
        namespace = self._namespace(workload)
        try:
            objects = workload_objects(workload, self.kube)
        except ValueError as exc:
            raise DriverError(str(exc)) from None
        self._ensure_namespace(namespace, workload.labels.get("ogai.tenant", ""),
                               rdma=wants_rdma_namespace(workload))
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
        if kind == "RayJob":
            custom = client.CustomObjectsApi(self.api)
            return lambda namespace, body: custom.create_namespaced_custom_object(
                *RAY[:2], namespace, RAY[2], body)
        raise DriverError(f"no way to create a {kind}")

    def _deleter(self, kind: str) -> Callable[..., Any]:
        """delete(name, namespace, body=...) for a kind of the workload's objects."""
        core = client.CoreV1Api(self.api)
        if kind in ("PodGroup", "RayJob"):
            group, version, plural = VOLCANO if kind == "PodGroup" else RAY
            custom = client.CustomObjectsApi(self.api)
            return lambda name, namespace, body: custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, body=body)
        return {
            "Job": client.BatchV1Api(self.api).delete_namespaced_job,
            "Deployment": client.AppsV1Api(self.api).delete_namespaced_deployment,
            "Service": core.delete_namespaced_service,
            "NetworkPolicy": client.NetworkingV1Api(self.api).delete_namespaced_network_policy,
            "Secret": core.delete_namespaced_secret,
        }[kind]

    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        if not handles:
            return {}
        result = {}
        with self._workloads(with_nodes=True) as found:
            known = found.memo.get("status", {})
            kept: dict[str, tuple] = {}
            for handle in handles:
                owner = found.owner(handle)
                pods = found.pods(handle)
                if owner is None and not pods:
                    result[handle] = found.ended(handle) or missing(handle)
                    continue
                # With watches, recomputed only when one of its objects changed, or the
                # readiness of its nodes.
                version = (owner["metadata"].get("resourceVersion") if owner else None,
                           *((p["metadata"].get("resourceVersion"),
                              found.ready(p["spec"].get("nodeName") or "")) for p in pods))
                before = known.get(handle)
                if before is not None and before[0] == version:
                    status = before[1]
                else:
                    status = _workload_status(handle, owner, pods, found.ready)
                kept[handle] = (version, status)
                result[handle] = status
            if found.memo is not NO_MEMO:
                found.memo["status"] = kept
        return result

    def cancel(self, handle: str) -> None:
        with self._workloads() as found:
            owner, pods = found.owner(handle), found.pods(handle)
            namespace = (owner["metadata"]["namespace"] if owner is not None
                         else pods[0]["metadata"]["namespace"] if pods else None)
        if namespace is None:
            return
        # The pods first (their owners, in the foreground), then what they used: their Secret
        # and NetworkPolicy go with them.
        kinds = [*(["RayJob"] if self.kuberay else []), "Job", "Deployment", "Service",
                 "NetworkPolicy", "Secret"]
        if self.kube.scheduler == "volcano":
            kinds.append("PodGroup")
        for kind in kinds:
            self._delete(f"delete {kind} {handle}", self._deleter(kind), handle, namespace,
                         body=FOREGROUND)

    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str:
        with self._workloads() as found:
            owner, all_pods = found.owner(handle), found.pods(handle)
        replicas = (owner.get("spec") or {}).get("completions") if owner is not None else None
        if _is_ray(owner):
            replicas = _expected_replicas(owner, len(all_pods))
        if replicas is not None and not 0 <= replica < replicas:
            raise DriverError(f"workload {handle} has no replica {replica}")
        if _is_ray(owner):
            found_pod = _ray_replicas(all_pods, replicas or 1).get(replica)
            pods = [found_pod] if found_pod is not None else []
        else:
            pods = [pod for position, pod in enumerate(sorted(all_pods, key=_created))
                    if _pod_index(pod, position) == replica]
        entrypoint = (self._entrypoint_log(handle, all_pods) if _is_ray(owner) and replica == 0
                      else "")
        if not pods and not entrypoint:  # cleaned up: the logs kept before
            kept = self._kept_log(handle, replica)
            if kept is not None and kept.exists():
                return tail_lines(kept.read_text(errors="replace"), tail)
            if owner is None and not all_pods:
                raise DriverError(f"no workload {handle!r} on cluster {self.cluster}")
            return ""  # not started yet
        if not entrypoint:
            return self._pod_log(handle, pods[-1], tail)
        head = self._pod_log(handle, pods[-1], None) if pods else ""
        if head and not head.endswith("\n"):
            head += "\n"
        return tail_lines(f"{head}{ENTRYPOINT_LOG_HEADING}{entrypoint}", tail)

    def _entrypoint_log(self, handle: str, pods: list[Obj]) -> str:
        """A RayJob's entrypoint output: KubeRay runs `ray job submit`, which follows the Ray
        job's logs, in its submitter pod; the newest one's log ("" before)."""
        submitters = [pod for pod in pods
                      if (pod["metadata"].get("labels") or {}).get(RAY_NODE_TYPE)
                      == SUBMITTER_TYPE]
        if not submitters:
            return ""
        return self._pod_log(handle, max(submitters, key=_created), None)

    def _pod_log(self, handle: str, pod: Obj, tail: int | None) -> str:
        # Raw bytes: the client (36.x) would hand back the repr of the bytes as the text.
        kwargs: dict[str, Any] = {"container": "main", "_preload_content": False}
        if tail is not None:
            kwargs["tail_lines"] = max(0, tail)
        try:
            response = self._call(
                "read logs", client.CoreV1Api(self.api).read_namespaced_pod_log,
                pod["metadata"]["name"], pod["metadata"]["namespace"], **kwargs)
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
        with self._workloads() as found:
            owners = found.owners()
            due = {handle: found.pods(handle) for handle, owner in owners.items()
                   if (ended := _ended_at(owner)) is not None and ended + ttl <= now}
        deleted = 0
        for handle, pods in due.items():
            for replica in self._replicas_with_pods(owners[handle], pods):
                kept = self._kept_log(handle, replica)
                assert kept is not None
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(self.logs(handle, replica=replica))
            self.cancel(handle)
            deleted += 1
        return deleted

    def ray_addresses(self, handle: str) -> dict[str, str] | None:
        """A Ray workload's head Service (`kube_ray.ray_cluster_addresses`): reached from
        the tenant's namespace and by the platform's dashboard proxy."""
        with self._workloads() as found:
            owner = found.owner(handle)
        if owner is None or owner.get("kind") != "RayJob":
            return None
        return ray_cluster_addresses(owner)

    def _replicas_with_pods(self, owner: Obj, pods: list[Obj]) -> list[int]:
        """The replica indexes that have a pod (a Ray cluster's: its head and workers)."""
        if _is_ray(owner):
            return sorted(_ray_replicas(pods, _expected_replicas(owner, len(pods))))
        return sorted({_pod_index(pod, position)
                       for position, pod in enumerate(sorted(pods, key=_created))})

    def endpoint(self, handle: str) -> str | None:
        with self._workloads() as found:
            owner = found.owner(handle)
        if owner is None or owner.get("kind") != "Deployment":
            return None
        template = ((owner.get("spec") or {}).get("template") or {}).get("spec") or {}
        ports = [p.get("containerPort") for c in template.get("containers") or []
                 for p in c.get("ports") or []]
        port = ports[0] if ports else 80
        return f"http://{handle}.{owner['metadata']['namespace']}.svc:{port}"


@dataclass
class _Workloads:
    """The managed objects of the cluster, by workload (a handle is the workload label)."""

    pod_store: Store
    jobs: Store
    deployments: Store
    rayjobs: Store | None = None  # on a cluster with KubeRay
    nodes: Store | None = None
    memo: dict = field(default_factory=dict)
    readiness: dict[str, bool] = field(default_factory=dict)

    def _owner_stores(self) -> tuple[Store, ...]:
        # (A Deployment first, as a list of Jobs then Deployments keyed by workload would; a
        # Ray workload has a RayJob and none of them.)
        return (*((self.rayjobs,) if self.rayjobs is not None else ()), self.deployments,
                self.jobs)

    def owner(self, handle: str) -> Obj | None:
        for store in self._owner_stores():
            found = store.labelled(handle)
            if found:
                return found[0]
        return None

    def owners(self) -> dict[str, Obj]:
        found: dict[str, Obj] = {}
        for store in reversed(self._owner_stores()):
            found.update({label: objs[next(iter(objs))] for label, objs in store.index.items()})
        return found

    def pods(self, handle: str) -> list[Obj]:
        return self.pod_store.labelled(handle)

    def ended(self, handle: str) -> WorkloadStatus | None:
        """A gone workload's end, if its objects' last states (tombstones) tell one: it ended
        and was deleted between two reconciles."""
        owner, pods = self.ended_owner(handle), self.ended_pods(handle)
        if owner is None and not pods:
            return None
        status = _workload_status(handle, owner, pods, self.ready)
        return status if status.phase in (Phase.SUCCEEDED, Phase.FAILED) else None

    def ended_owner(self, handle: str) -> Obj | None:
        for store in self._owner_stores():
            found = store.ended(handle)
            if found:
                return found[-1]
        return None

    def ended_pods(self, handle: str) -> list[Obj]:
        return self.pod_store.ended(handle)

    def ready(self, node: str) -> bool:
        known = self.readiness.get(node)
        if known is None:
            found = self.nodes.objects.get(("", node)) if self.nodes is not None else None
            known = self.readiness[node] = found is not None and _ready(found)[0]
        return known


# -- reading the API's objects (dicts, in the API's JSON shape) ----------------------------------


def _workload_status(handle: str, owner: Obj | None, pods: list[Obj],
                     ready: Callable[[str], bool]) -> WorkloadStatus:
    if owner is not None and _is_ray(owner):
        return _ray_status(handle, owner, pods, ready)
    expected = _expected_replicas(owner, len(pods))
    newest: dict[int, Obj] = {}
    if owner is not None and owner.get("kind") == "Deployment":
        # A Deployment replaces its pods: the replicas are its newest live pods, not the
        # ones being deleted or evicted (which would otherwise speak for a healthy service).
        live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")]
        newest = dict(enumerate(sorted(live, key=_created, reverse=True)[:expected]))
    else:
        for position, pod in enumerate(sorted(pods, key=_created)):
            newest[_pod_index(pod, position)] = pod
    replicas, node_lost = _replicas(newest, expected, ready)
    return summarize(handle, replicas, node_lost=node_lost)


def _replicas(newest: dict[int, Obj], expected: int,
              ready: Callable[[str], bool]) -> tuple[list[ReplicaStatus], str]:
    """Each replica's status from its pod (`newest`, by index), and a node lost under one."""
    replicas = []
    node_lost = ""
    for index in range(expected):
        found = newest.get(index)
        if found is None:
            replicas.append(ReplicaStatus(index=index, phase=Phase.PENDING,
                                          reason="no pod yet"))
            continue
        replica = _replica(index, found)
        node = (found.get("spec") or {}).get("nodeName") or ""
        if node and not ready(node) and replica.phase in (Phase.RUNNING, Phase.PENDING):
            node_lost = node_lost or node
            replica = ReplicaStatus(index=index, phase=Phase.FAILED, node=node,
                                    reason=f"node {node} is NotReady or gone")
        replicas.append(replica)
    return replicas, node_lost


def _is_ray(owner: Obj | None) -> bool:
    return owner is not None and owner.get("kind") == "RayJob"


def _live(pod: Obj) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


def _ray_replicas(pods: list[Obj], expected: int) -> dict[int, Obj]:
    """A Ray cluster's pods by replica: its head 0, its workers 1 on, in creation order.
    KubeRay replaces a pod that died: the live ones speak for the replicas, then the newest
    of the others."""
    by_type: dict[str, list[Obj]] = {"head": [], "worker": []}
    for pod in pods:
        node_type = (pod["metadata"].get("labels") or {}).get(RAY_NODE_TYPE)
        if node_type in by_type:
            by_type[node_type].append(pod)

    def chosen(group: list[Obj], count: int) -> list[Obj]:
        ordered = sorted(group, key=_created)
        live = [pod for pod in ordered if _live(pod)][:count]
        dead = [pod for pod in ordered if not _live(pod)]
        short = count - len(live)
        return sorted(live + (dead[-short:] if short > 0 else []), key=_created)

    found = dict(enumerate(chosen(by_type["head"], 1)))
    found.update(enumerate(chosen(by_type["worker"], expected - 1), start=1))
    return found


def _ray_status(handle: str, owner: Obj, pods: list[Obj],
                ready: Callable[[str], bool]) -> WorkloadStatus:
    """A Ray workload's phase is its RayJob's: the entrypoint's end ends it, with the RayJob's
    message. Its pods give each replica's detail, and a replica that fails (a crash, an image
    that will not pull, a lost node) fails it as it would any gang, before KubeRay replaces
    the pod: the platform retries whole attempts."""
    phase, reason = ray_job_phase(owner)
    expected = _expected_replicas(owner, len(pods))
    replicas, node_lost = _replicas(_ray_replicas(pods, expected), expected, ready)
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        end = Phase(phase)
        # KubeRay shuts the cluster down when the entrypoint ends: its pods go, not fail.
        replicas = [replica if replica.phase in (Phase.SUCCEEDED, Phase.FAILED) else
                    ReplicaStatus(index=replica.index, phase=end, node=replica.node,
                                  exit_code=0 if end == Phase.SUCCEEDED else None,
                                  reason="" if end == Phase.SUCCEEDED else reason)
                    for replica in replicas]
        return WorkloadStatus(workload_id=handle, phase=end,
                              exit_code=0 if end == Phase.SUCCEEDED else None, reason=reason,
                              replicas=tuple(replicas), node_lost=node_lost)
    summary = summarize(handle, replicas, node_lost=node_lost)
    if summary.phase == Phase.FAILED:
        return summary
    if phase == Phase.RUNNING:
        return dataclasses.replace(summary, phase=Phase.RUNNING, reason="")
    return dataclasses.replace(summary, phase=Phase.PENDING, reason=reason)


def _ready(node: Obj) -> tuple[bool, str]:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return (condition.get("status") == "True",
                    condition.get("message") or condition.get("reason") or "")
    return False, "no Ready condition"


def _node_info(node: Obj, allocated: int, *, rdma: str = "",
               rdma_allocated: int = 0) -> NodeInfo:
    """What a node offers and holds; `rdma` is the cluster's RDMA resource name, if any."""
    labels = dict(node["metadata"].get("labels") or {})
    spec, status = node.get("spec") or {}, node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    ready, message = _ready(node)
    cordoned = bool(spec.get("unschedulable"))
    taints = tuple(
        f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
        for t in spec.get("taints") or [])
    memory = labels.get("nvidia.com/gpu.memory", "")
    reason = "" if ready else f"NotReady: {message}"
    if cordoned:
        reason = (reason + "; " if reason else "") + "cordoned"
    return NodeInfo(
        name=node["metadata"]["name"],
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
        rdma=node_rdma(allocatable, rdma),
        rdma_allocated=rdma_allocated if rdma else None,
    )


def _internal_address(node: Obj) -> str:
    addresses = {a.get("type"): a.get("address")
                 for a in (node.get("status") or {}).get("addresses") or [] if a.get("address")}
    return addresses.get("InternalIP") or addresses.get("Hostname") or ""


def _moment(text: str | None) -> float | None:
    """An RFC 3339 time of the API ("2026-12-06T04:15:43Z") as a Unix timestamp."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _ended_at(owner: Obj) -> float | None:
    """When a Job completed or failed, or a RayJob's entrypoint ended (a Deployment never
    ends)."""
    status = owner.get("status") or {}
    if _is_ray(owner):
        if ray_job_phase(owner)[0] not in (Phase.SUCCEEDED, Phase.FAILED):
            return None
        return _moment(status.get("endTime"))
    if owner.get("kind") != "Job":
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return _moment(condition.get("lastTransitionTime") or status.get("completionTime"))
    return None


def _pod_gpus(pod: Obj) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(parse_quantity(limits.get(GPU, "0")))
    return total


def _created(pod: Obj) -> tuple[str, str]:
    return (pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"])


def _pod_index(pod: Obj, position: int) -> int:
    """Indexed Jobs label each pod with its completion index; a Deployment's pods are
    numbered in creation order."""
    meta = pod["metadata"]
    index = (meta.get("labels") or {}).get(INDEX_LABEL) or (
        meta.get("annotations") or {}).get(INDEX_LABEL)
    return int(index) if index is not None and str(index).isdigit() else position


def _expected_replicas(owner: Obj | None, found: int) -> int:
    if owner is None:
        return found
    spec = owner.get("spec") or {}
    if _is_ray(owner):
        groups = (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
        return 1 + sum(int(group.get("replicas") or 0) for group in groups)
    if owner.get("kind") == "Job":
        return int(spec.get("completions") or found or 1)
    return int(spec.get("replicas") or found or 1)


def _replica(index: int, pod: Obj) -> ReplicaStatus:
    """A pod's phase and container states, in the cluster's own words."""
    node = (pod.get("spec") or {}).get("nodeName") or ""
    status = pod.get("status") or {}
    phase = status.get("phase")
    states = [s.get("state") or {} for s in status.get("containerStatuses") or []]
    terminated = next((s["terminated"] for s in states if s.get("terminated")), None)
    waiting = next((s["waiting"] for s in states if s.get("waiting")), None)
    if phase == "Succeeded":
        return ReplicaStatus(index=index, phase=Phase.SUCCEEDED, node=node, exit_code=0)
    if phase == "Failed" or (terminated is not None and terminated.get("exitCode")):
        code = terminated.get("exitCode") if terminated is not None else None
        words = (terminated.get("reason") if terminated is not None else "") or \
            status.get("reason") or ""
        message = (terminated.get("message") if terminated is not None else "") or \
            status.get("message")
        reason = words or "Failed"
        if code is not None:
            reason += f" (exit code {code})"
        if message:
            reason += f": {message.strip()}"
        return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, exit_code=code,
                             reason=reason)
    if waiting is not None and waiting.get("reason") in STUCK:
        reason = waiting["reason"] + (f": {waiting['message']}" if waiting.get("message") else "")
        return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, reason=reason)
    if phase == "Running":
        return ReplicaStatus(index=index, phase=Phase.RUNNING, node=node)
    reason = "pending"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = (f"{condition.get('reason') or 'Unschedulable'}: "
                      f"{condition.get('message') or ''}").strip()
    if waiting is not None:
        reason = (waiting.get("reason") or "") + (
            f": {waiting['message']}" if waiting.get("message") else "")
    return ReplicaStatus(index=index, phase=Phase.PENDING, node=node, reason=reason)
