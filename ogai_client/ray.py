"""Ray clusters from a notebook, as CodeFlare's SDK gives them: a `kind: ray` job that holds a
Ray cluster up until it is torn down, and the addresses to use it.

    from ogai_client import OgaiClient

    client = OgaiClient.from_env()  # in a notebook; OgaiClient.from_config() elsewhere
    with client.ray_cluster(workers=2, worker={"gpus": 1, "cpu": 4, "memory_mib": 16384}) as rc:
        rc.wait_ready(timeout=300)
        import ray
        ray.init(address=rc.address)          # from beside it: a notebook or job of its cluster
        ...
        rc.submit("python train.py", runtime_env={"working_dir": "."})  # Ray's job API

The cluster is a job: scheduled like any gang (quota, queue, priority), billed while it runs,
and gone when `down()` cancels it, when the `with` block ends, when this Python process ends
(an `atexit` hook), or at the latest when its time limit (`time_limit_s`) runs out.

Ray itself is optional here (`pip install 'ogai[ray]'`): only `submit` and `job_client` import
it, when called.
"""

from __future__ import annotations

import atexit
import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ogai_client.models import FINAL_STATES, Job, RayAddresses

if TYPE_CHECKING:
    from ogai_client.client import OgaiClient

# A notebook's cluster lives at most this long unless asked otherwise (the job's time limit).
DEFAULT_TIME_LIMIT_S = 8 * 3600


def hold_command(seconds: int) -> list[str]:
    """The entrypoint of a cluster that only stays up: it sleeps out the job's time limit
    (the limit ends the job first), while work comes through `ray.init` or Ray's job API."""
    return ["python", "-c", f"import time; time.sleep({int(seconds) + 60})"]


