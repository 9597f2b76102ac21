"""Nodes bought by a Kubernetes cluster's own autoscaler, asked for with ProvisioningRequests.

Where a cluster runs cluster-autoscaler with the `ProvisioningRequest` CRD
(`autoscaling.x-k8s.io/v1`, the object Kueue's provisioning admission check creates), the
platform does not buy nodes itself: it asks the autoscaler for a gang's capacity in one request,
with the `best-effort-atomic-scale-up` class (all the nodes or none), and the autoscaler buys from
its cloud. A request is a PodTemplate of one whole node of the type (its GPUs) and a
ProvisioningRequest for `count` of them. Once the autoscaler says `Provisioned`, the nodes that
joined for it (the type's labels, created after the request, not taken by another request) are
named in the request's `ogai.io/nodes` annotation, so a node is matched once and for good; a
`Failed` condition fails the request with the autoscaler's words. Deleting any node of a request
withdraws the request: the autoscaler then takes the nodes back once they are unneeded, by its
own rules.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from podsys.providers.base import (
    CapacityProvider,
    NodeState,
    NodeType,
    ProviderError,
    ProviderNode,
)

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
POOL_LABEL = "ogai.io/pool"
TYPE_LABEL = "ogai.io/node-type"
NODES_ANNOTATION = "ogai.io/nodes"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


class ProvisioningRequestProvider(CapacityProvider):
    """Options: `types` (NodeType fields, one dict a type, each with an optional
    `node_selector`: the labels the autoscaler's nodes of that type carry), `namespace` (where
    the requests live, default `ogai-capacity`) and `provisioning_class` (default the atomic
    scale-up). It works through the pool's cluster's Kubernetes driver (`attach`)."""

    needs_cluster = True

    def __init__(self, *, name: str, options: dict | None = None) -> None:
        super().__init__(name=name, options=options)
        self.namespace = str(self.options.get("namespace") or "ogai-capacity")
        self.provisioning_class = str(self.options.get("provisioning_class") or ATOMIC)
        self._types: dict[str, tuple[NodeType, dict[str, str]]] = {}
        for raw in self.options.get("types") or []:
            fields = dict(raw)
            selector = {str(k): str(v) for k, v in (fields.pop("node_selector", {}) or {}).items()}
            try:
                found = NodeType(**fields)
            except TypeError as exc:
                raise ProviderError(f"node type {raw!r} is not valid: {exc}") from None
            self._types[found.name] = (found, selector)
        self._driver: Any = None

    def attach(self, driver: Any) -> None:
        """The Kubernetes driver of the cluster the nodes join: its API connection is used."""
        self._driver = driver

    # -- the API ------------------------------------------------------------------------------

    def _api(self) -> client.ApiClient:
        if self._driver is None:
            raise ProviderError(f"provider {self.name} is not attached to a Kubernetes cluster")
        return self._driver.api

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and fn.__name__ == "list_namespaced_custom_object":
                raise ProviderError(f"provider {self.name}: the cluster has no ProvisioningRequest"
                                    " CRD (install cluster-autoscaler with provisioning "
                                    "requests)") from None
            raise ProviderError(f"provider {self.name}: {what}: {exc.status} "
                                f"{exc.reason}") from None
        except Exception as exc:  # urllib3's connection errors
            raise ProviderError(f"provider {self.name}: cannot reach the cluster to {what} "
                                f"({type(exc).__name__})") from None

    # -- the contract -------------------------------------------------------------------------

    def types(self) -> list[NodeType]:
        return [found for found, _ in self._types.values()]

    def request(self, *, request_id: str, node_type: str, count: int) -> list[ProviderNode]:
        wanted = self.node_type(node_type)
        if count < 1:
            raise ProviderError(f"a request needs at least one node, not {count}")
        selector = self._types[node_type][1]
        core = client.CoreV1Api(self._api())
        custom = client.CustomObjectsApi(self._api())
        self._ensure_namespace(core)
        labels = {POOL_LABEL: self.name, TYPE_LABEL: node_type}
        gpus = str(wanted.gpus)
        template = {
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": request_id, "labels": labels},
            "template": {"spec": {
                "restartPolicy": "Never", "nodeSelector": dict(selector),
                "containers": [{"name": "capacity", "image": PAUSE_IMAGE, "resources": {
                    "requests": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": gpus}}}],
            }},
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest",
            "metadata": {"name": request_id, "labels": labels},
            "spec": {"provisioningClassName": self.provisioning_class,
                     "podSets": [{"podTemplateRef": {"name": request_id}, "count": count}]},
        }
        try:
            core.create_namespaced_pod_template(self.namespace, template)
        except ApiException as exc:
            if exc.status != 409:
                raise ProviderError(f"provider {self.name}: create the pod template: "
                                    f"{exc.status} {exc.reason}") from None
        try:
            created = custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                             PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                raise ProviderError(f"provider {self.name}: create the provisioning request: "
                                    f"{exc.status} {exc.reason}") from None
            created = self._call("read the provisioning request",
                                 custom.get_namespaced_custom_object, GROUP, VERSION,
                                 self.namespace, PLURAL, request_id)
            first = _count(created)
            if first != count:
                raise ProviderError(
                    f"request {request_id} was for {first} nodes, not {count}") from None
        return self._nodes_of(created, self._cluster_nodes(core), set())

    def nodes(self) -> list[ProviderNode]:
        api = self._api()
        listed = self._call("list provisioning requests",
                            client.CustomObjectsApi(api).list_namespaced_custom_object,
                            GROUP, VERSION, self.namespace, PLURAL,
                            label_selector=f"{POOL_LABEL}={self.name}")
        requests = sorted(listed.get("items") or [],
                          key=lambda r: (r["metadata"].get("creationTimestamp") or "",
                                         r["metadata"]["name"]))
        taken = {name for r in requests for name in _named(r)}
        cluster_nodes = self._cluster_nodes(client.CoreV1Api(api))
        found: list[ProviderNode] = []
        for request in requests:
            found += self._nodes_of(request, cluster_nodes, taken)
        return found

    def delete(self, node_id: str) -> None:
        request_id = node_id.rsplit("/", 1)[0]
        api = self._api()
        for what, fn in (
            ("withdraw the provisioning request", lambda: client.CustomObjectsApi(api)
             .delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                              request_id)),
            ("delete the pod template", lambda: client.CoreV1Api(api)
             .delete_namespaced_pod_template(request_id, self.namespace)),
        ):
            try:
                fn()
            except ApiException as exc:
                if exc.status != 404:
                    raise ProviderError(f"provider {self.name}: {what}: {exc.status} "
                                        f"{exc.reason}") from None

    # -- helpers ------------------------------------------------------------------------------

    def _ensure_namespace(self, core: client.CoreV1Api) -> None:
        try:
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": self.namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise ProviderError(f"provider {self.name}: create namespace {self.namespace}: "
                                    f"{exc.status} {exc.reason}") from None

    def _cluster_nodes(self, core: client.CoreV1Api) -> list[Any]:
        listed = self._call("list nodes", core.list_node)
        return sorted(listed.items or [], key=lambda n: (n.metadata.creation_timestamp,
                                                         n.metadata.name))

    def _nodes_of(self, request: dict, cluster_nodes: list[Any],
                  taken: set[str]) -> list[ProviderNode]:
        """The request's nodes: booting until the autoscaler says Provisioned and they have
        joined, then ready under their names in the cluster."""
        meta = request["metadata"]
        name, count = meta["name"], _count(request)
        node_type = (meta.get("labels") or {}).get(TYPE_LABEL, "")
        requested_at = _timestamp(meta.get("creationTimestamp"))
        conditions = {c.get("type"): c for c in (request.get("status") or {}).get("conditions")
                      or [] if c.get("status") == "True"}
        ids = [f"{name}/{i}" for i in range(count)]
        if "Failed" in conditions or "CapacityRevoked" in conditions:
            why = (conditions.get("Failed") or conditions["CapacityRevoked"]).get("message", "")
            return [ProviderNode(i, node_type, name, NodeState.FAILED, requested_at,
                                 reason=f"the cluster's autoscaler: {why}") for i in ids]
        named = _named(request)
        if "Provisioned" in conditions and len(named) < count:
            named = self._match(request, cluster_nodes, taken, count)
        if "Provisioned" not in conditions or len(named) < count:
            return [ProviderNode(i, node_type, name, NodeState.BOOTING, requested_at)
                    for i in ids]
        ready_at = _timestamp(conditions["Provisioned"].get("lastTransitionTime"))
        return [ProviderNode(i, node_type, name, NodeState.READY, requested_at, ready_at,
                             node_name=node) for i, node in zip(ids, named, strict=True)]

    def _match(self, request: dict, cluster_nodes: list[Any], taken: set[str],
               count: int) -> list[str]:
        """Name the nodes that joined for a provisioned request, once (kept in its
        annotation): the type's labels and GPUs, created after the request, not taken."""
        node_type = (request["metadata"].get("labels") or {}).get(TYPE_LABEL, "")
        if node_type not in self._types:
            return []
        wanted, selector = self._types[node_type]
        since = _datetime(request["metadata"].get("creationTimestamp"))
        fits = []
        for node in cluster_nodes:
            labels = node.metadata.labels or {}
            gpus = int((node.status.capacity or {}).get("nvidia.com/gpu", 0) or 0)
            created = node.metadata.creation_timestamp
            if node.metadata.name in taken or gpus != wanted.gpus:
                continue
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if since is not None and created is not None and created < since:
                continue
            fits.append(node.metadata.name)
        if len(fits) < count:
            return fits
        chosen = fits[:count]
        taken.update(chosen)
        self._call("name the request's nodes",
                   client.CustomObjectsApi(self._api()).patch_namespaced_custom_object,
                   GROUP, VERSION, self.namespace, PLURAL, request["metadata"]["name"],
                   {"metadata": {"annotations": {NODES_ANNOTATION: ",".join(chosen)}}})
        return chosen


def _count(request: dict) -> int:
    return sum(int(p.get("count", 0)) for p in (request.get("spec") or {}).get("podSets") or [])


def _named(request: dict) -> list[str]:
    text = ((request["metadata"].get("annotations") or {}).get(NODES_ANNOTATION) or "")
    return [name for name in text.split(",") if name]


def _datetime(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def _timestamp(text: str | None) -> float:
    found = _datetime(text)
    return found.timestamp() if found else 0.0
