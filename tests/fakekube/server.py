"""An in-process fake Kubernetes API server for tests, spoken to over real HTTP by the official
``kubernetes`` client.

What it simulates:

* the REST surface OGAI's Kubernetes driver uses (discovery, namespaces, nodes, pods and their
  logs, services, secrets, events, batch/v1 Jobs, apps/v1 Deployments, networking.k8s.io/v1
  NetworkPolicies, and, when switched on, Volcano PodGroups and Kueue objects as plain custom
  resources), the kinds of the platform's own manifests (ConfigMaps, ServiceAccounts, claims,
  RBAC, Ingresses, autoscalers, disruption budgets; stored and checked, not acted on, and the
  Prometheus Operator's and CloudNativePG's custom resources when switched on), with list
  selectors, resource versions, uids, timestamps, Status-shaped errors and bearer-token
  authentication;
* schema validation of every body written (``podsys.drivers.kube_schema.check_object``) plus the
  API server's name and label syntax rules, a Secret's data keys and base64, a NetworkPolicy's
  peers, ports and CIDRs (``network.py``): a bad body answers 422 Invalid; Secrets keep
  ``stringData`` as base64 ``data``, as the real server does;
* Pod Security Admission (``pod_security.py``): a namespace's ``enforce`` level refuses pods
  that break it (403 on a pod created directly, a ``FailedCreate`` event and no pod for a Job's
  or Deployment's); NetworkPolicies as an enforcing network plugin would apply them,
  asked through ``can_connect``;
* the Job controller (pods per index, status counters, ``Complete``/``Failed`` conditions,
  replacement pods up to ``backoffLimit``, suspend), a Deployment controller that keeps
  ``replicas`` pods, the garbage collector (propagation policies on delete), and a scheduler
  (readiness, cordons, nodeSelector, required node affinity, taints, cpu/memory/GPU capacity,
  ``FailedScheduling`` events);
* the kubelet only as far as the test drives it: ``start_pods``, ``finish_pod``, ``oom``,
  ``crash_loop``, ``fail_image_pulls``, ``set_logs``; a container whose environment names a
  missing Secret or key waits in ``CreateContainerConfigError``, and ``container_env`` shows
  the environment a started container gets. ``kubelet.py`` is a kubelet that runs the
  containers' commands as processes of this machine, for tests that need real output.

* watches on every collection (``?watch=true``): newline-delimited JSON events in a chunked
  HTTP/1.1 body, from a ``resourceVersion`` (none or "0": the current objects first, as
  ADDED), with label and field selectors applied to events as to lists (an object leaving a
  watch's selector is DELETED to it), ``BOOKMARK`` events soon after the version advances when
  ``allowWatchBookmarks`` asks (a real server sends one about a minute), ``timeoutSeconds``;
  a bounded history per kind (``watch_history`` events), so a too-old version is answered 410
  Gone, by default as an ERROR event inside the stream as real servers do
  (``watch_gone_as_http``: an HTTP 410); test hooks ``compact_watch_history`` and
  ``drop_watches``; ``traffic`` counts every request and every byte sent, watches' apart;
  ``load`` puts many objects straight into the store (for benchmarks), ``put_object`` and
  ``delete_object`` change one without the controllers.

What it does not: server-side apply, strategic merge patch semantics for lists (a
strategic merge patch is applied as a JSON merge patch, so lists are replaced whole), ReplicaSets
(Deployment pods are owned by the Deployment itself), endpoints, graceful termination (deleted
objects vanish at once), Volcano gang scheduling and Kueue admission, preemption, RBAC.

Every object is a plain dict shaped like the real API's JSON (camelCase keys).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import copy
import itertools
import json
import random
import re
import secrets
import select
import socket
import string
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from podsys.drivers.kube_schema import SchemaError, check_object
from tests.fakekube import network, pod_security

# --------------------------------------------------------------------------------------------
# Resources and errors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives and what it holds."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    feature: str | None = None  # "volcano" / "kueue": served only when the test enables it
    custom: bool = False  # a custom resource: no strategic merge patch, items keep their kind

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The name the API server uses in messages: ``pods``, ``jobs.batch``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "nodes", "Node", namespaced=False),
    Resource("", "v1", "pods", "Pod", namespaced=True),
    Resource("", "v1", "services", "Service", namespaced=True),
    Resource("", "v1", "secrets", "Secret", namespaced=True),
    Resource("", "v1", "events", "Event", namespaced=True),
    Resource("batch", "v1", "jobs", "Job", namespaced=True),
    Resource("apps", "v1", "deployments", "Deployment", namespaced=True),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", namespaced=True),
    Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", namespaced=True,
             feature="volcano", custom=True),
    Resource("scheduling.volcano.sh", "v1beta1", "queues", "Queue", namespaced=False,
             feature="volcano", custom=True),
    # KubeRay's RayJob (feature "ray"): stored and checked for its common shape only.
    Resource("ray.io", "v1", "rayjobs", "RayJob", namespaced=True, feature="ray", custom=True),
    Resource("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue", namespaced=True,
             feature="kueue", custom=True),
    Resource("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", namespaced=False,
             feature="kueue", custom=True),
    Resource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", namespaced=True,
             feature="kueue", custom=True),
    Resource("", "v1", "podtemplates", "PodTemplate", namespaced=True),
    Resource("autoscaling.x-k8s.io", "v1", "provisioningrequests", "ProvisioningRequest",
             namespaced=True, feature="provisioning", custom=True),
    # What the platform's own manifests (platform/kubernetes/) hold besides.
    Resource("", "v1", "configmaps", "ConfigMap", namespaced=True),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
             namespaced=False),
    Resource("networking.k8s.io", "v1", "ingresses", "Ingress", namespaced=True),
    Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
             namespaced=True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True),
    Resource("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor",
             namespaced=True, feature="monitoring", custom=True),
    Resource("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule",
             namespaced=True, feature="monitoring", custom=True),
    Resource("postgresql.cnpg.io", "v1", "clusters", "Cluster", namespaced=True,
             feature="cnpg", custom=True),
]
# Kinds with no spec (defaulting must not add one).
NO_SPEC = ("Event", "Secret", "ConfigMap", "ServiceAccount", "Role", "ClusterRole",
           "RoleBinding", "ClusterRoleBinding")
BY_KIND = {r.kind: r for r in RESOURCES}
GROUPS = {"batch": "v1", "apps": "v1", "networking.k8s.io": "v1",
          "rbac.authorization.k8s.io": "v1", "autoscaling": "v2", "policy": "v1",
          "monitoring.coreos.com": "v1", "postgresql.cnpg.io": "v1",
          "scheduling.volcano.sh": "v1beta1", "kueue.x-k8s.io": "v1beta1",
          "autoscaling.x-k8s.io": "v1", "ray.io": "v1"}
GROUP_FEATURE = {"ray.io": "ray", "scheduling.volcano.sh": "volcano", "kueue.x-k8s.io": "kueue",
                 "monitoring.coreos.com": "monitoring", "postgresql.cnpg.io": "cnpg",
                 "autoscaling.x-k8s.io": "provisioning"}

REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
           405: "MethodNotAllowed", 409: "AlreadyExists", 410: "Expired",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
           500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


class ApiError(Exception):
    """Answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, message: str, reason: str | None = None,
                 details: dict | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


@dataclass
class WatchRequest:
    """A watch the handler streams: newline-delimited JSON events in a chunked response."""

    res: Resource
    namespace: str | None
    query: dict
    since: int  # events after this resourceVersion; -1: the current objects first, as ADDED
    gone: str = ""  # non-empty: the version is too old, answered by this ERROR message


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.qualified} "{name}" not found',
                    details={"name": name, "group": res.group, "kind": res.plural})


def invalid(res: Resource, name: str, message: str, field: str = "") -> ApiError:
    return ApiError(422, f'{res.kind} "{name}" is invalid: {message}', details={
        "name": name, "group": res.group, "kind": res.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]})