class RayCluster:
    """A Ray cluster held up by a `kind: ray` job. Make one with `OgaiClient.ray_cluster(...)`
    (submits it) or `RayCluster.attach(client, job_id)` (one that runs already; not torn down
    when this process ends unless `down_at_exit=True`)."""

    def __init__(self, client: OgaiClient, job: Job, *, down_at_exit: bool = True) -> None:
        self.client = client
        self.job = job
        self._addresses: RayAddresses | None = None
        self._at_exit = False
        if down_at_exit:
            atexit.register(self._down_at_exit)
            self._at_exit = True

    # -- making one ---------------------------------------------------------------------------

    @classmethod
    def create(cls, client: OgaiClient, *, name: str = "ray-cluster", workers: int = 1,
               worker: dict | None = None, head: dict | None = None, dashboard: bool = True,
               tenant: str | None = None, queue: str | None = None, image: str | None = None,
               environment: str | None = None, env: dict[str, str] | None = None,
               priority: int | None = None, time_limit_s: int = DEFAULT_TIME_LIMIT_S,
               down_at_exit: bool = True) -> RayCluster:
        """Submit a Ray cluster of a head and `workers` worker nodes (`worker`, `head`:
        {gpus, gpu_model, cpu, memory_mib}; the head defaults to a worker's) that stays up
        until `down()`, this process's end or `time_limit_s`. `dashboard`: Ray's dashboard and
        job API, reached through the platform's proxy (`dashboard_url`, `submit`)."""
        ray: dict[str, Any] = {"workers": workers, "dashboard": bool(dashboard)}
        for what, value in (("worker", worker), ("head", head)):
            if value is not None:
                ray[what] = value  # checked (and memory: "16Gi" converted) by submit_job
        spec: dict[str, Any] = {"name": name, "kind": "ray", "ray": ray,
                                "command": hold_command(time_limit_s),
                                "time_limit_s": int(time_limit_s)}
        for field, value in (("tenant", tenant), ("queue", queue), ("image", image),
                             ("environment", environment), ("env", env),
                             ("priority", priority)):
            if value is not None:
                spec[field] = value
        job = client.submit_job(spec, workdir=False)
        return cls(client, job, down_at_exit=down_at_exit)

    @classmethod
    def attach(cls, client: OgaiClient, job_id: int, *, down_at_exit: bool = False
               ) -> RayCluster:
        """The Ray cluster of an existing `kind: ray` job."""
        from ogai_client.client import OgaiError

        job = client.job(job_id)
        if job.kind != "ray":
            raise OgaiError("invalid", f"job {job_id} is not a Ray job (kind: {job.kind})")
        return cls(client, job, down_at_exit=down_at_exit)

    # -- state ------------------------------------------------------------------------------

    @property
    def job_id(self) -> int:
        return self.job.id

    def __repr__(self) -> str:
        return f"RayCluster(job={self.job.id}, state={self.job.state!r})"

    def refresh(self) -> RayAddresses:
        """Ask the platform now where the cluster is (and the job's state)."""
        self._addresses = self.client.ray_addresses(self.job.id)
        return self._addresses

    def status(self) -> str:
        """The job's state now (queued, running, succeeded, cancelled, …)."""
        self.job = self.client.job(self.job.id)
        return self.job.state

    def wait_ready(self, timeout: float = 300.0, *, poll_s: float = 1.0) -> RayCluster:
        """Wait until the job runs and its cluster's addresses are known; OgaiError when the job
        ends first (with its reason) or after `timeout` seconds (with why it waits)."""
        from ogai_client.client import OgaiError

        deadline = time.monotonic() + timeout
        while True:
            found = self.refresh()
            if found.ready:
                self.job = self.client.job(self.job.id)
                return self
            job = self.client.job(self.job.id)
            self.job = job
            if job.state in FINAL_STATES:
                why = f": {job.reason}" if job.reason else ""
                raise OgaiError("ended", f"Ray cluster job {job.id} is {job.state}{why}")
            if time.monotonic() >= deadline:
                raise OgaiError("timeout", f"Ray cluster job {job.id} is not ready after "
                                f"{timeout:g} s: {found.reason or job.reason or job.state}")
            time.sleep(poll_s)

    def _ready(self) -> RayAddresses:
        from ogai_client.client import OgaiError

        found = self._addresses
        if found is None or not found.ready:
            found = self.refresh()
        if not found.ready:
            raise OgaiError("not_ready", f"Ray cluster job {self.job.id} is not ready "
                            f"({found.reason}); call wait_ready() first")
        return found

    @property
    def address(self) -> str:
        """What `ray.init(address=...)` takes from beside the cluster (a notebook or job of the
        same tenant on its cluster): its Ray Client address (`ray://host:port`) where the
        cluster gives one, else its GCS address (host:port)."""
        return self._ready().address

    @property
    def gcs_address(self) -> str:
        """The cluster's GCS address (host:port): what `ray start --address` takes."""
        return self._ready().gcs_address

    @property
    def dashboard_url(self) -> str:
        """Ray's dashboard through the platform's proxy (open it signed in to the console);
        "" for a cluster made with dashboard=False."""
        found = self._addresses if self._addresses is not None else self.refresh()
        return found.dashboard_url

    # -- work on it ---------------------------------------------------------------------------

    def job_client(self) -> Any:
        """Ray's `JobSubmissionClient` for this cluster's job API, through the platform's proxy
        with this client's token (needs `ray`, and `dashboard=True`)."""
        from ogai_client.client import OgaiError

        url = self._ready().dashboard_url
        if not url:
            raise OgaiError("unsupported", f"Ray cluster job {self.job.id} has no dashboard, "
                            "so no job API: use ray.init(address=cluster.address) from beside "
                            "it, or make the cluster with dashboard=True")
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise OgaiError("unsupported", "submitting to a Ray cluster needs ray: pip install "
                            "'ogai[ray]' (or 'ray[default]')") from None
        headers = {"Authorization": f"Bearer {self.client.token}"} if self.client.token else {}
        return JobSubmissionClient(url.rstrip("/"), headers=headers)

    def submit(self, entrypoint: str | Sequence[str], *, wait: bool = False,
               timeout: float = 600.0, **options: Any) -> str:
        """Run `entrypoint` (a shell command, or an argument list that is quoted for you) on the
        running cluster with Ray's job API; `options` go to `JobSubmissionClient.submit_job`
        (runtime_env, submission_id, entrypoint_num_cpus, …). Returns Ray's submission id;
        `wait=True` waits for it to end (at most `timeout` s) and raises OgaiError unless it
        succeeded. Without a dashboard, use `ray.init(address=cluster.address)` instead."""
        from ogai_client.client import OgaiError

        command = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
        jobs = self.job_client()
        submission = str(jobs.submit_job(entrypoint=command, **options))
        if wait:
            status = self.wait_submission(submission, timeout=timeout, jobs=jobs)
            if status != "SUCCEEDED":
                raise OgaiError("failed", f"Ray job {submission} on cluster job {self.job.id} "
                                f"ended {status}")
        return submission

    def wait_submission(self, submission_id: str, *, timeout: float = 600.0,
                        poll_s: float = 1.0, jobs: Any = None) -> str:
        """Wait until a submitted Ray job ends; returns its status (SUCCEEDED, FAILED,
        STOPPED)."""
        from ogai_client.client import OgaiError

        jobs = jobs or self.job_client()
        deadline = time.monotonic() + timeout
        while True:
            found = jobs.get_job_status(submission_id)
            status = str(getattr(found, "value", found))
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return status
            if time.monotonic() >= deadline:
                raise OgaiError("timeout", f"Ray job {submission_id} is still {status} after "
                                f"{timeout:g} s")
            time.sleep(poll_s)

    def logs(self, submission_id: str) -> str:
        """A submitted Ray job's output so far."""
        return str(self.job_client().get_job_logs(submission_id))

    # -- tearing down -----------------------------------------------------------------------

    def down(self) -> None:
        """Tear the cluster down (cancel its job); nothing if it ended already."""
        from ogai_client.client import OgaiError

        if self._at_exit:
            atexit.unregister(self._down_at_exit)
            self._at_exit = False
        try:
            self.job = self.client.cancel_job(self.job.id)
        except OgaiError:
            # Already over (cancelled, finished): nothing to tear down.
            self.job = self.client.job(self.job.id)
            if self.job.state not in FINAL_STATES:
                raise
        self._addresses = None

    def _down_at_exit(self) -> None:
        """This Python process (the notebook's kernel) ends: its clusters go with it."""
        from ogai_client.client import OgaiClient

        self._at_exit = False
        try:
            # A fresh client: the one it was made with may be closed by now.
            with OgaiClient(self.client.url, self.client.token) as client:
                if client.job(self.job.id).state not in FINAL_STATES:
                    client.cancel_job(self.job.id)
        except Exception:  # noqa: S110 - at exit there is nobody to tell
            pass

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.down()
