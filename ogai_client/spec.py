"""Job specs as people write them: YAML or JSON, with memory in Kubernetes units.

`resources.memory: 16Gi` becomes `resources.memory_mib: 16384` (and so do `ray.head.memory`
and `ray.worker.memory`); every other field goes to the API unchanged, which validates it and
names the field at fault. A `kind: ray` spec's `ray` block is checked here first, so that a
typo in it reads as one line naming the field before anything is shipped.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import yaml

# The fields of POST /api/v1/aistation/jobs/; anything else the API would silently drop.
# `workdir` is a folder in a spec file; the CLI and the SDK ship it and send its id instead.
KNOWN_FIELDS = frozenset({
    "tenant", "queue", "name", "command", "env", "image", "resources", "replicas", "priority",
    "max_restarts", "time_limit_s", "workdir", "environment", "network", "kind", "ray",
})
KINDS = ("job", "ray")
# `ray: {workers: N, worker: {...}, head: {...}, dashboard: bool}` (a job of kind ray).
KNOWN_RAY = frozenset({"workers", "worker", "head", "dashboard"})
KNOWN_RAY_NODE = frozenset({"gpus", "gpu_model", "cpu", "memory_mib", "memory"})
KNOWN_RESOURCES = frozenset({"gpus", "gpu_model", "cpu", "memory_mib", "memory"})
# `network: {attachments: [name, …], rdma: N}`: the cluster's extra networks and RDMA devices.
KNOWN_NETWORK = frozenset({"attachments", "rdma"})

MIB = 1024 * 1024
_UNITS = {
    "Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB, "Ti": 1024 * 1024 * MIB,
    "k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]{0,2})\s*$")


class SpecError(ValueError):
    """The spec cannot be read or converted; the message names the field."""


def parse_memory(value: Any, *, field: str = "resources.memory") -> int:
    """MiB from a quantity such as "16Gi", "512Mi", "1.5Gi" or "2G" (rounded up to whole MiB)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"{field}: give a quantity such as \"16Gi\" or \"512Mi\"")
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in _UNITS:
        raise SpecError(f"{field}: {value!r} is not a quantity; write it like \"16Gi\" or "
                        "\"512Mi\" (units Ki, Mi, Gi, Ti, or K, M, G, T)")
    mib = math.ceil(float(match.group(1)) * _UNITS[match.group(2)] / MIB)
    if mib < 1:
        raise SpecError(f"{field}: {value!r} is less than 1 MiB")
    return mib


def _with_memory_mib(node: dict, field: str) -> dict:
    """`node` with its `memory` quantity converted to `memory_mib`."""
    if "memory" not in node:
        return node
    node = dict(node)
    if "memory_mib" in node:
        raise SpecError(f"{field}: give memory or memory_mib, not both")
    node["memory_mib"] = parse_memory(node.pop("memory"), field=f"{field}.memory")
    return node


def _normalize_ray(spec: dict) -> None:
    """Check a spec's `kind` and `ray` block (each error one line naming the field)."""
    kind = spec.get("kind", "job")
    if kind not in KINDS:
        raise SpecError(f"kind: {kind!r} is not a kind of job; use {' or '.join(KINDS)}")
    if "ray" not in spec:
        return
    if kind != "ray":
        raise SpecError("ray: only a job of kind: ray takes a Ray cluster; add kind: ray")
    ray = spec["ray"]
    if ray is None:
        ray = {}
    if not isinstance(ray, dict):
        raise SpecError("ray: give a mapping (workers, worker, head, dashboard)")
    ray = dict(ray)
    unknown = sorted(str(name) for name in set(ray) - KNOWN_RAY)
    if unknown:
        raise SpecError(f"ray.{unknown[0]}: unknown field; use "
                        f"{', '.join(sorted(KNOWN_RAY))}")
    workers = ray.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise SpecError(f"ray.workers: {workers!r} is not a number of worker nodes (0 or more)")
    if not isinstance(ray.get("dashboard", False), bool):
        raise SpecError("ray.dashboard: give true or false")
    for name in ("worker", "head"):
        if name not in ray or ray[name] is None:
            ray.pop(name, None)
            continue
        node = ray[name]
        if not isinstance(node, dict):
            raise SpecError(f"ray.{name}: give a mapping (gpus, gpu_model, cpu, memory)")
        unknown = sorted(str(field) for field in set(node) - KNOWN_RAY_NODE)
        if unknown:
            raise SpecError(f"ray.{name}.{unknown[0]}: unknown field; use gpus, gpu_model, "
                            "cpu, memory (\"16Gi\") or memory_mib")
        ray[name] = _with_memory_mib(node, f"ray.{name}")
    spec["ray"] = ray


def normalize_spec(spec: dict, *, job: bool = False) -> dict:
    """A copy of `spec` with `resources.memory` converted to `resources.memory_mib`; for a
    `job` spec also the `memory` of a Ray job's head and workers, its `kind` and `ray` block
    checked (pipeline and training specs have kinds of their own)."""
    if not isinstance(spec, dict):
        raise SpecError("the spec must be a mapping of fields (name, command, resources, …)")
    spec = dict(spec)
    resources = spec.get("resources")
    if isinstance(resources, dict) and "memory" in resources:
        resources = _with_memory_mib(resources, "resources")
        spec["resources"] = resources
    if job:
        _normalize_ray(spec)
    return spec


def parse_spec(text: str, *, source: str = "spec") -> dict:
    """A job spec from YAML or JSON text."""
    return normalize_spec(load_mapping(text, source=source, what="job",
                                       hint="name, command, resources, …"), job=True)


def load_mapping(text: str, *, source: str, what: str, hint: str) -> dict:
    """A mapping of fields from YAML or JSON text (JSON is YAML, but its errors read better as
    JSON); `what` and `hint` name the kind of spec and its fields in the errors."""
    stripped = text.lstrip()
    try:
        data = json.loads(text) if stripped.startswith("{") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{source}: not valid JSON: {exc.msg} (line {exc.lineno}, "
                        f"column {exc.colno})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot parse"
        raise SpecError(f"{source}: not valid YAML: {problem}{where}") from None
    if data is None:
        raise SpecError(f"{source} is empty; write a {what} spec ({hint})")
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a {what} spec must be a mapping of fields ({hint}), not "
                        f"a {type(data).__name__}")
    return data


def workdir_target(spec: dict, *, spec_dir: str | os.PathLike | None = None,
                   override: str | os.PathLike | int | bool | None = None
                   ) -> str | int | None:
    """What a job ships as its working folder, taking `workdir` out of `spec`: a folder (its
    absolute path), the id of a working folder already on the platform, or None for nothing.

    `override` (the CLI's `--workdir`/`--no-workdir`, the SDK's `workdir=`) wins: False ships
    nothing, a path is taken as given (relative to the current folder). Otherwise the spec's
    `workdir:` (relative to `spec_dir`, the spec file's folder; `null` or `false` ship nothing;
    a number is an id); without one, `spec_dir` itself when the spec came from a file."""
    value = spec.pop("workdir", None) if "workdir" in spec else spec_dir
    base = spec_dir
    if override is not None:
        value, base = override, None
    if value is None or value is False:
        return None
    if value is True:
        raise SpecError("workdir: give a folder (relative to the spec's folder), or false to "
                        "ship nothing")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(f"workdir: {value} is not the id of a working folder")
        return value
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise SpecError("workdir: give a folder (relative to the spec's folder), or false to "
                        "ship nothing")
    folder = os.path.expanduser(os.fspath(value))
    if base is not None:
        folder = os.path.join(base, folder)
    return os.path.abspath(folder)
