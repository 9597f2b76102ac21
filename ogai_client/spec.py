"""Job specs as people write them: YAML or JSON, with memory in Kubernetes units.

`resources.memory: 16Gi` becomes `resources.memory_mib: 16384`; every other field goes to the
API unchanged, which validates it and names the field at fault.
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
    "max_restarts", "time_limit_s", "workdir", "environment", "network",
})
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


def normalize_spec(spec: dict) -> dict:
    """A copy of `spec` with `resources.memory` converted to `resources.memory_mib`."""
    if not isinstance(spec, dict):
        raise SpecError("the spec must be a mapping of fields (name, command, resources, …)")
    spec = dict(spec)
    resources = spec.get("resources")
    if isinstance(resources, dict) and "memory" in resources:
        resources = dict(resources)
        if "memory_mib" in resources:
            raise SpecError("resources: give memory or memory_mib, not both")
        resources["memory_mib"] = parse_memory(resources.pop("memory"))
        spec["resources"] = resources
    return spec


def parse_spec(text: str, *, source: str = "spec") -> dict:
    """A job spec from YAML or JSON text."""
    return normalize_spec(load_mapping(text, source=source, what="job",
                                       hint="name, command, resources, …"))


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