# --------------------------------------------------------------------------------------------
# Small helpers: time, names, quantities, selectors, patches
# --------------------------------------------------------------------------------------------


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def rand5() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))  # noqa: S311


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def check_names(res: Resource, obj: dict) -> None:
    """The API server's syntax rules for names and labels (422 when broken)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    label_like = res.kind in ("Namespace", "Service", "Job")  # DNS labels (Jobs: 63 chars)
    if label_like and (len(name) > 63 or not _DNS_LABEL.match(name)):
        raise invalid(res, name, "a lowercase RFC 1123 label must consist of lower case "
                      "alphanumeric characters or '-', at most 63 characters", "metadata.name")
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise invalid(res, name, "a lowercase RFC 1123 subdomain must consist of lower case "
                      "alphanumeric characters, '-' or '.'", "metadata.name")
    sources = [("metadata.labels", meta.get("labels"))]
    template = (obj.get("spec") or {}).get("template") or {}
    sources.append(("spec.template.metadata.labels", (template.get("metadata") or {})
                    .get("labels")))
    for where, labels in sources:
        for key, value in (labels or {}).items():
            prefix, _, base = key.rpartition("/")
            if (not base or len(base) > 63 or not _LABEL_NAME.match(base)
                    or (prefix and not _DNS_SUBDOMAIN.match(prefix))):
                raise invalid(res, name, f"invalid label key {key!r}", f"{where}")
            if not isinstance(value, str) or len(value) > 63 or (
                    value and not _LABEL_NAME.match(value)):
                raise invalid(res, name, f"invalid label value {value!r} for {key!r}: at most "
                              "63 alphanumerics, '-', '_' or '.'", f"{where}")


_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             "m": Fraction(1, 1000), "": 1}


def quantity(value: Any) -> Fraction:
    """A Kubernetes resource quantity ("500m", "64", "512Gi", 8) as a number."""
    text = str(value).strip()
    match = re.fullmatch(r"([+-]?[0-9.]+)(?:[eE]([+-]?\d+))?([A-Za-z]*)", text)
    if not match or match.group(3) not in _SUFFIXES:
        raise ValueError(f"bad quantity {value!r}")
    number = Fraction(match.group(1)) * _SUFFIXES[match.group(3)]
    return number * Fraction(10) ** int(match.group(2)) if match.group(2) else number


def _split_top(text: str) -> list[str]:
    """Split a selector on the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_selector_matches(selector: str | None, labels: dict | None) -> bool:
    """``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``; AND."""
    labels = labels or {}
    for term in _split_top(selector or ""):
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = match.group(1), match.group(2), {
                v.strip() for v in match.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def field_selector_matches(selector: str | None, obj: dict) -> bool:
    """``path=value``, ``path==value``, ``path!=value`` on any dotted path; AND."""
    for term in _split_top(selector or ""):
        negate = "!=" in term
        path, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        actual = dig(obj, path.strip())
        actual = "" if actual is None else str(actual)
        if (actual == value.strip()) == negate:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict, operations: list) -> dict:
    """RFC 6902 JSON patch: add, remove, replace and test."""
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise ApiError(400, "a JSON patch operation needs op and path")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last, kind = parts[-1], op.get("op")
        try:
            if kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if current != op.get("value"):
                    raise ApiError(422, f"test operation failed at {op['path']}", "Invalid")
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, op["value"])
                    else:
                        parent[index] = op["value"]
                else:
                    if kind == "replace" and last not in parent:
                        raise ApiError(422, f"replace of a missing path {op['path']}", "Invalid")
                    parent[last] = op["value"]
            else:
                raise ApiError(400, f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError) as exc:
            raise ApiError(422, f"JSON patch failed at {op['path']}: {exc}", "Invalid") from exc
    return doc


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


class Store:
    """Objects by kind, then by (namespace, name); a global resourceVersion counter."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict]] = {r.kind: {} for r in RESOURCES}
        self._version = itertools.count(1)
        self._sequence = itertools.count(1)
        self.resource_version = "0"
        self.changes = 0  # writes of anything but Events: lets the controllers settle
        self.created: dict[str, int] = {}  # uid -> creation order
        # Told of every change ("ADDED", "MODIFIED" or "DELETED", the object): feeds watches.
        self.listener: Any = None
        self._sorted: dict[str, list[tuple[str, str]]] = {}  # kind -> keys, while unchanged

    def bump(self) -> str:
        self.resource_version = str(next(self._version))
        return self.resource_version

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        return self.objects[kind].get((namespace or "", name))

    def put(self, obj: dict) -> dict:
        """Store (insert or replace) an object, stamping uid, timestamps and resourceVersion."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["resourceVersion"] = self.bump()
        self.created.setdefault(meta["uid"], next(self._sequence))
        self.changes += obj["kind"] != "Event"
        key = (meta.get("namespace", ""), meta["name"])
        existed = key in self.objects[obj["kind"]]
        if not existed:
            self._sorted.pop(obj["kind"], None)
        self.objects[obj["kind"]][key] = obj
        if self.listener is not None:
            self.listener("MODIFIED" if existed else "ADDED", obj)
        return obj

    def remove(self, obj: dict) -> None:
        meta = obj["metadata"]
        gone = self.objects[obj["kind"]].pop((meta.get("namespace", ""), meta["name"]), None)
        self._sorted.pop(obj["kind"], None)
        self.bump()
        self.changes += 1
        if gone is not None and self.listener is not None:
            self.listener("DELETED", obj)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        return list(self.iter(kind, namespace))

    def iter(self, kind: str, namespace: str | None = None) -> Any:
        """``list``, one at a time (a small page of a large list stays cheap)."""
        items = self.objects[kind]
        keys = self._sorted.get(kind)
        if keys is None:
            keys = self._sorted[kind] = sorted(items)
        return (items[key] for key in keys if namespace is None or key[0] == namespace)


# --------------------------------------------------------------------------------------------
# The server: HTTP, routing, handlers, test controls, simulation
# --------------------------------------------------------------------------------------------


# Resource paths, core and grouped (tests map recorded requests to RBAC verbs with them too).
CORE_PATH = re.compile(r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)"
                       r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
GROUPED_PATH = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)"
                          r"(?:/namespaces/(?P<ns>[^/]+))?"
                          r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
FINISHED = ("Succeeded", "Failed")
OWNER_LABELS = ("batch.kubernetes.io/job-name", "job-name")


