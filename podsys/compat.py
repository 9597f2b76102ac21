"""The compatibility matrix a stack profile is checked against.

The matrix is data (`compat_matrix.yaml`, next to this module); this module reads it and says,
field by field, what in a profile breaks it: a driver too old for the CUDA version, a cuDNN with
no build for that CUDA major, an OFED that does not ship for the OS, and versions it does not know.
"""

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

MATRIX_PATH = Path(__file__).with_name("compat_matrix.yaml")

_DRIVER_RE = re.compile(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")
_SERIES_RE = re.compile(r"^(\d+)\.(\d+)(\.\d+){0,2}$")
_OFED_RE = re.compile(r"^(\d{2}\.\d{2})-\d+\.\d+\.\d+(\.\d+)?$")
_MIRROR_RE = re.compile(r"^(/|file:///|https?://)\S+$")


@cache
def matrix() -> dict[str, Any]:
    with MATRIX_PATH.open() as handle:
        return yaml.safe_load(handle)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def series(version: str) -> str:
    """`12.4.1` -> `12.4`: the release series the matrix is keyed by."""
    return ".".join(version.split(".")[:2])


def driver_branch(version: str) -> int:
    return int(version.split(".")[0])


def driver_cuda_major(driver_version: str) -> int:
    """The newest CUDA major a driver runs (R580+: 13, R525+: 12, older: 11), which picks the
    build of DCGM 4 and of the container toolkit's CUDA checks."""
    branch = driver_branch(driver_version)
    return 13 if branch >= 580 else 12 if branch >= 525 else 11


def _known(values, label: str, version: str) -> str:
    listed = ", ".join(str(value) for value in values)
    return f"Unknown {label} version {version}; OGAI knows {listed}."


def _check_driver(profile, found: dict[str, str]) -> None:
    version = profile.driver_version or ""
    if not _DRIVER_RE.match(version):
        found["driver_version"] = (f"{version!r} is not an NVIDIA driver version; give it as "
                                   "branch.minor.patch, e.g. 550.127.05.")
        return
    branches = matrix()["driver_branches"]
    if driver_branch(version) not in branches:
        found["driver_version"] = (f"Unknown driver branch R{driver_branch(version)} "
                                   f"({version}); OGAI deploys R{', R'.join(map(str, branches))}.")


def _check_cuda(profile, found: dict[str, str]) -> None:
    cuda = profile.cuda_version or ""
    table = matrix()["cuda"]
    if not _SERIES_RE.match(cuda) or series(cuda) not in table:
        found["cuda_version"] = _known(table, "CUDA", cuda or "(empty)")
        return
    entry = table[series(cuda)]
    if "driver_version" not in found and (
            version_tuple(profile.driver_version) < version_tuple(entry["min_driver"])):
        found["driver_version"] = (f"Driver {profile.driver_version} is too old for CUDA "
                                   f"{cuda}: CUDA {series(cuda)} needs driver "
                                   f"{entry['min_driver']} or newer.")
    if profile.os_family in matrix()["os_families"] and profile.os_family not in entry["os"]:
        found["cuda_version"] = (f"CUDA {cuda} has no packages for {profile.os_family}; it "
                                 f"ships for {', '.join(entry['os'])}.")


def _check_cuda_library(profile, found: dict[str, str], field: str, label: str) -> None:
    version = getattr(profile, field) or ""
    if not version:
        return
    table = matrix()[field.removesuffix("_version")]
    if not _SERIES_RE.match(version) or series(version) not in table:
        found[field] = _known(table, label, version)
        return
    if "cuda_version" in found:
        return
    cuda_major = version_tuple(profile.cuda_version)[0]
    majors = table[series(version)]["cuda_majors"]
    if cuda_major not in majors:
        builds = ", ".join(f"CUDA {major}" for major in majors)
        found[field] = (f"{label} {version} has no build for CUDA {profile.cuda_version} "
                        f"(CUDA {cuda_major}); it is built for {builds}.")


def _check_dcgm(profile, found: dict[str, str]) -> None:
    version = profile.dcgm_version or ""
    if not version:
        return
    table = matrix()["dcgm"]
    if not _SERIES_RE.match(version) or series(version) not in table:
        found["dcgm_version"] = _known(table, "DCGM", version)
        return
    if "driver_version" in found:
        return
    entry = table[series(version)]
    driver = profile.driver_version
    if version_tuple(driver) < version_tuple(entry["min_driver"]):
        found["dcgm_version"] = (f"DCGM {version} needs driver {entry['min_driver']} or newer, "
                                 f"not {driver}.")
    elif "max_branch" in entry and driver_branch(driver) > entry["max_branch"]:
        found["dcgm_version"] = (f"DCGM {version} has no build for driver {driver} (CUDA "
                                 f"{driver_cuda_major(driver)}); it supports up to the "
                                 f"R{entry['max_branch']} branch: use a newer DCGM.")


def _check_ofed(profile, found: dict[str, str]) -> None:
    version = profile.ofed_version or ""
    if not version:
        return
    table = matrix()["ofed"]
    matched = _OFED_RE.match(version)
    if not matched or matched.group(1) not in table:
        found["ofed_version"] = (f"Unknown OFED version {version}; give a full release like "
                                 f"24.10-1.1.4.0 of a series OGAI knows: {', '.join(table)}.")
        return
    entry = table[matched.group(1)]
    if profile.os_family in matrix()["os_families"] and profile.os_family not in entry["os"]:
        found["ofed_version"] = (f"OFED {version} does not ship for {profile.os_family}; it "
                                 f"ships for {', '.join(entry['os'])}.")


def _check_toolkit(profile, found: dict[str, str]) -> None:
    version = profile.container_toolkit_version or ""
    known = matrix()["container_toolkit"]
    if version and (not _SERIES_RE.match(version) or series(version) not in known):
        found["container_toolkit_version"] = _known(known, "NVIDIA container toolkit", version)


def _check_orchestrator(profile, found: dict[str, str]) -> None:
    version = profile.orchestrator_version or ""
    if profile.orchestrator == "kubernetes":
        kube = matrix()["kubernetes"]
        if not version:
            found["orchestrator_version"] = "Give the Kubernetes version, e.g. 1.31."
        elif not _SERIES_RE.match(version) or series(version) not in kube["versions"]:
            found["orchestrator_version"] = _known(kube["versions"], "Kubernetes", version)
        if profile.container_runtime not in kube["runtimes"]:
            found["container_runtime"] = (f"Kubernetes nodes run {', '.join(kube['runtimes'])}: "
                                          f"Kubernetes dropped {profile.container_runtime} "
                                          "support (dockershim) in 1.24.")
    elif profile.orchestrator == "slurm":
        known = matrix()["slurm"]
        if not version:
            found["orchestrator_version"] = "Give the Slurm version, e.g. 24.05."
        elif not _SERIES_RE.match(version) or series(version) not in known:
            found["orchestrator_version"] = _known(known, "Slurm", version)
    elif version:
        found["orchestrator_version"] = "Bare nodes take no orchestrator version."


def profile_problems(profile) -> dict[str, str]:
    """What in `profile` the matrix refuses, field -> reason; empty when it is fine. Works on an
    unsaved profile (any object with StackProfile's fields)."""
    found: dict[str, str] = {}
    if profile.os_family not in matrix()["os_families"]:
        found["os_family"] = _known(matrix()["os_families"], "OS", profile.os_family)
    _check_driver(profile, found)
    _check_cuda(profile, found)
    _check_cuda_library(profile, found, "cudnn_version", "cuDNN")
    _check_cuda_library(profile, found, "nccl_version", "NCCL")
    _check_dcgm(profile, found)
    _check_ofed(profile, found)
    _check_toolkit(profile, found)
    _check_orchestrator(profile, found)
    mirror = profile.offline_mirror or ""
    if mirror and not _MIRROR_RE.match(mirror):
        found["offline_mirror"] = ("Give the mirror as an absolute path on the nodes, a "
                                   "file:/// URL or an http(s) URL inside the site.")
    return found
