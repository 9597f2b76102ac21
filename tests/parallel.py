"""How the suite runs on several pytest-xdist workers (`make test`).

Each test file is one unit of work, run by one worker start to end (its module fixtures built
once); files that share one of this machine's resources (one Slurm, Ray's local session) carry
`pytest.mark.xdist_group(NAME)` and make one unit together. Each worker has its own data
folder and, on Redis, its own broker database, so one worker's Celery worker never takes another
worker's tasks; pytest-django gives each its own test database.
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


class FileOrGroupScheduling(LoadScopeScheduling):
    """A unit of work is a test file, or every test of an `xdist_group` (with `--dist
    loadgroup` a worker suffixes their ids with `@NAME`)."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.rfind("@") > nodeid.rfind("]"):
            return nodeid.rsplit("@", 1)[-1]
        return nodeid.split("::", 1)[0]