class FakeKube:
    """A fake API server. ``start()`` it (or use the ``fake_kube`` fixture), point the client at
    ``kubeconfig()``, add nodes with ``add_node`` and drive pods with the test controls."""

    def __init__(self, volcano: bool = False, kueue: bool = False,
                 provisioning: bool = False, monitoring: bool = False,
                 cnpg: bool = False, ray: bool = False) -> None:
        # provisioning: cluster-autoscaler's ProvisioningRequest CRD is installed (the test
        # plays the autoscaler with `provision`). monitoring: the Prometheus Operator's CRDs;
        # cnpg: CloudNativePG's (their objects are stored, nothing acts on them).
        self.volcano, self.kueue, self.provisioning = volcano, kueue, provisioning
        self.monitoring, self.cnpg, self.ray = monitoring, cnpg, ray
        self.auto_run = False  # bound pods go Running at once
        self.token = secrets.token_hex(16)
        self.store = Store()
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []  # (method, path without query)
        self.request_details: list[dict] = []  # method, path, query, authorization, body
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container or "") -> text
        self.failing_images: set[str] = set()
        self._failures: list[dict] = []
        self._ips = itertools.count(2)
        # The Job controller's memory, by Job uid: pods already counted, indexes succeeded.
        self._counted: dict[str, set[str]] = {}
        self._done_indexes: dict[str, set[int]] = {}
        self._unschedulable: dict[str, str] = {}  # pod uid -> message, during one settle
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        # Watches: every change as an event, by kind, in resourceVersion order; a watch from a
        # version older than what is kept answers 410 Gone.
        self.watch_history = 10_000  # events kept per kind
        self.watch_gone_as_http = False  # True: a too-old version is an HTTP 410, not an ERROR
        self._history: dict[str, list[tuple[int, str, dict, dict | None, list]]] = {}
        self._history_floor: dict[str, int] = {}  # kind -> the newest version no longer kept
        self._snapshots: dict[tuple[str, str, str], dict] = {}  # each object as last told
        self._watch_changed = threading.Condition(self.lock)
        self._watch_epoch = 0  # bumped to drop every open watch
        self.watches_open = 0
        # What the server sent: every request answered and every byte (headers, bodies, watch
        # events), and the part of it that was watches.
        self.traffic = {"requests": 0, "bytes": 0, "watch_requests": 0, "watch_bytes": 0}
        self._traffic_lock = threading.Lock()
        self.store.listener = self._record
        for namespace in ("default", "kube-system"):  # as in a real cluster
            self.add_namespace(namespace)

    # -- lifecycle and connection helpers ------------------------------------------------------

    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._handler = Handler
        self._serve()
        return self

    def _serve(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True, name=f"fakekube:{self.port}")
        self._thread.start()

    def stop(self) -> None:
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refuse_connections(self) -> None:
        """Close the listening socket: the client gets "connection refused"."""
        self.stop()

    def accept_connections(self) -> None:
        """Listen again, on the same port."""
        if self._server is None:
            self._serve()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, namespace: str = "default") -> str:
        """A kubeconfig YAML for this server (bearer token, one context)."""
        return "\n".join([
            "apiVersion: v1",
            "kind: Config",
            "clusters:",
            "- name: fake",
            "  cluster:",
            f"    server: {json.dumps(self.url)}",
            "users:",
            "- name: fake-user",
            "  user:",
            f"    token: {json.dumps(self.token)}",
            "contexts:",
            "- name: fake",
            "  context:",
            "    cluster: fake",
            "    user: fake-user",
            f"    namespace: {json.dumps(namespace)}",
            "current-context: fake",
            "",
        ])

    # -- introspection ---------------------------------------------------------------------------

    def objects(self, kind: str, namespace: str | None = None) -> list[dict]:
        """The stored objects of a kind ("Pod", "Job", ...), copies, sorted by namespace/name."""
        with self.lock:
            return copy.deepcopy(self.store.list(kind, namespace))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        with self.lock:
            obj = self._find(kind, name, namespace)
            return copy.deepcopy(obj) if obj else None

    def pods(self, label_selector: str | None = None, namespace: str | None = None) -> list[dict]:
        with self.lock:
            return [copy.deepcopy(p) for p in self.store.list("Pod", namespace)
                    if label_selector_matches(label_selector, p["metadata"].get("labels"))]

    def _find(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        for obj in self.store.list(kind, namespace):
            if obj["metadata"]["name"] == name:
                return obj
        return None

    def _pod(self, name: str) -> dict:
        pod = self._find("Pod", name)
        if pod is None:
            raise KeyError(f"no pod {name}")
        return pod

    # -- failure injection -----------------------------------------------------------------------

    def fail_next(self, method: str, path_regex: str, status: int = 500, times: int = 1,
                  message: str | None = None) -> None:
        """Answer the next ``times`` requests whose method matches (``"*"`` for any) and whose
        path (no query) ``re.search``-es ``path_regex`` with an error Status, without applying
        them."""
        with self.lock:
            self._failures.append({"method": method.upper(), "path": re.compile(path_regex),
                                   "status": status, "times": times, "message": message})

    def _injected_failure(self, method: str, path: str) -> ApiError | None:
        with self.lock:
            for failure in self._failures:
                if failure["method"] in ("*", method) and failure["path"].search(path):
                    failure["times"] -= 1
                    if failure["times"] <= 0:
                        self._failures.remove(failure)
                    return ApiError(failure["status"], failure["message"]
                                    or f"injected failure for {method} {path}")
        return None

    # -- watches ---------------------------------------------------------------------------------

    def _record(self, type_: str, obj: dict) -> None:
        """Keep a change as an event (a copy of the object as it is now, and as it was before)
        for the watches, and wake them."""
        kind, meta = obj["kind"], obj["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        version = int(self.store.resource_version)
        before = self._snapshots.get(key)
        now_ = copy.deepcopy(obj)
        now_["metadata"]["resourceVersion"] = str(version)
        if type_ == "DELETED":
            self._snapshots.pop(key, None)
        else:
            self._snapshots[key] = now_
        history = self._history.setdefault(kind, [])
        history.append((version, type_, now_, before, []))
        if len(history) > self.watch_history * 5 // 4:  # trimmed now and then, not every time
            cut = len(history) - self.watch_history
            self._history_floor[kind] = history[cut - 1][0]
            del history[:cut]
        with self._watch_changed:
            self._watch_changed.notify_all()

    def compact_watch_history(self) -> None:
        """Forget every event so far (as etcd compaction does): a watch from an older version
        than the current one is answered 410 Gone."""
        with self.lock:
            for kind in self.store.objects:
                self._history[kind] = []
                self._history_floor[kind] = int(self.store.resource_version)

    def drop_watches(self) -> None:
        """Cut every open watch connection (without the end of the chunked body, as a network
        failure would)."""
        with self._watch_changed:
            self._watch_epoch += 1
            self._watch_changed.notify_all()

    def reset_traffic(self) -> dict:
        """The counters so far, and start them again from zero."""
        with self._traffic_lock:
            counted = dict(self.traffic)
            self.traffic = dict.fromkeys(self.traffic, 0)
            return counted

    def _count(self, sent: int, watch: bool) -> None:
        with self._traffic_lock:
            self.traffic["bytes"] += sent
            if watch:
                self.traffic["watch_bytes"] += sent

    def _watch_request(self, res: Resource, ns: str | None, query: dict) -> WatchRequest:
        with self._traffic_lock:
            self.traffic["watch_requests"] += 1
        version = query.get("resourceVersion") or ""
        if version in ("", "0"):
            return WatchRequest(res, ns, query, since=-1)
        if not version.isdigit():
            raise ApiError(400, f"invalid resource version {version!r}")
        floor = self._history_floor.get(res.kind, 0)
        if int(version) < floor:
            message = f"too old resource version: {version} ({floor + 1})"
            if self.watch_gone_as_http:
                raise ApiError(410, message)
            return WatchRequest(res, ns, query, since=int(version), gone=message)
        return WatchRequest(res, ns, query, since=int(version))

    def serve_watch(self, watch: WatchRequest, write: Any, gone: Any = None) -> bool:
        """Stream a watch's events through ``write(bytes)`` (one call a batch of lines) until
        its ``timeoutSeconds`` pass (True: end the body cleanly), the watch is dropped or the
        server stops (False: cut the connection), or its version falls out of the history (an
        ERROR event with a 410 Status, as a real server sends inside the stream). ``gone()``
        says whether the client closed its end (checked about once a second)."""
        res, query = watch.res, watch.query
        labels, fields = query.get("labelSelector"), query.get("fieldSelector")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)

        def matches(obj: dict | None) -> bool:
            return obj is not None and (
                watch.namespace is None or obj["metadata"].get("namespace") == watch.namespace
            ) and label_selector_matches(labels, obj["metadata"].get("labels")) and \
                field_selector_matches(fields, obj)

        def line(type_: str, body: bytes) -> bytes:
            return b'{"type":"' + type_.encode() + b'","object":' + body + b"}\n"

        def error(message: str) -> bytes:
            return line("ERROR", json.dumps(ApiError(410, message).status()).encode())

        if watch.gone:
            write(error(watch.gone))
            return True
        with self._watch_changed:
            epoch = self._watch_epoch
            self.watches_open += 1
            if watch.since < 0:  # the current objects first, then what changes
                told = int(self.store.resource_version)
                first = [line("ADDED", json.dumps(self._snapshots.get(
                    (res.kind, o["metadata"].get("namespace", ""), o["metadata"]["name"]), o))
                    .encode()) for o in self.store.list(res.kind) if matches(o)]
            else:
                told, first = watch.since, []
        try:
            if first:
                write(b"".join(first))
            while True:
                with self._watch_changed:
                    while True:
                        if self._watch_epoch != epoch or (gone is not None and gone()):
                            return False
                        history = self._history.get(res.kind, [])
                        if told < self._history_floor.get(res.kind, 0):
                            write(error(f"too old resource version: {told} "
                                        f"({self._history_floor[res.kind] + 1})"))
                            return True
                        start = bisect.bisect_right(history, told, key=lambda e: e[0])
                        events = history[start:]
                        current = int(self.store.resource_version)
                        if events or (bookmarks and current > told):
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return True
                        self._watch_changed.wait(min(left, 1.0))
                lines = []
                for version, type_, now_, before, encoded in events:
                    was, is_ = matches(before), type_ != "DELETED" and matches(now_)
                    told_as = ("MODIFIED" if was and is_ else "ADDED" if is_ else
                               "DELETED" if was else "")
                    if told_as:
                        if not encoded:
                            encoded.append(json.dumps(now_).encode())
                        lines.append(line(told_as, encoded[0]))
                    told = version
                if bookmarks and current > told:
                    lines.append(line("BOOKMARK", json.dumps({
                        "kind": res.kind, "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(current)}}).encode()))
                told = max(told, current)
                if lines:
                    write(b"".join(lines))
        finally:
            with self._watch_changed:
                self.watches_open -= 1

    # -- bulk loading, for benchmarks ------------------------------------------------------------

    def load(self, objects: Any) -> int:
        """Store objects (dicts shaped as the API's, with kind) as they are: no validation,
        no controllers, no events; only uid, creationTimestamp and resourceVersion stamped.
        Watches from before the load answer 410. Loaded objects must then be changed by
        ``put_object`` with a new dict, never in place. Returns how many."""
        count = 0
        with self.lock:
            listener, self.store.listener = self.store.listener, None
            try:
                for obj in objects:
                    self.store.put(obj)
                    meta = obj["metadata"]
                    self._snapshots[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
                    count += 1
            finally:
                self.store.listener = listener
            for kind in self.store.objects:
                self._history_floor[kind] = int(self.store.resource_version)
                self._history[kind] = []
        return count

    def put_object(self, obj: dict) -> dict:
        """Create or replace an object as it is (no validation, no controllers); watches see
        it."""
        with self.lock:
            return self.store.put(obj)

    def set_status(self, kind: str, namespace: str | None, name: str, status: dict) -> dict:
        """Replace an object's status as its controller would (for kinds no controller here
        plays, as KubeRay's RayJob); watches see it."""
        with self.lock:
            obj = self.store.get(kind, namespace, name)
            if obj is None:
                raise KeyError(f"no {kind} {namespace}/{name}")
            obj = copy.deepcopy(obj)
            obj["status"] = copy.deepcopy(status)
            return copy.deepcopy(self.store.put(obj))

    def delete_object(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete one object alone (no garbage collection, no controllers)."""
        with self.lock:
            obj = self.store.get(kind, namespace, name)
            if obj is not None:
                self.store.remove(obj)

    # -- HTTP dispatch ---------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict, body: bytes) -> tuple[int, Any]:
        """Answer one request: (status code, the JSON body encoded, a str for plain text, or a
        ``WatchRequest`` for the handler to stream)."""
        split = urlsplit(target)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        auth = headers.get("authorization")
        with self._traffic_lock:
            self.traffic["requests"] += 1
        with self.lock:
            self.requests.append((method, path))
            self.request_details.append({"method": method, "path": path, "query": query,
                                         "authorization": auth,
                                         "content_type": headers.get("content-type"),
                                         "body": body.decode("utf-8", "replace")})
        try:
            if auth != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized")
            if failure := self._injected_failure(method, path):
                raise failure
            with self.lock:  # answer a copy, taken while nothing else changes
                code, payload = self._route(method, path, query, headers, body)
                if isinstance(payload, (str, WatchRequest)):
                    return code, payload
                return code, json.dumps(payload).encode()
        except ApiError as exc:
            return exc.code, json.dumps(exc.status()).encode()

    def _route(self, method: str, path: str, query: dict, headers: dict,
               body: bytes) -> tuple[int, Any]:
        if method == "GET" and path in ("/version", "/api", "/apis", "/api/v1"):
            return 200, self._discovery(path)
        if method == "GET" and (match := re.fullmatch(r"/apis/([^/]+)/([^/]+)", path)):
            return 200, self._resource_list(match.group(1), match.group(2))
        match = CORE_PATH.match(path) or GROUPED_PATH.match(path)
        if not match:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        parts = match.groupdict()
        group = parts.get("group") or ""
        version = parts.get("version") or "v1"
        res = next((r for r in RESOURCES if r.group == group and r.version == version
                    and r.plural == parts["plural"] and self._enabled(r)), None)
        if res is None:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        ns, name, sub = parts["ns"], parts["name"], parts["sub"]
        if ns is not None and not res.namespaced:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if query.get("watch") in ("true", "1"):
            if method != "GET" or name is not None or sub is not None:
                raise ApiError(405, "watch a collection with GET")
            return 200, self._watch_request(res, ns, query)
        if sub not in (None, "status", "log") or (sub == "log" and res.kind != "Pod"):
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if name is None:
            if method == "GET":
                return 200, self._list(res, ns, query)
            if method == "POST":
                return 201, self._create(res, ns, self._json(body), query)
            raise ApiError(405, f"{method} is not allowed on a collection")
        if res.namespaced and ns is None:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if sub == "log":
            if method != "GET":
                raise ApiError(405, "only GET reads logs")
            return 200, self._read_log(ns, name, query)
        if method == "GET":
            return 200, self._existing(res, ns, name)
        if method == "DELETE":
            return 200, self._delete(res, ns, name, body, query)
        if method == "PATCH":
            return 200, self._patch(res, ns, name, headers, body, query)
        if method == "PUT":
            return 200, self._replace(res, ns, name, self._json(body), query)
        raise ApiError(405, f"{method} is not allowed")

    def _enabled(self, res: Resource) -> bool:
        return res.feature is None or bool(getattr(self, res.feature))

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body or b"null")
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from exc

    # -- discovery -------------------------------------------------------------------------------

    def _discovery(self, path: str) -> dict:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0",
                    "gitCommit": "0" * 40, "gitTreeState": "clean",
                    "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
                    "compiler": "gc", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                    "serverAddress": f"127.0.0.1:{self.port}"}]}
        if path == "/api/v1":
            return self._resource_list("", "v1")
        groups = []
        for group, version in GROUPS.items():
            if group in GROUP_FEATURE and not getattr(self, GROUP_FEATURE[group]):
                continue
            entry = {"groupVersion": f"{group}/{version}", "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> dict:
        found = [r for r in RESOURCES if r.group == group and r.version == version
                 and self._enabled(r)]
        if not found:
            raise ApiError(404, "the server could not find the requested resource")
        verbs = ["create", "delete", "get", "list", "patch", "update"]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": found[0].api_version,
                "resources": [{"name": r.plural, "singularName": r.kind.lower(),
                               "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs}
                              for r in found]}

    # -- generic handlers ------------------------------------------------------------------------

    def _existing(self, res: Resource, ns: str | None, name: str) -> dict:
        obj = self.store.get(res.kind, ns, name)
        if obj is None:
            raise not_found(res, name)
        return obj

    def _list(self, res: Resource, ns: str | None, query: dict) -> dict:
        matching = (obj for obj in self.store.iter(res.kind, ns)
                    if label_selector_matches(query.get("labelSelector"),
                                              obj["metadata"].get("labels"))
                    and field_selector_matches(query.get("fieldSelector"), obj))
        meta: dict[str, Any] = {"resourceVersion": self.store.resource_version}
        if limit := int(query.get("limit") or 0):
            start = int(query.get("continue") or 0)
            # One past the page says whether there is more (a small page stays cheap).
            items = list(itertools.islice(matching, start + limit + 1))
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            items = items[start:start + limit]
        else:
            items = list(matching)
        if not res.custom:  # the real server drops kind/apiVersion from built-in list items
            items = [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
                     for obj in items]
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta,
                "items": items}

    def _validate(self, res: Resource, obj: Any, name_hint: str = "") -> None:
        if not isinstance(obj, dict):
            raise ApiError(400, "the body must be a JSON object")
        obj.setdefault("apiVersion", res.api_version)  # the real server takes them from the URL
        obj.setdefault("kind", res.kind)
        if obj.get("apiVersion") != res.api_version or obj.get("kind") != res.kind:
            raise ApiError(400, f"the body is {obj.get('apiVersion')}/{obj.get('kind')}, "
                           f"the URL wants {res.api_version}/{res.kind}")
        name = (obj.get("metadata") or {}).get("name") or name_hint
        try:
            check_object(obj)
        except SchemaError as exc:
            raise invalid(res, name, str(exc)) from exc
        check_names(res, obj)
        errors: list[str] = []
        if res.kind == "Namespace":
            errors = pod_security.label_errors((obj.get("metadata") or {}).get("labels"))
        elif res.kind == "NetworkPolicy":
            errors = network.policy_errors(obj)
        elif res.kind == "Secret":
            errors = _secret_errors(obj)
        if errors:
            raise invalid(res, name, "; ".join(errors))

    def _create(self, res: Resource, ns: str | None, obj: Any, query: dict) -> dict:
        if isinstance(obj, dict):
            meta = obj.setdefault("metadata", {}) or {}
            obj["metadata"] = meta
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + rand5()
            if not meta.get("name"):
                raise invalid(res, "", "name or generateName is required", "metadata.name")
        self._validate(res, obj, "")
        meta = obj["metadata"]
        name = meta["name"]
        for stamped in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(stamped, None)
        if res.namespaced:
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "the namespace of the body does not match the URL's")
            meta["namespace"] = ns
            if self.store.get("Namespace", None, ns or "") is None:
                raise not_found(BY_KIND["Namespace"], ns or "")
        if self.store.get(res.kind, ns, name) is not None:
            raise ApiError(409, f'{res.qualified} "{name}" already exists',
                           details={"name": name, "group": res.group, "kind": res.plural})
        if res.kind == "Pod" and (refused := self._pod_security(ns or "", name, obj["spec"])):
            raise ApiError(403, refused)
        self._default(res, obj)
        if query.get("dryRun"):
            return obj
        self.store.put(obj)
        self._after_create(obj)
        return obj

    def _replace(self, res: Resource, ns: str | None, name: str, obj: Any, query: dict) -> dict:
        old = self._existing(res, ns, name)
        self._validate(res, obj, name)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != name:
            raise ApiError(400, "the name of the body does not match the URL's")
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {res.qualified} "{name}": '
                           "the object has been modified; please apply your changes to the "
                           "latest version and try again", "Conflict")
        for kept in ("uid", "creationTimestamp", "namespace"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
        if res.kind == "NetworkPolicy":  # defaulted on every write, as on create
            network.default_policy(obj)
        if "status" in old and "status" not in obj:
            obj["status"] = old["status"]
        if query.get("dryRun"):
            return obj
        self.store.put(obj)
        self._after_update(old, obj)
        return obj

    def _patch(self, res: Resource, ns: str | None, name: str, headers: dict, body: bytes,
               query: dict) -> dict:
        old = self._existing(res, ns, name)
        kind = (headers.get("content-type") or "").split(";")[0].strip()
        patch = self._json(body)
        if kind == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "a JSON patch must be a list of operations")
            new = json_patch(old, patch)
        elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if kind.startswith("application/strategic") and res.custom:
                raise ApiError(415, "strategic merge patch is not supported for custom "
                               "resources; use a merge patch")
            if not isinstance(patch, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            new = merge_patch(old, patch)
        else:
            raise ApiError(415, f"the fake does not support patches of type {kind!r}")
        self._validate(res, new, name)
        meta = new["metadata"]
        for kept in ("uid", "creationTimestamp", "namespace", "name"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
        if res.kind == "NetworkPolicy":
            network.default_policy(new)
        if query.get("dryRun"):
            return new
        self.store.put(new)
        self._after_update(old, new)
        return new

    def _delete(self, res: Resource, ns: str | None, name: str, body: bytes,
                query: dict) -> dict:
        obj = self._existing(res, ns, name)
        options = self._json(body) if body else {}
        if options:
            try:
                check_object(options, "V1DeleteOptions")
            except SchemaError as exc:
                raise ApiError(400, f"bad DeleteOptions: {exc}") from exc
        policy = query.get("propagationPolicy") or (options or {}).get("propagationPolicy")
        if policy is None and (options or {}).get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        if policy not in (None, "Foreground", "Background", "Orphan"):
            raise ApiError(400, f"unknown propagationPolicy {policy!r}")
        if query.get("dryRun"):
            return obj
        obj["metadata"]["deletionTimestamp"] = now()
        if obj["kind"] == "Namespace":
            obj["status"] = {"phase": "Terminating"}
        self._remove(obj, policy)
        self._settle()
        return obj

    # -- object defaults and controllers ---------------------------------------------------------

    def _default(self, res: Resource, obj: dict) -> None:
        """What admission and defaulting add on create."""
        spec = obj.setdefault("spec", {}) if res.kind not in NO_SPEC else None
        if res.kind == "Secret":
            # stringData is write-only: the server keeps it as base64 data.
            data = obj.setdefault("data", {})
            for key, value in (obj.pop("stringData", None) or {}).items():
                data[key] = base64.b64encode(value.encode()).decode()
            obj.setdefault("type", "Opaque")
        elif res.kind == "NetworkPolicy":
            network.default_policy(obj)
        elif res.kind == "Namespace":
            labels = obj["metadata"].setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
            obj["status"] = {"phase": "Active"}
        elif res.kind == "Service":
            assert spec is not None
            spec.setdefault("type", "ClusterIP")
            if not spec.get("clusterIP"):
                spec["clusterIP"] = f"10.96.{next(self._ips) % 250}.{random.randint(2, 250)}"  # noqa: S311
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        elif res.kind == "Pod":
            assert spec is not None
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif res.kind == "Job":
            assert spec is not None
            if spec.get("completions") is None and spec.get("parallelism") is None:
                spec["completions"] = spec["parallelism"] = 1
            spec.setdefault("parallelism", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            if spec["completionMode"] == "Indexed" and spec.get("completions") is None:
                raise invalid(res, obj["metadata"]["name"], "Required value: when completion "
                              "mode is Indexed", "spec.completions")
            spec.setdefault("suspend", False)
            uid = obj["metadata"].setdefault("uid", str(uuid.uuid4()))
            extra = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                     "batch.kubernetes.io/job-name": obj["metadata"]["name"],
                     "job-name": obj["metadata"]["name"]}
            spec.setdefault("selector", {"matchLabels": {
                "batch.kubernetes.io/controller-uid": uid}})
            template_meta = spec["template"].setdefault("metadata", {})
            template_meta["labels"] = {**(template_meta.get("labels") or {}), **extra}
            obj["status"] = {}
        elif res.kind == "Deployment":
            assert spec is not None
            spec.setdefault("replicas", 1)
            obj["status"] = {}
        elif res.kind == "PodGroup":
            obj.setdefault("status", {"phase": "Pending"})

    def _after_create(self, obj: dict) -> None:
        self._settle()

    def _after_update(self, old: dict, new: dict) -> None:
        if new["kind"] == "Job" and new["spec"].get("suspend") and not old["spec"].get("suspend"):
            for pod in self._owned_pods(new):
                if pod["status"]["phase"] not in FINISHED:
                    self.store.remove(pod)
        self._settle()

    def _remove(self, obj: dict, policy: str | None) -> None:
        """Delete an object and, by the propagation policy, what it owns (garbage collector).
        Jobs orphan their pods by default (as the real batch/v1 API does); Deployments don't."""
        if policy is None:
            policy = "Orphan" if obj["kind"] == "Job" else "Background"
        self.store.remove(obj)
        if obj["kind"] == "Namespace":
            for kind in self.store.objects:
                for child in self.store.list(kind, obj["metadata"]["name"]):
                    if BY_KIND[kind].namespaced:
                        self.store.remove(child)
            return
        for pod in self._owned_pods(obj):
            if policy == "Orphan":
                pod["metadata"]["ownerReferences"] = [
                    ref for ref in pod["metadata"].get("ownerReferences", [])
                    if ref["uid"] != obj["metadata"]["uid"]]
                self.store.put(pod)
            else:
                self.store.remove(pod)
        if obj["kind"] == "Pod" and obj["status"]["phase"] not in FINISHED:
            owner = self._owner(obj)
            if owner is not None and owner["kind"] == "Job":  # a lost running pod fails
                self._count_pod(owner, obj, failed=True)

    def _owned_pods(self, owner: dict) -> list[dict]:
        uid = owner["metadata"]["uid"]
        return [pod for pod in self.store.list("Pod", owner["metadata"].get("namespace"))
                if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences",
                                                                            []))]

    def _owner(self, pod: dict) -> dict | None:
        for ref in pod["metadata"].get("ownerReferences", []):
            if ref.get("kind") in ("Job", "Deployment"):
                owner = self.store.get(ref["kind"], pod["metadata"]["namespace"], ref["name"])
                if owner is not None and owner["metadata"]["uid"] == ref["uid"]:
                    return owner
        return None

    def _make_pod(self, owner: dict, name: str, template: dict, index: int | None) -> dict:
        meta = template.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        spec = copy.deepcopy(template.get("spec") or {})
        if owner["kind"] == "Job" and index is not None:
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
            annotations["batch.kubernetes.io/job-completion-index"] = str(index)
            spec["hostname"] = f"{owner['metadata']['name']}-{index}"
        pod_meta: dict[str, Any] = {
            "name": name, "namespace": owner["metadata"]["namespace"], "labels": labels,
            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                 "name": owner["metadata"]["name"],
                                 "uid": owner["metadata"]["uid"], "controller": True,
                                 "blockOwnerDeletion": True}]}
        if annotations:
            pod_meta["annotations"] = annotations
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}
        # Named as the controller asks, by generateName (the random suffix is the server's).
        if refused := self._pod_security(pod_meta["namespace"], name[:-5], spec):
            self._event(owner, "Warning", "FailedCreate", f"Error creating: {refused}")
            return pod
        self._default(BY_KIND["Pod"], pod)
        self.store.put(pod)
        self._event(owner, "Normal", "SuccessfulCreate", f"Created pod: {name}")
        return pod

    def _reconcile_job(self, job: dict) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        status.setdefault("succeeded", 0)
        status.setdefault("failed", 0)
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in status.get("conditions", [])):
            return
        pods = self._owned_pods(job)
        active = [p for p in pods if p["status"]["phase"] not in FINISHED]
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        done = self._done_indexes.get(job["metadata"]["uid"], set())
        if status["failed"] > spec["backoffLimit"]:
            for pod in active:
                self.store.remove(pod)
            self._finish_job(job, "Failed", "BackoffLimitExceeded",
                             "Job has reached the specified backoff limit")
            return
        finished = (len(done) >= completions if indexed else
                    status["succeeded"] >= completions if completions is not None else
                    status["succeeded"] > 0 and not active)
        if finished:
            self._finish_job(job, "Complete", None, None)
            return
        if spec.get("suspend"):
            status["active"] = 0
            return
        status.setdefault("startTime", now())
        want = spec["parallelism"] - len(active)
        if indexed:
            busy = {p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index")
                    for p in active}
            free = [i for i in range(completions) if i not in done and str(i) not in busy]
            for index in free[:max(want, 0)]:
                name = f"{job['metadata']['name']}-{index}-{rand5()}"
                self._make_pod(job, name, spec["template"], index)
        else:
            if completions is not None:
                want = min(want, completions - status["succeeded"] - len(active))
            for _ in range(max(want, 0)):
                self._make_pod(job, f"{job['metadata']['name']}-{rand5()}", spec["template"],
                               None)

    def _finish_job(self, job: dict, kind: str, reason: str | None, message: str | None) -> None:
        status = job["status"]
        condition = {"type": kind, "status": "True", "lastProbeTime": now(),
                     "lastTransitionTime": now()}
        if reason:
            condition.update(reason=reason, message=message)
        status.setdefault("conditions", []).append(condition)
        self.store.put(job)
        if kind == "Complete":
            status["completionTime"] = now()
            self._event(job, "Normal", "Completed", "Job completed")
        else:
            self._event(job, "Warning", reason or kind, message or kind)

    def _count_pod(self, job: dict, pod: dict, failed: bool) -> None:
        """The Job controller sees a pod end (once per pod)."""
        status = job.setdefault("status", {})
        seen = self._counted.setdefault(job["metadata"]["uid"], set())
        if pod["metadata"]["uid"] in seen:
            return
        seen.add(pod["metadata"]["uid"])
        if failed:
            status["failed"] = status.get("failed", 0) + 1
        else:
            status["succeeded"] = status.get("succeeded", 0) + 1
            index = pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index")
            if index is not None:
                self._done_indexes.setdefault(job["metadata"]["uid"], set()).add(int(index))
        self.store.put(job)

    def _reconcile_deployment(self, deploy: dict) -> None:
        spec = deploy["spec"]
        pods = [p for p in self._owned_pods(deploy) if p["status"]["phase"] not in FINISHED]
        template_hash = format(zlib.crc32(json.dumps(spec.get("template"),
                                                     sort_keys=True).encode()), "x")
        for _ in range(spec.get("replicas", 1) - len(pods)):
            template = copy.deepcopy(spec["template"])
            template.setdefault("metadata", {}).setdefault("labels", {})[
                "pod-template-hash"] = template_hash
            self._make_pod(deploy, f"{deploy['metadata']['name']}-{template_hash}-{rand5()}",
                           template, None)
        for pod in pods[spec.get("replicas", 1):]:
            self.store.remove(pod)

    def _settle(self) -> None:
        """Run the controllers and the scheduler until nothing changes, then refresh statuses."""
        self._unschedulable = {}
        for _ in range(20):
            before = self.store.changes
            for job in self.store.list("Job"):
                self._reconcile_job(job)
            for deploy in self.store.list("Deployment"):
                self._reconcile_deployment(deploy)
            self._schedule()
            self._refresh_statuses()
            if self.store.changes == before:
                break
        for pod in self.store.list("Pod"):  # one FailedScheduling event a pass, as retried
            message = self._unschedulable.get(pod["metadata"]["uid"])
            if message and not pod["spec"].get("nodeName"):
                self._event(pod, "Warning", "FailedScheduling", message,
                            component="default-scheduler")

    def _refresh_statuses(self) -> None:
        """Owners' statuses follow their pods (stored, and so versioned, only when changed)."""
        for job in self.store.list("Job"):
            active = [p for p in self._owned_pods(job) if p["status"]["phase"] not in FINISHED]
            status = copy.deepcopy(job.get("status") or {})
            status.update(active=len(active), ready=sum(1 for p in active if _pod_ready(p)))
            done = self._done_indexes.get(job["metadata"]["uid"])
            if job["spec"].get("completionMode") == "Indexed" and done:
                status["completedIndexes"] = ",".join(map(str, sorted(done)))
            conditions = [c for c in status.get("conditions", []) if c["type"] != "Suspended"]
            if job["spec"].get("suspend"):
                conditions.append({"type": "Suspended", "status": "True",
                                   "reason": "JobSuspended", "message": "Job suspended"})
            if conditions:
                status["conditions"] = conditions
            self._set_status(job, status)
        for deploy in self.store.list("Deployment"):
            pods = [p for p in self._owned_pods(deploy) if p["status"]["phase"] not in FINISHED]
            ready = sum(1 for p in pods if _pod_ready(p))
            available = ready >= deploy["spec"].get("replicas", 1)
            self._set_status(deploy, {
                "replicas": len(pods), "updatedReplicas": len(pods), "readyReplicas": ready,
                "availableReplicas": ready, "observedGeneration": 1,
                "conditions": [{"type": "Available", "status": str(available),
                                "reason": "MinimumReplicasAvailable" if available
                                else "MinimumReplicasUnavailable"}]})
        for group in self.store.list("PodGroup"):
            ns, name = group["metadata"]["namespace"], group["metadata"]["name"]
            members = [p for p in self.store.list("Pod", ns)
                       if (p["metadata"].get("annotations") or {}).get(
                           "scheduling.k8s.io/group-name") == name]
            phases = [p["status"]["phase"] for p in members]
            running = phases.count("Running")
            minimum = (group.get("spec") or {}).get("minMember", 1)
            phase = ("Running" if running and running >= minimum
                     else "Inqueue" if members else "Pending")
            self._set_status(group, {"phase": phase, "running": running,
                                     "succeeded": phases.count("Succeeded"),
                                     "failed": phases.count("Failed")})

    def _set_status(self, obj: dict, status: dict) -> None:
        if obj.get("status") != status:
            obj["status"] = status
            self.store.put(obj)

    # -- the scheduler ---------------------------------------------------------------------------

    def _schedule(self) -> None:
        pending = [p for p in self.store.list("Pod")
                   if p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")]
        pending.sort(key=lambda p: self.store.created[p["metadata"]["uid"]])
        for pod in pending:
            self._schedule_one(pod)

    def _schedule_one(self, pod: dict) -> None:
        nodes = self.store.list("Node")
        reasons: dict[str, int] = {}
        fits = []
        for node in nodes:
            why = self._unfit(pod, node)
            if why:
                for reason in why:
                    reasons[reason] = reasons.get(reason, 0) + 1
            else:
                fits.append(node)
        if not fits:
            if nodes:
                detail = ", ".join(sorted(f"{count} {reason}" for reason, count in
                                          reasons.items()))
                message = f"0/{len(nodes)} nodes are available: {detail}."
            else:
                message = "no nodes available to schedule pods"
            self._unschedulable[pod["metadata"]["uid"]] = message
            old = (pod["status"].get("conditions") or [{}])[0].get("message")
            if old != message:
                pod["status"]["conditions"] = [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": message, "lastTransitionTime": now()}]
                self.store.put(pod)
            return
        siblings = {p["spec"].get("nodeName") for p in self._siblings(pod)}
        node = sorted(fits, key=lambda n: (n["metadata"]["name"] in siblings,
                                           n["metadata"]["name"]))[0]
        self._bind(pod, node)

    def _siblings(self, pod: dict) -> list[dict]:
        refs = {r["uid"] for r in pod["metadata"].get("ownerReferences", [])}
        if not refs:
            return []
        return [p for p in self.store.list("Pod", pod["metadata"]["namespace"])
                if p is not pod and p["status"]["phase"] not in FINISHED
                and refs & {r["uid"] for r in p["metadata"].get("ownerReferences", [])}]

    def _unfit(self, pod: dict, node: dict) -> list[str]:
        """Why a pod cannot go on a node (kube-scheduler's wording), or nothing."""
        spec, labels = pod["spec"], node["metadata"].get("labels") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in node["status"].get("conditions", []))
        if node["spec"].get("unschedulable"):
            return ["node(s) were unschedulable"]
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
                    spec.get("tolerations") or [], taint):
                return [f"node(s) had untolerated taint {{{taint['key']}: "
                        f"{taint.get('value', '')}}}"]
        if not ready:
            return ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
        if not _node_selected(spec, node["metadata"]["name"], labels):
            return ["node(s) didn't match Pod's node affinity/selector"]
        used: dict[str, Fraction] = {}
        for other in self.store.list("Pod"):
            if other["spec"].get("nodeName") == node["metadata"]["name"] and \
                    other["status"]["phase"] not in FINISHED:
                for key, amount in _pod_requests(other).items():
                    used[key] = used.get(key, Fraction(0)) + amount
        allocatable = node["status"].get("allocatable") or {}
        short = []
        for key, amount in sorted(_pod_requests(pod).items()):
            if amount and used.get(key, Fraction(0)) + amount > quantity(
                    allocatable.get(key, 0)):
                short.append(f"Insufficient {key}")
        return short

    def _bind(self, pod: dict, node: dict) -> None:
        name = node["metadata"]["name"]
        pod["spec"]["nodeName"] = name
        address = node["status"]["addresses"][0]["address"]
        pod["status"].update(
            hostIP=address, hostIPs=[{"ip": address}], startTime=now(),
            conditions=[{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}])
        pod["status"]["containerStatuses"] = [
            _container_status(c, {"waiting": {"reason": "ContainerCreating"}})
            for c in pod["spec"].get("containers", [])]
        self.store.put(pod)
        self._event(pod, "Normal", "Scheduled",
                    f"Successfully assigned {pod['metadata']['namespace']}/"
                    f"{pod['metadata']['name']} to {name}", component="default-scheduler")
        if self._pull_failure(pod):
            return
        if self.auto_run:
            self._run(pod)

    # -- the kubelet, as driven by the test ------------------------------------------------------

    def _pull_failure(self, pod: dict) -> bool:
        bad = [c for c in pod["spec"].get("containers", []) if c.get("image") in
               self.failing_images]
        if not bad or pod["status"]["phase"] != "Pending" or not pod["spec"].get("nodeName"):
            return bool(bad)
        statuses = []
        for container in pod["spec"].get("containers", []):
            if container in bad:
                state = {"waiting": {"reason": "ImagePullBackOff",
                                     "message": f'Back-off pulling image "{container["image"]}"'}}
            else:
                state = {"waiting": {"reason": "PodInitializing"}}
            statuses.append(_container_status(container, state))
        pod["status"]["containerStatuses"] = statuses
        self.store.put(pod)
        for container in bad:
            self._event(pod, "Warning", "Failed",
                        f'Failed to pull image "{container["image"]}": rpc error: code = '
                        "NotFound desc = failed to pull and unpack image: not found",
                        component="kubelet")
            self._event(pod, "Normal", "BackOff",
                        f'Back-off pulling image "{container["image"]}"', component="kubelet")
        return True

    def _run(self, pod: dict) -> None:
        if pod["status"]["phase"] != "Pending" or not pod["spec"].get("nodeName"):
            return
        if self._pull_failure(pod):
            return
        if why := self._config_error(pod):
            pod["status"]["containerStatuses"] = [
                _container_status(c, {"waiting": {"reason": "CreateContainerConfigError",
                                                  "message": why}})
                for c in pod["spec"].get("containers", [])]
            self.store.put(pod)
            self._event(pod, "Warning", "Failed", f"Error: {why}", component="kubelet")
            return
        started = now()
        pod["status"].update(
            phase="Running", podIP=f"10.244.{next(self._ips) % 250}.{random.randint(2, 250)}",  # noqa: S311
            conditions=[{"type": t, "status": "True", "lastTransitionTime": started}
                        for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                                  "ContainersReady", "PodScheduled")],
            containerStatuses=[_container_status(c, {"running": {"startedAt": started}},
                                                 ready=True)
                               for c in pod["spec"].get("containers", [])])
        pod["status"]["podIPs"] = [{"ip": pod["status"]["podIP"]}]
        self.store.put(pod)
        for container in pod["spec"].get("containers", []):
            self._event(pod, "Normal", "Started", f"Started container {container['name']}",
                        component="kubelet")

    def start_pods(self, label_selector: str | None = None, namespace: str | None = None) -> list[
            str]:
        """Bound Pending pods (matching the selector) go Running; returns their names. Pods whose
        image fails to pull stay Pending."""
        with self.lock:
            names = []
            for pod in self.store.list("Pod", namespace):
                if pod["status"]["phase"] == "Pending" and pod["spec"].get("nodeName") and \
                        label_selector_matches(label_selector, pod["metadata"].get("labels")):
                    self._run(pod)
                    if pod["status"]["phase"] == "Running":
                        names.append(pod["metadata"]["name"])
            self._settle()
            return names

    def finish_pod(self, name: str, exit_code: int = 0, reason: str | None = None,
                   message: str | None = None, container: str | None = None) -> None:
        """End a pod: every container terminated with ``exit_code`` (``container``, if given,
        with ``reason``, the rest ``Completed``/``Error`` by their code); phase Succeeded (0) or
        Failed. Pods under a Deployment (restartPolicy Always) would restart in reality; here
        they end and the Deployment makes a new one."""
        with self.lock:
            pod = self._pod(name)
            finished_at = now()
            statuses = []
            for c in pod["spec"].get("containers", []):
                own = container in (None, c["name"])
                code = exit_code if own else (0 if exit_code == 0 else 143)
                why = (reason if own and reason else "Completed" if code == 0 else "Error")
                term: dict[str, Any] = {"exitCode": code, "reason": why,
                                        "startedAt": pod["status"].get("startTime", finished_at),
                                        "finishedAt": finished_at}
                if own and message:
                    term["message"] = message
                statuses.append(_container_status(c, {"terminated": term}))
            phase = "Succeeded" if exit_code == 0 else "Failed"
            conditions = [{"type": t, "status": "False" if t in ("Ready", "ContainersReady")
                           else "True", "lastTransitionTime": finished_at}
                          for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
            if not pod["spec"].get("nodeName"):
                conditions = pod["status"].get("conditions", [])
            pod["status"].update(phase=phase, containerStatuses=statuses, conditions=conditions)
            self.store.put(pod)
            owner = self._owner(pod)
            if owner is not None and owner["kind"] == "Job":
                self._count_pod(owner, pod, failed=exit_code != 0)
            self._settle()

    def finish_pods(self, label_selector: str | None = None, exit_code: int = 0,
                    namespace: str | None = None, reason: str | None = None) -> list[str]:
        """``finish_pod`` every unfinished pod matching the selector; returns their names."""
        with self.lock:
            names = [p["metadata"]["name"] for p in self.store.list("Pod", namespace)
                     if p["status"]["phase"] not in FINISHED
                     and label_selector_matches(label_selector, p["metadata"].get("labels"))]
            for name in names:
                self.finish_pod(name, exit_code, reason)
            return names

    def oom(self, name: str, container: str | None = None) -> None:
        """The container (by default the first) is OOMKilled (exit 137); the pod fails."""
        with self.lock:
            pod = self._pod(name)
            target = container or pod["spec"]["containers"][0]["name"]
            self._event(pod, "Warning", "OOMKilling", f"Memory cgroup out of memory: Killed "
                        f"process in container {target}", component="kernel-monitor")
            self.finish_pod(name, 137, "OOMKilled", container=target)

    def crash_loop(self, name: str, exit_code: int = 1, container: str | None = None) -> None:
        """The container (by default the first) waits in CrashLoopBackOff after exiting with
        ``exit_code``; the pod stays Running but not ready."""
        with self.lock:
            pod = self._pod(name)
            target = container or pod["spec"]["containers"][0]["name"]
            statuses = pod["status"].get("containerStatuses") or [
                _container_status(c, {}) for c in pod["spec"]["containers"]]
            for status in statuses:
                if status["name"] == target:
                    status["lastState"] = {"terminated": {"exitCode": exit_code,
                                                          "reason": "Error",
                                                          "finishedAt": now()}}
                    status["state"] = {"waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off 5m0s restarting failed container={target} "
                                   f"pod={name}_{pod['metadata']['namespace']}"}}
                    status["ready"], status["started"] = False, False
                    status["restartCount"] += 1
            pod["status"]["containerStatuses"] = statuses
            pod["status"]["phase"] = "Running"
            for condition in pod["status"].get("conditions", []):
                if condition["type"] in ("Ready", "ContainersReady"):
                    condition["status"] = "False"
            self.store.put(pod)
            self._event(pod, "Warning", "BackOff", "Back-off restarting failed container "
                        f"{target} in pod {name}", component="kubelet")
            self._settle()

    def fail_image_pulls(self, image: str) -> None:
        """Pods using ``image`` stay Pending with ImagePullBackOff (also those already bound)."""
        with self.lock:
            self.failing_images.add(image)
            for pod in self.store.list("Pod"):
                self._pull_failure(pod)
            self._settle()

    def set_logs(self, name: str, text: str, container: str | None = None) -> None:
        """The log of a pod (of one container, or of every container when None)."""
        with self.lock:
            self.logs[(name, container or "")] = text

    def _read_log(self, ns: str | None, name: str, query: dict) -> str:
        pod = self._existing(BY_KIND["Pod"], ns, name)
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        container = query.get("container")
        if container is None:
            if len(containers) > 1:
                raise ApiError(400, f"a container name must be specified for pod {name}, "
                               f"choose one of: [{' '.join(containers)}]")
            container = containers[0] if containers else ""
        elif container not in containers:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        if pod["status"]["phase"] == "Pending" and not any(
                "running" in s["state"] or "terminated" in s["state"]
                for s in pod["status"].get("containerStatuses", [])):
            reason = "ContainerCreating"
            for status in pod["status"].get("containerStatuses", []):
                reason = status["state"].get("waiting", {}).get("reason", reason)
            raise ApiError(400, f'container "{container}" in pod "{name}" is waiting to '
                           f"start: {reason}")
        text = self.logs.get((name, container), self.logs.get((name, ""), ""))
        if query.get("tailLines") is not None:
            lines = text.splitlines(keepends=True)
            count = int(query["tailLines"])
            text = "".join(lines[-count:]) if count else ""
        return text

    # -- admission, secrets and the network ------------------------------------------------------

    def _pod_security(self, namespace: str, name: str, spec: dict) -> str | None:
        """Pod Security Admission: why the namespace's enforced level refuses the pod, if it
        does."""
        ns = self.store.get("Namespace", None, namespace)
        labels = (ns or {}).get("metadata", {}).get("labels") or {}
        level = pod_security.enforced_level(labels)
        broken = pod_security.violations(spec, level)
        if not broken:
            return None
        version = labels.get(f"{pod_security.PREFIX}enforce-version", "latest")
        return (f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": '
                + ", ".join(broken))

    def _secret_value(self, namespace: str, ref: dict) -> tuple[str | None, str]:
        """A secretKeyRef's value, or None and the kubelet's words for why not."""
        secret = self.store.get("Secret", namespace, ref.get("name", ""))
        if secret is None:
            return None, f'secret "{ref.get("name")}" not found'
        data = secret.get("data") or {}
        if ref.get("key") not in data:
            return None, (f"couldn't find key {ref.get('key')} in Secret "
                          f"{namespace}/{ref.get('name')}")
        return base64.b64decode(data[ref["key"]]).decode(), ""

    def _config_error(self, pod: dict) -> str:
        """Why the kubelet cannot make the pod's containers (a missing Secret or key), or ""."""
        for container in pod["spec"].get("containers", []):
            for item in container.get("env") or []:
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    value, why = self._secret_value(pod["metadata"]["namespace"], ref)
                    if value is None:
                        return why
        return ""

    def container_env(self, pod_name: str, container: str | None = None) -> dict[str, str]:
        """The environment a container of the pod gets, references resolved as the kubelet
        resolves them (Secrets, the pod's own fields)."""
        with self.lock:
            pod = self._pod(pod_name)
            spec = next(c for c in pod["spec"]["containers"]
                        if container in (None, c["name"]))
            env: dict[str, str] = {}
            for item in spec.get("env") or []:
                source = item.get("valueFrom") or {}
                if "secretKeyRef" in source:
                    value, _ = self._secret_value(pod["metadata"]["namespace"],
                                                  source["secretKeyRef"])
                    if value is not None:
                        env[item["name"]] = value
                elif "fieldRef" in source:
                    path = source["fieldRef"]["fieldPath"]
                    if match := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
                        env[item["name"]] = (pod["metadata"].get(match.group(1)) or {}).get(
                            match.group(2), "")
                    else:
                        env[item["name"]] = str(dig(pod, path) or "")
                else:
                    env[item["name"]] = item.get("value", "")
            return env

    def add_pod(self, namespace: str, name: str, labels: dict | None = None,
                ports: tuple[int, ...] = ()) -> dict:
        """A running pod made by something other than OGAI (the platform's own, CoreDNS), as
        if created through the API: Pod Security applies."""
        with self.lock:
            container: dict[str, Any] = {"name": "main", "image": "other:1"}
            if ports:
                container["ports"] = [{"containerPort": port, "protocol": "TCP"}
                                      for port in ports]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "labels": dict(labels or {})},
                   "spec": {"nodeName": "elsewhere", "containers": [container]}}
            self._create(BY_KIND["Pod"], namespace, pod, {})
            stored = self.store.get("Pod", namespace, name)
            assert stored is not None
            self._run(stored)
            return copy.deepcopy(stored)

    def can_connect(self, source: dict | str, target: dict | str, port: int,
                    protocol: str = "TCP") -> bool:
        """Whether the NetworkPolicies let ``source`` open a connection to ``target`` on
        ``port``: each a pod (as ``pods()`` or ``objects("Pod")`` return it; its current state
        is used) or an IP address outside the cluster."""
        with self.lock:
            ends = []
            for end in (source, target):
                if isinstance(end, str):
                    ends.append(network.Endpoint(ip=end))
                    continue
                meta = end["metadata"]
                pod = self.store.get("Pod", meta["namespace"], meta["name"])
                if pod is None:
                    raise KeyError(f"no pod {meta['namespace']}/{meta['name']}")
                ns = self.store.get("Namespace", None, meta["namespace"]) or {}
                ends.append(network.Endpoint(pod=pod, namespace_labels=ns.get(
                    "metadata", {}).get("labels")))
            return network.can_connect(self.store.list("NetworkPolicy"), ends[0], ends[1],
                                       port, protocol)

    # -- nodes -----------------------------------------------------------------------------------

    def add_node(self, name: str, gpus: int = 8, gpu_product: str = "NVIDIA-H100-80GB-HBM3",
                 gpu_memory_mib: int = 81559, cpu: str = "64", memory: str = "512Gi",
                 ready: bool = True, unschedulable: bool = False,
                 taints: list[dict] | None = None, labels: dict | None = None,
                 extended: dict[str, str] | None = None) -> dict:
        """A node with GPU feature discovery labels and ``nvidia.com/gpu`` capacity, and the
        ``extended`` resources a device plugin would advertise (``{"rdma/hca": "4"}``)."""
        with self.lock:
            node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64"}
            capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
            if gpus:
                node_labels.update({"nvidia.com/gpu.product": gpu_product,
                                    "nvidia.com/gpu.memory": str(gpu_memory_mib),
                                    "nvidia.com/gpu.count": str(gpus),
                                    "nvidia.com/gpu.present": "true"})
                capacity["nvidia.com/gpu"] = str(gpus)
            capacity.update(extended or {})
            node_labels.update(labels or {})
            index = len(self.store.objects["Node"]) + 1
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": node_labels},
                    "spec": {"podCIDR": f"10.244.{index}.0/24"},
                    "status": {
                        "capacity": capacity, "allocatable": dict(capacity),
                        "conditions": [],
                        "addresses": [{"type": "InternalIP", "address": f"192.168.0.{index}"},
                                      {"type": "Hostname", "address": name}],
                        "nodeInfo": {
                            "architecture": "amd64", "bootID": str(uuid.uuid4()),
                            "containerRuntimeVersion": "containerd://1.7.20",
                            "kernelVersion": "6.8.0-45-generic", "kubeProxyVersion": "v1.31.0",
                            "kubeletVersion": "v1.31.0", "machineID": uuid.uuid4().hex,
                            "operatingSystem": "linux", "osImage": "Ubuntu 24.04.1 LTS",
                            "systemUUID": str(uuid.uuid4())}}}
            if unschedulable:
                node["spec"]["unschedulable"] = True
            if taints:
                node["spec"]["taints"] = list(taints)
            self._set_ready(node, ready)
            check_object(node)
            self.store.put(node)
            self._settle()
            return copy.deepcopy(node)

    def provision(self, namespace: str, name: str, *, nodes: list[str] | None = None,
                  failed: str = "") -> None:
        """Play cluster-autoscaler on a ProvisioningRequest: add `nodes` (as `add_node` does)
        and set Provisioned=True, or with `failed` set Failed=True with that message."""
        for node in nodes or []:
            self.add_node(node)
        with self.lock:
            found = self._find("ProvisioningRequest", name, namespace)
            if found is None:
                raise KeyError(f"no ProvisioningRequest {namespace}/{name}")
            kind, reason = ("Failed", "ProvisioningFailed") if failed else \
                ("Provisioned", "Provisioned")
            found.setdefault("status", {})["conditions"] = [{
                "type": kind, "status": "True", "reason": reason,
                "message": failed or "capacity is provisioned", "lastTransitionTime": now()}]
            self.store.put(found)

    def add_namespace(self, name: str, labels: dict | None = None) -> dict:
        """A namespace, as if created through the API."""
        with self.lock:
            obj = {"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name,
                                                         **(labels or {})}}}
            return copy.deepcopy(self._create(BY_KIND["Namespace"], None, obj, {}))

    def _set_ready(self, node: dict, ready: bool) -> None:
        node["status"]["conditions"] = [{
            "type": "Ready", "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else
            "container runtime network not ready", "lastHeartbeatTime": now(),
            "lastTransitionTime": now()}]
        taints = [t for t in node["spec"].get("taints") or []
                  if t["key"] != "node.kubernetes.io/not-ready"]
        if not ready:
            taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
        if taints:
            node["spec"]["taints"] = taints
        else:
            node["spec"].pop("taints", None)

    def set_node_ready(self, name: str, ready: bool = True) -> None:
        """Flip a node's Ready condition (NotReady adds the not-ready NoSchedule taint, and its
        pods lose their Ready condition; they are not evicted)."""
        with self.lock:
            node = self._find("Node", name)
            if node is None:
                raise KeyError(f"no node {name}")
            self._set_ready(node, ready)
            self.store.put(node)
            for pod in self.store.list("Pod"):
                if pod["spec"].get("nodeName") == name and pod["status"]["phase"] == "Running":
                    for condition in pod["status"].get("conditions", []):
                        if condition["type"] in ("Ready", "ContainersReady"):
                            condition["status"] = "True" if ready else "False"
                    for status in pod["status"].get("containerStatuses", []):
                        status["ready"] = ready and "running" in status["state"]
                    self.store.put(pod)
            self._settle()

    # -- events ----------------------------------------------------------------------------------

    def _event(self, obj: dict, type_: str, reason: str, message: str,
               component: str | None = None) -> None:
        """Record a core v1 Event about ``obj``; the same one again bumps its count."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        if self.store.get("Namespace", None, ns) is None:
            return
        for event in self.store.list("Event", ns):
            inv = event["involvedObject"]
            if (inv.get("uid") == meta.get("uid") and event["reason"] == reason
                    and event["message"] == message):
                event["count"] += 1
                event["lastTimestamp"] = now()
                self.store.put(event)
                return
        component = component or {"Job": "job-controller",
                                   "Deployment": "deployment-controller"}.get(obj["kind"],
                                                                              "fakekube")
        stamp = now()
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}",
                              "namespace": ns},
                 "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                    "name": meta["name"], "namespace": ns,
                                    "uid": meta.get("uid"),
                                    "resourceVersion": meta.get("resourceVersion")},
                 "reason": reason, "message": message, "type": type_, "count": 1,
                 "firstTimestamp": stamp, "lastTimestamp": stamp,
                 "source": {"component": component}, "reportingComponent": component,
                 "reportingInstance": ""}
        self.store.put(event)


# --------------------------------------------------------------------------------------------
# Pod helpers
# --------------------------------------------------------------------------------------------


_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def _secret_errors(secret: dict) -> list[str]:
    errors = []
    for field in ("data", "stringData"):
        for key, value in (secret.get(field) or {}).items():
            if not _SECRET_KEY.match(key) or len(key) > 253:
                errors.append(f"{field}[{key}]: Invalid value: a valid config key must "
                              "consist of alphanumeric characters, '-', '_' or '.'")
            if field == "data":
                try:
                    base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    errors.append(f"data[{key}]: Invalid value: not base64")
    return errors


def _container_status(container: dict, state: dict, ready: bool = False) -> dict:
    return {"name": container["name"], "image": container.get("image", ""),
            "imageID": "", "ready": ready, "started": "running" in state,
            "restartCount": 0, "state": state}


def _pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


def _pod_requests(pod: dict) -> dict[str, Fraction]:
    """What a pod asks for: per container, its requests, else its limits; summed."""
    total: dict[str, Fraction] = {}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, value in wanted.items():
            total[key] = total.get(key, Fraction(0)) + quantity(value)
    return total


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint["key"]:
                return True
        elif toleration.get("key") == taint["key"] and \
                toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_matches(expression: dict, values: dict) -> bool:
    key, op = expression["key"], expression["operator"]
    wanted = expression.get("values") or []
    present, value = key in values, values.get(key)
    if op == "In":
        return present and value in wanted
    if op == "NotIn":
        return not present or value not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and wanted:
        try:
            return (int(value) > int(wanted[0])) if op == "Gt" else (int(value) < int(wanted[0]))
        except ValueError:
            return False
    return False


def _node_selected(spec: dict, node_name: str, labels: dict) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = dig(spec, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
               and all(_expression_matches(e, {"metadata.name": node_name})
                       for e in term.get("matchFields") or [])
               for term in terms)


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server_fake: FakeKube

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            code, payload = self.server_fake.handle(self.command, self.path, headers, body)
        except Exception as exc:  # a bug in the fake: answer 500 rather than hang the client
            code, payload = 500, ApiError(500, f"fakekube: {type(exc).__name__}: {exc}").status()
        if isinstance(payload, WatchRequest):
            self._stream(payload)
            return
        if isinstance(payload, str):
            data, kind = payload.encode(), "text/plain; charset=utf-8"
        elif isinstance(payload, bytes):
            data, kind = payload, "application/json"
        else:
            data, kind = json.dumps(payload).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.server_fake._count(len(data), watch=False)

    def _stream(self, watch: WatchRequest) -> None:
        """A watch: HTTP/1.1 chunked, one chunk a batch of events (urllib3, and so the
        client's own watch reader, hands a chunked body over chunk by chunk; a close-delimited
        HTTP/1.0 body it would read to its end first)."""
        self.protocol_version = "HTTP/1.1"
        self._watching = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()

        def write(data: bytes) -> None:
            frame = b"%x\r\n%s\r\n" % (len(data), data)
            self.wfile.write(frame)
            self.server_fake._count(len(frame), watch=True)

        def gone() -> bool:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        try:
            if self.server_fake.serve_watch(watch, write, gone):
                write(b"")  # the last chunk: the body ends cleanly
            else:  # dropped: cut the connection under the client
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client went away
            pass
        self.close_connection = True

    def flush_headers(self) -> None:
        buffered = getattr(self, "_headers_buffer", None)
        if buffered:
            self.server_fake._count(sum(map(len, buffered)),
                                    watch=getattr(self, "_watching", False))
        super().flush_headers()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass
