"""Checking a Kubernetes object, written as plain data, against the official client's OpenAPI
models: every field known (the API server would drop an unknown one silently, or refuse it), every
required field present, every value of its type. Kinds the client has no model for (Volcano's
PodGroup, the Prometheus Operator's and CloudNativePG's resources) are checked for their common
shape only."""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict[(\[]([^,]*), (.+)[)\]]$")  # dict(str, V1X) or dict[str, V1X]
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
    "datetime": (str,),
    "date": (str,),
}


class SchemaError(ValueError):
    """An object does not match its model; the message names the path and what is wrong."""


# apiVersion/kind -> the client's model class name, for the kinds OGAI writes and reads.
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "Service"): "V1Service",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Pod"): "V1Pod",
    ("v1", "Node"): "V1Node",
    ("v1", "Event"): "CoreV1Event",
    ("batch/v1", "Job"): "V1Job",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("v1", "DeleteOptions"): "V1DeleteOptions",
    # The platform's own manifests (platform/kubernetes/), applied to the fake API server.
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("networking.k8s.io/v1", "Ingress"): "V1Ingress",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}


def model_for(obj: dict) -> str | None:
    return MODELS.get((obj.get("apiVersion", ""), obj.get("kind", "")))


def check_object(obj: Any, model: str | None = None) -> None:
    """Raise SchemaError unless `obj` is a valid object of `model` (by default, the model its
    apiVersion and kind name). Custom resources without a model need apiVersion, kind and a
    metadata with a name."""
    if not isinstance(obj, dict):
        raise SchemaError("an object must be a mapping")
    model = model or model_for(obj)
    if model is None:
        for key in ("apiVersion", "kind"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise SchemaError(f"{key}: required")
        _check(obj.get("metadata"), "V1ObjectMeta", "metadata")
        if not (obj.get("metadata") or {}).get("name"):
            raise SchemaError("metadata.name: required")
        return
    _check(obj, model, "")
    try:  # the models' own setters refuse a missing required field
        client.ApiClient()._ApiClient__deserialize(obj, model)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise SchemaError(f"{model}: {exc}") from exc


def _check(value: Any, kind: str, path: str) -> None:
    if value is None:
        return
    where = path or "(object)"
    if kind in _PRIMITIVES:
        expected = _PRIMITIVES[kind]
        if kind in ("int", "float") and isinstance(value, bool):
            raise SchemaError(f"{where}: expected {kind}, got a boolean")
        if not isinstance(value, expected):
            raise SchemaError(f"{where}: expected {kind}, got {type(value).__name__}")
        return
    if match := _LIST.match(kind):
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list")
        for index, item in enumerate(value):
            _check(item, match.group(1), f"{path}[{index}]")
        return
    if match := _DICT.match(kind):
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected a mapping")
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(f"{where}: keys must be strings")
            _check(item, match.group(2), f"{path}.{key}" if path else key)
        return
    cls = getattr(client, kind, None)
    if cls is None:
        raise SchemaError(f"{where}: no model {kind}")
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object ({kind})")
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    for key, item in value.items():
        attr = by_key.get(key)
        if attr is None:
            raise SchemaError(f"{path + '.' if path else ''}{key}: unknown field of {kind}")
        _check(item, cls.openapi_types[attr], f"{path}.{key}" if path else key)
