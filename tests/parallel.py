"""How the suite runs on several pytest-xdist workers (`make test`).

Each test file is one unit of work, run by one worker start to end (its module fixtures built
once). The files that share one of this machine's resources make one unit together (`SHARED`):
a Slurm's daemons and POSIX accounts, Ray's local session (a bare `ray.init()` joins the newest
cluster on the machine). Units run in collection order, and the collection puts the files with
tests that start processes or a browser (marked `slow` or `browser`) first: the long units
start early and the short ones fill in at the end. Each worker has its own data folder and, on
Redis, its own broker database, so one worker's Celery worker never takes another's tasks;
pytest-django gives each its own test database.

(xdist's own `--dist loadgroup` does not group on pytest 9, whose node ids it cannot suffix.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from xdist.scheduler import LoadScopeScheduling

REPO = Path(__file__).resolve().parent.parent
REDIS_DATABASES = 16  # Redis's default `databases`

# A file that starts a Slurm (tests/slurm_cluster.py) or a Ray belongs here.
SHARED = {
    "tests/test_slurm_jobs.py": "slurm",
    "tests/test_driver_contract.py": "slurm",
    "podsys/tests/test_driver_slurm.py": "slurm",
    "aistation/tests/test_ray_jobs_local.py": "ray",
    "ogai_client/tests/test_ogai_ray.py": "ray",
    "ylink/tests/test_data_runner_ray.py": "ray",
}


def worker_environment(index: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What worker `index` sets in its environment before Django reads its settings."""
    data = Path(environ.get("OGAI_DATA_DIR") or REPO / "var") / f"worker-{index}"
    env = {"OGAI_DATA_DIR": str(data)}
    broker = environ.get("CELERY_BROKER_URL", "")
    if broker.startswith(("redis://", "rediss://")):
        parts = urlsplit(broker)
        first = int(parts.path.strip("/") or 0)
        if first + index >= REDIS_DATABASES:
            raise pytest.UsageError(
                f"CELERY_BROKER_URL uses Redis database {first}: {index + 1} workers need "
                f"databases {first} to {first + index}. Choose a lower database or fewer workers.")
        env["CELERY_BROKER_URL"] = urlunsplit(parts._replace(path=f"/{first + index}"))
    return env


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the resource its file shares."""
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path, path)


def long_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items of files with a test marked `slow` or `browser` first, else in order."""
    long = {item.path for item in items
            if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    return sorted(items, key=lambda item: item.path not in long)


class FileScheduling(LoadScopeScheduling):
    """A unit of work is a test file, or the files of one `SHARED` resource; units go to
    workers in collection order."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # not the largest first: the longest first

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
