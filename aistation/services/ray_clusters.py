"""Where a running Ray job (`kind: ray`) is reached: its GCS address (for `ray.init`) and its
dashboard, which the platform's proxy serves under `/ray-dashboards/<job id>/` with the
platform's own sign-in (`aistation.proxy`).

The addresses come from the job's cluster driver (`ray_addresses` of its newest attempt's
workload), asked at most every few seconds per job: a proxied dashboard page makes dozens of
requests a second.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aistation.choices import JobState
from aistation.models import Job
from infra_os.access import role_in
from infra_os.choices import ADMIN_ROLES, WRITE_ROLES
from podsys.drivers.base import DriverError
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)

# The proxy's path of a Ray job's dashboard (the job's id follows).
DASHBOARD_PREFIX = "/ray-dashboards/"
ADDRESSES_CACHE_S = 10.0
# job id -> (attempt workload id, addresses, valid until)
_addresses: dict[int, tuple[str, dict[str, str], float]] = {}


@dataclass(frozen=True)
class RayCluster:
    """What the API says of a Ray job's cluster. `address` and `dashboard` are "" until the
    job runs and its driver says where; `reason` then says why not yet."""

    ready: bool
    address: str  # what ray.init(address=...) takes: ray://host:port (Ray Client), else GCS
    gcs_address: str  # the GCS, host:port (ray start --address; ray.init on a cluster node)
    dashboard: str  # the head's dashboard, http://host:port, as the driver gives it; "" if off
    dashboard_path: str  # the proxy's path of the dashboard; "" if off
    reason: str


class RayDashboardNotFound(Exception):
    """No such Ray job with a dashboard, or the user may not reach it."""


class RayDashboardNotRunning(Exception):
    """The job exists but its dashboard does not answer now; the message says why."""


def _driver_addresses(job: Job) -> dict[str, str] | None:
    attempt = job.attempts.order_by("-number").first()
    if attempt is None:
        return None
    cached = _addresses.get(job.pk)
    if cached is not None and cached[0] == attempt.workload_id and cached[2] > time.monotonic():
        return cached[1]
    try:
        found = driver_for(job.cluster).ray_addresses(attempt.workload_id)
    except DriverError as exc:
        logger.warning("Ray job %s: no addresses: %s", job.pk, exc)
        return None
    if found:
        _addresses[job.pk] = (attempt.workload_id, dict(found),
                              time.monotonic() + ADDRESSES_CACHE_S)
    return found


def ray_cluster_of(job: Job) -> RayCluster:
    """The Ray cluster of `job` (a job of kind ray; callers check access)."""
    dashboard_on = bool((job.ray or {}).get("dashboard"))
    path = f"{DASHBOARD_PREFIX}{job.pk}/" if dashboard_on else ""
    if job.state != JobState.RUNNING:
        why = f"job {job.pk} is {job.state}" + (f": {job.reason}" if job.reason else "")
        return RayCluster(False, "", "", "", path, why)
    found = _driver_addresses(job) if job.cluster_id else None
    if not found or not found.get("gcs"):
        return RayCluster(False, "", "", "", path,
                          f"job {job.pk} is running; its cluster does not say where Ray is yet")
    return RayCluster(True, found.get("client") or found["gcs"], found["gcs"],
                      found.get("dashboard", "") if dashboard_on else "", path, "")


def _may_reach_dashboard(user, job: Job) -> bool:
    """The dashboard runs code (Ray's job-submission API) as the job's tenant: the job's owner
    (still a member who may write) and the tenant's admins only, like a notebook's server."""
    if not getattr(user, "is_authenticated", False):
        return False
    role = role_in(user, job.tenant_id)
    if job.owner_id == user.pk:
        return role in WRITE_ROLES
    return role in ADMIN_ROLES


def ray_dashboard_upstream(*, user, job_id: int) -> str:
    """The head's dashboard (http://host:port) of Ray job `job_id`, for the proxy."""
    job = Job.objects.select_related("cluster").filter(pk=job_id).first()
    if job is None or not job.ray or not _may_reach_dashboard(user, job):
        raise RayDashboardNotFound(job_id)
    if not job.ray.get("dashboard"):
        raise RayDashboardNotFound(job_id)
    cluster = ray_cluster_of(job)
    if not cluster.ready:
        raise RayDashboardNotRunning(cluster.reason)
    if not cluster.dashboard:
        raise RayDashboardNotRunning(f"job {job_id}: its cluster does not say where the "
                                     "dashboard is yet")
    return cluster.dashboard.rstrip("/")
