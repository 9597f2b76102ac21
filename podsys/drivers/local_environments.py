"""The Python environments a `local` cluster offers jobs: the platform's own (`platform`,
`sys.prefix`) and those an operator registers in the cluster's `environments` option (a name
for each venv or conda prefix).

What each holds (its Python and torch versions) is found by running its own interpreter in
isolated mode (`-I`: no user site, no PYTHON* variables), once per prefix and again only when
the prefix's folders change (a package installed or removed). A prefix that is missing or whose
interpreter does not answer is still listed, with the reason, and refused at launch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from podsys.drivers.base import DriverError, EnvironmentInfo
from podsys.drivers.common import describe_environments

PLATFORM = "platform"
PROBE_TIMEOUT_S = 30.0
# The torch version from its distribution's metadata: importing torch would take seconds.
PROBE = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "try:\n"
    "    torch = metadata.version('torch')\n"
    "except metadata.PackageNotFoundError:\n"
    "    torch = ''\n"
    "print(json.dumps({'python': '.'.join(map(str, sys.version_info[:3])), 'torch': torch}))\n"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# Variables that name the active environment: the chosen one's replace what the driver had.
ACTIVATION_NAMES = ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONHOME")


@dataclass(frozen=True)
class LocalEnvironment(EnvironmentInfo):
    """An environment of this machine; `problem` says why it cannot run jobs ("" when it
    can), and then `python` and `torch` are ""."""

    problem: str = ""

    @property
    def is_conda(self) -> bool:
        return (Path(self.where) / "conda-meta").is_dir()

    @property
    def is_venv(self) -> bool:
        return (Path(self.where) / "pyvenv.cfg").is_file()


_cache: dict[str, tuple[tuple[float, ...], tuple[str, str, str]]] = {}
_cache_lock = threading.Lock()


def configured(options: dict) -> tuple[dict[str, str], str]:
    """The operator's environments ({name: prefix}) and the default's name, checked: a bad
    option is a DriverError naming it."""
    given = options.get("environments") or {}
    if not isinstance(given, dict):
        raise DriverError("cluster option 'environments' must map names to Python "
                          "environment folders (venv or conda prefixes)")
    found: dict[str, str] = {}
    for name, prefix in given.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise DriverError(f"cluster option 'environments': {name!r} is not a name (letters, "
                              "digits, '.', '_' or '-', at most 63)")
        if name == PLATFORM:
            raise DriverError(f"cluster option 'environments': {PLATFORM!r} is the platform's "
                              "own environment; give yours another name")
        if not isinstance(prefix, str) or not os.path.isabs(prefix):
            raise DriverError(f"cluster option 'environments': {name!r} must be an absolute "
                              f"folder (a venv or conda prefix), not {prefix!r}")
        found[name] = os.path.normpath(prefix)
    default = options.get("default_environment") or PLATFORM
    if default != PLATFORM and default not in found:
        raise DriverError(f"cluster option 'default_environment' {default!r} is none of the "
                          f"environments ({', '.join([PLATFORM, *found])})")
    return found, str(default)


def interpreter(prefix: str) -> Path | None:
    if Path(prefix) == Path(sys.prefix):
        return Path(sys.executable)
    for name in ("python", "python3"):
        candidate = Path(prefix) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _fingerprint(prefix: Path) -> tuple[float, ...]:
    """What changes when packages are installed in the prefix: its folders' times."""
    folders = [prefix, prefix / "bin", *prefix.glob("lib/python3*/site-packages")]
    times = []
    for folder in folders:
        try:
            times.append(folder.stat().st_mtime)
        except OSError:
            times.append(-1.0)
    return tuple(times)


def probe(prefix: str) -> tuple[str, str, str]:
    """(python, torch, problem) of the environment at `prefix`, cached while its folders stay
    unchanged."""
    folder = Path(prefix)
    if not folder.is_dir():
        return "", "", f"{prefix} is not a folder on this machine"
    python = interpreter(prefix)
    if python is None:
        return "", "", f"{prefix} has no bin/python"
    key = _fingerprint(folder)
    with _cache_lock:
        cached = _cache.get(prefix)
    if cached is not None and cached[0] == key:
        return cached[1]
    found = _run_probe(python)
    with _cache_lock:
        _cache[prefix] = (key, found)
    return found


def _run_probe(python: Path) -> tuple[str, str, str]:
    try:
        done = subprocess.run(  # noqa: S603 - an argument list, never a shell
            [str(python), "-I", "-c", PROBE], capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, check=False, env={"PATH": os.defpath}, cwd="/")
    except subprocess.TimeoutExpired:
        return "", "", f"{python} did not answer within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return "", "", f"{python} cannot run: {exc.strerror}"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        return str(answer["python"]), str(answer["torch"]), ""
    except (IndexError, ValueError, KeyError, TypeError):
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return "", "", f"{python} failed: {said}"


def environments(options: dict) -> list[LocalEnvironment]:
    """Every environment of the cluster, the default first."""
    found, default = configured(options)
    listed = []
    for name, prefix in {PLATFORM: sys.prefix, **found}.items():
        python, torch, problem = probe(prefix)
        listed.append(LocalEnvironment(name=name, where=prefix, python=python, torch=torch,
                                       default=name == default, problem=problem))
    return sorted(listed, key=lambda env: not env.default)


def choose(options: dict, name: str, *, cluster: str) -> LocalEnvironment:
    """The environment a workload runs in ("" = the default); DriverError when the cluster
    has none of that name or it cannot run jobs."""
    offered = environments(options)
    wanted = name or next(env.name for env in offered if env.default)
    chosen = next((env for env in offered if env.name == wanted), None)
    if chosen is None:
        raise DriverError(f"cluster {cluster} offers no environment {wanted!r}; it offers "
                          f"{describe_environments(offered)}")
    if chosen.problem:
        raise DriverError(f"environment {chosen.name!r} of cluster {cluster} cannot run jobs: "
                          f"{chosen.problem}")
    return chosen


def activate(env: dict[str, str], chosen: LocalEnvironment) -> dict[str, str]:
    """The process environment with `chosen` active: its bin first on PATH, VIRTUAL_ENV or
    CONDA_PREFIX naming it, so `python` and `pip` are the environment's."""
    result = {key: value for key, value in env.items() if key not in ACTIVATION_NAMES}
    result["PATH"] = os.pathsep.join(
        part for part in (str(Path(chosen.where) / "bin"), env.get("PATH") or os.defpath)
        if part)
    if chosen.is_conda:
        result["CONDA_PREFIX"] = chosen.where
        result["CONDA_DEFAULT_ENV"] = chosen.name
    elif chosen.is_venv:
        result["VIRTUAL_ENV"] = chosen.where
    return result
