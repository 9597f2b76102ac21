"""A thin typed client of the OGAI REST API.

    from ogai_client import OgaiClient

    client = OgaiClient.from_config()          # OGAI_URL / OGAI_TOKEN, or `ogai login`'s file
    client = OgaiClient.from_env()             # OGAI_URL / OGAI_TOKEN only (in a notebook)
    job = client.submit_job({"name": "train", "command": ["python", "train.py"],
                             "resources": {"gpus": 8, "memory": "64Gi"}})
    client.wait_job(job.id)

Every failure raises `OgaiError`: the API's error envelope `{"code", "message", "fields"}` with
the HTTP status, or a readable one for a network failure (`code` "unreachable" or "timeout").
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx

from ogai_client import __version__
from ogai_client.config import TOKEN_ENV, URL_ENV, load_config
from ogai_client.models import (
    Benchmark,
    Checkpoint,
    ClusterEnvironment,
    Dataset,
    DatasetVersion,
    Deployment,
    DeploymentGrid,
    DeploymentRun,
    DeploymentStat,
    EvaluationRun,
    EvaluationSample,
    HealthCheckRun,
    HealthCheckType,
    Job,
    JobLogs,
    LeaderboardRow,
    LogAround,
    LogHistogram,
    LogSearchResult,
    Model,
    ModelImport,
    ModelVersion,
    Node,
    Notebook,
    Page,
    PipelineRun,
    Queue,
    Quota,
    RayAddresses,
    Sample,
    StackProfile,
    TrainingMetric,
    TrainingRun,
    User,
    Workdir,
)
from ogai_client.spec import SpecError, normalize_spec, workdir_target
from ogai_client.workdir import WorkdirError, build_archive

if TYPE_CHECKING:
    from ogai_client.ray import RayCluster

T = TypeVar("T")
R = TypeVar("R", PipelineRun, TrainingRun)
# A moment for the log search: "7d", "24h", "30m", "90s", "2w" ago, ISO 8601, or a datetime or
# a timedelta (that long ago).
Moment = str | datetime | timedelta

INFRA = "/api/v1/infra-os"
AISTATION = "/api/v1/aistation"
YLINK = "/api/v1/ylink"
MMODEL = "/api/v1/mmodel"
PODSYS = "/api/v1/podsys"
GATEWAY = "/v1"  # the OpenAI-compatible gateway, with the same API token
PAGE_SIZE = 200  # the API caps a page at 500
DEFAULT_TOKEN_NAME = "ogai client"
# The server checks an upload as it reads it and answers once it is stored: a large corpus
# takes longer than an ordinary request.
UPLOAD_READ_TIMEOUT_S = 900.0
# A model on a CPU, or a long answer, may take minutes: wait that long between two pieces.
GENERATION_READ_TIMEOUT_S = 600.0


class OgaiError(Exception):
    """An error from the API (its envelope) or from the way to it.

    `code`: the API's code ("invalid", "not_found", "not_authenticated", …) or the client's own
    ("unreachable", "timeout", "bad_url", "bad_response", "not_logged_in"); `fields`: per-field
    messages of a validation error, named by their path ("resources.gpus"); `status`: the HTTP
    status, None when there was no answer.
    """

    def __init__(self, code: str, message: str, fields: dict[str, list[str]] | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields or {}
        self.status = status

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"OgaiError(code={self.code!r}, message={self.message!r}, status={self.status!r})"


def normalize_url(url: str) -> str:
    url = (url or "").strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise OgaiError("bad_url", f"{url or 'the URL'!r} is not an OGAI URL; give it with "
                        "http:// or https://, e.g. http://127.0.0.1:8000")
    return url


class OgaiClient:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout
        self._transport = transport
        self._token: str | None = None
        self._http = self._new_http()
        self.token = token

    @classmethod
    def from_config(cls, *, timeout: float = 30.0) -> OgaiClient:
        """A client for `OGAI_URL`/`OGAI_TOKEN`, or the URL and token `ogai login` stored."""
        config = load_config()
        if not config.url:
            raise OgaiError("not_logged_in", "no OGAI URL: set OGAI_URL or run `ogai login "
                            "--url URL`")
        if not config.token:
            raise OgaiError("not_logged_in", f"no API token for {config.url}: set OGAI_TOKEN "
                            "or run `ogai login`")
        return cls(config.url, config.token, timeout=timeout)

    @classmethod
    def from_env(cls, *, timeout: float = 30.0) -> OgaiClient:
        """A client for `OGAI_URL` and `OGAI_TOKEN` from the environment, and nothing else:
        inside a notebook (or a job) the platform sets both."""
        missing = [name for name in (URL_ENV, TOKEN_ENV) if not os.environ.get(name, "").strip()]
        if missing:
            raise OgaiError("not_logged_in", f"{' and '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not set: the platform "
                            "sets them inside a notebook; elsewhere set them, or use "
                            "OgaiClient.from_config() after `ogai login`")
        return cls(os.environ[URL_ENV], os.environ[TOKEN_ENV], timeout=timeout)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return self._token

    @token.setter
    def token(self, value: str | None) -> None:
        self._token = value.strip() if value else None
        if self._token:
            self._http.headers["Authorization"] = f"Bearer {self._token}"
        else:
            self._http.headers.pop("Authorization", None)

    def _new_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=self.timeout, transport=self._transport,
            headers={"User-Agent": f"ogai-client/{__version__}", "Accept": "application/json"},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OgaiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OgaiClient({self.url!r}, token={'set' if self._token else None})"

    def _send(self, http: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            limit = kwargs.get("timeout")
            seconds = limit.read if isinstance(limit, httpx.Timeout) and limit.read \
                else self.timeout
            raise OgaiError("timeout", f"{self.url} did not answer within "
                            f"{seconds:g} s; try again or check the server") from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise OgaiError("unreachable", f"cannot connect to {self.url} ({reason}); check "
                            "the URL and that the server is running") from None
        if response.status_code == 204:
            return None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_error:
            if isinstance(data, dict) and "code" in data and "message" in data:
                raise OgaiError(str(data["code"]), str(data["message"]),
                                data.get("fields") or {}, response.status_code)
            raise OgaiError(
                f"http_{response.status_code}",
                f"{method} {response.request.url} answered HTTP {response.status_code} "
                f"{response.reason_phrase}; is {self.url} the OGAI URL?",
                status=response.status_code,
            )
        if data is None:
            raise OgaiError("bad_response", f"{response.request.url} did not answer JSON; is "
                            f"{self.url} the OGAI URL?", status=response.status_code)
        return data

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(self._http, method, path, **kwargs)

    def _page(self, path: str, params: dict, build: Callable[[dict], T], *, limit: int,
              offset: int) -> Page[T]:
        data = self._request("GET", path, params={**params, "limit": limit, "offset": offset})
        if isinstance(data, list):  # an unpaginated list
            return Page(count=len(data), results=[build(item) for item in data])
        return Page(count=data.get("count", 0), offset=offset,
                    results=[build(item) for item in data.get("results") or []])

    def _all(self, path: str, params: dict, build: Callable[[dict], T],
             key: Callable[[T], Any] | None = None) -> list[T]:
        """Every page, by offset. Rows created while paging shift later pages, so rows already
        seen (by `key`) are skipped."""
        results: list[T] = []
        seen: set = set()
        offset = 0
        while True:
            page = self._page(path, params, build, limit=PAGE_SIZE, offset=offset)
            for item in page.results:
                ident = key(item) if key else None
                if ident is not None and ident in seen:
                    continue
                seen.add(ident)
                results.append(item)
            offset += len(page.results)
            if not page.results or offset >= page.count:
                return results

    # -- identity ---------------------------------------------------------------------------

    def me(self) -> User:
        return User.from_api(self._request("GET", f"{INFRA}/me/"))

    def login(self, username: str, password: str, *, token_name: str | None = None,
              expires_in_days: int | None = 90) -> str:
        """Sign in with a password, create an API token, sign the session out again and return
        the token (also set on this client). The token is shown this once; store it."""
        with self._new_http() as session:
            self._send(session, "POST", f"{INFRA}/auth/login/",
                       json={"username": username, "password": password})
            # Django's login() rotates the CSRF token and sets its cookie; the session is
            # CSRF-protected, and over HTTPS Django also wants a same-origin Referer.
            csrf = next((cookie.value for cookie in session.cookies.jar
                         if "csrf" in cookie.name.lower()), None)
            headers = {"Referer": f"{self.url}/"}
            if csrf:
                headers["X-CSRFToken"] = csrf
            created = self._send(session, "POST", f"{INFRA}/api-tokens/", headers=headers,
                                 json={"name": token_name or DEFAULT_TOKEN_NAME,
                                       "expires_in_days": expires_in_days})
            with suppress(OgaiError):  # the token exists; a session left behind only expires
                self._send(session, "POST", f"{INFRA}/auth/logout/", headers=headers)
        token = created.get("token") if isinstance(created, dict) else None
        if not token:
            raise OgaiError("bad_response", "the server created no token; is this OGAI?")
        self.token = token
        return token

    def create_token(self, name: str, *, expires_in_days: int | None = 90) -> dict:
        """A new API token of the caller: the answer's `token` is the secret, shown once."""
        return self._request("POST", f"{INFRA}/api-tokens/",
                             json={"name": name, "expires_in_days": expires_in_days})

    # -- jobs -------------------------------------------------------------------------------

    def submit_job(self, spec: dict, *,
                   workdir: str | os.PathLike | Workdir | int | bool | None = None,
                   spec_dir: str | os.PathLike | None = None) -> Job:
        """Submit a job spec (see POST /api/v1/aistation/jobs/); `resources.memory` may be a
        quantity such as "16Gi", `environment` names one the cluster offers.

        The working folder the job starts in: `workdir=` (a folder, which is shipped with
        `upload_workdir`; a Workdir or its id; False for none), else the spec's `workdir:` (a
        folder relative to `spec_dir`, or to the current folder), else `spec_dir` when given
        (the folder of the spec file it came from); else nothing is shipped."""
        try:
            spec = normalize_spec(spec, job=True)
            target = workdir.id if isinstance(workdir, Workdir) else \
                workdir_target(spec, spec_dir=spec_dir, override=workdir)
        except SpecError as exc:
            raise OgaiError("invalid", str(exc)) from None
        if isinstance(target, str):
            target = self.upload_workdir(spec.get("tenant"), target).id
        if target is not None:
            spec["workdir"] = target
        return Job.from_api(self._request("POST", f"{AISTATION}/jobs/", json=spec))

    @staticmethod
    def _job_filters(state: str | Iterable[str] | None, tenant: str | None, queue: str | None,
                     owner: str | None, search: str | None) -> dict:
        params: dict[str, Any] = {}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        for name, value in (("tenant", tenant), ("queue", queue), ("owner", owner),
                            ("q", search)):
            if value:
                params[name] = value
        return params

    def job_page(self, state: str | Iterable[str] | None = None, *, tenant: str | None = None,
                 queue: str | None = None, owner: str | None = None,
                 search: str | None = None, limit: int = 50, offset: int = 0) -> Page[Job]:
        """One page of jobs, newest first."""
        params = self._job_filters(state, tenant, queue, owner, search)
        return self._page(f"{AISTATION}/jobs/", params, Job.from_api, limit=limit,
                          offset=offset)

    def jobs(self, state: str | Iterable[str] | None = None, *, tenant: str | None = None,
             queue: str | None = None, owner: str | None = None, search: str | None = None,
             all_pages: bool = True) -> list[Job]:
        """Jobs you can see, newest first: every page, or only the first (50) one."""
        if not all_pages:
            return self.job_page(state, tenant=tenant, queue=queue, owner=owner,
                                 search=search).results
        params = self._job_filters(state, tenant, queue, owner, search)
        return self._all(f"{AISTATION}/jobs/", params, Job.from_api, key=lambda job: job.id)

    def job(self, job_id: int) -> Job:
        """The job with its attempts and its event history."""
        return Job.from_api(self._request("GET", f"{AISTATION}/jobs/{int(job_id)}/"))

    def cancel_job(self, job_id: int) -> Job:
        return Job.from_api(self._request("POST", f"{AISTATION}/jobs/{int(job_id)}/cancel/"))

    def rerun_job(self, job_id: int) -> Job:
        """Submit a finished job again as a new job; returns the new one."""
        return Job.from_api(self._request("POST", f"{AISTATION}/jobs/{int(job_id)}/rerun/"))

    def job_logs(self, job_id: int, tail: int | None = None, attempt: int | None = None,
                 replica: int | None = None) -> JobLogs:
        """The last `tail` lines (server default 500, at most 10000) of one replica of one
        attempt (default: the newest attempt, replica 0)."""
        params = {name: value for name, value in
                  (("tail", tail), ("attempt", attempt), ("replica", replica))
                  if value is not None}
        return JobLogs.from_api(self._request("GET", f"{AISTATION}/jobs/{int(job_id)}/logs/",
                                              params=params))

    def job_manifests(self, job_id: int) -> str:
        """What the job (its newest attempt, or its next one if it has not started) runs on its
        cluster, as YAML: the Kubernetes objects OGAI would create, or the local driver's
        environment, command and sandbox."""
        data = self._request("GET", f"{AISTATION}/jobs/{int(job_id)}/manifests/")
        text = data.get("yaml") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise OgaiError("bad_response", "the server answered no manifests; is this OGAI?")
        return text

    def ray_addresses(self, job_id: int) -> RayAddresses:
        """Where a Ray job's (`kind: ray`) cluster is: its GCS address and dashboard URL, once
        it runs (`ready`), else why not yet."""
        return RayAddresses.from_api(self._request("GET",
                                                   f"{AISTATION}/jobs/{int(job_id)}/ray/"))

    def ray_cluster(self, *, workers: int = 1, worker: dict | None = None,
                    head: dict | None = None, dashboard: bool = True,
                    name: str = "ray-cluster", **options: Any) -> RayCluster:
        """Start a Ray cluster (a `kind: ray` job that holds it up) for this session: see
        `ogai_client.ray.RayCluster.create` for the options (tenant, queue, image,
        environment, env, priority, time_limit_s, down_at_exit). Then `wait_ready()`,
        `address`, `dashboard_url`, `submit(...)`, `down()`; or use it in a `with` block."""
        from ogai_client.ray import RayCluster

        return RayCluster.create(self, name=name, workers=workers, worker=worker, head=head,
                                 dashboard=dashboard, **options)

    def wait_job(self, job_id: int, *, poll_s: float = 2.0,
                 timeout_s: float | None = None) -> Job:
        """Poll until the job ends (succeeded, failed or cancelled) and return it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job.is_final:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise OgaiError("timeout", f"job {job_id} is still {job.state} after "
                                f"{timeout_s:g} s")
            time.sleep(poll_s)

    # -- the log store ----------------------------------------------------------------------

    def log_search(self, q: str = "", *, job: int | None = None, attempt: int | None = None,
                   replica: int | None = None, level: str | None = None,
                   source: str | None = None, request_id: str | None = None,
                   since: Moment | None = None, until: Moment | None = None,
                   after: int | None = None, limit: int = 100) -> LogSearchResult:
        """Lines of your jobs' output (platform admins: every job's, and the platform's own)
        with every word and "quoted phrase" of `q`, newest first; with `after` (a line's id),
        the lines after it, oldest first, for a live tail.

        `level`: debug, info, warning, error or critical; `source`: job (jobs' output), web,
        worker or beat (the platform's); `since`/`until`: "7d", "24h", "30m", "90s" or "2w"
        ago, ISO 8601 text (UTC unless it names a zone, as the API reads it), a datetime (a
        naive one is local time) or a timedelta (that long ago). `limit`: at most 1000;
        `.more` says it was reached. A job you cannot see raises OgaiError "not_found"."""
        params = _log_filters(q, job=job, attempt=attempt, replica=replica, level=level,
                              source=source, request_id=request_id, since=since, until=until)
        if after is not None:
            params["after"] = int(after)
        params["limit"] = int(limit)
        return LogSearchResult.from_api(self._request("GET", f"{AISTATION}/logs/",
                                                      params=params))

    def log_histogram(self, q: str = "", *, job: int | None = None,
                      attempt: int | None = None, replica: int | None = None,
                      level: str | None = None, source: str | None = None,
                      request_id: str | None = None, since: Moment | None = None,
                      until: Moment | None = None, buckets: int = 60) -> LogHistogram:
        """How many lines match (the filters of `log_search`) per time bucket, `buckets` of
        them (at most 500) between `since` (default a day before `until`) and `until`
        (default now)."""
        params = _log_filters(q, job=job, attempt=attempt, replica=replica, level=level,
                              source=source, request_id=request_id, since=since, until=until)
        params["buckets"] = int(buckets)
        return LogHistogram.from_api(self._request("GET", f"{AISTATION}/logs/histogram/",
                                                   params=params))

    def log_around(self, job: int, *, line: int, attempt: int | None = None, replica: int = 0,
                   context: int = 100, q: str = "") -> LogAround:
        """The `context` lines (at most 1000) before and after line `line` of one replica's
        log of a job's attempt (default: the newest), in order; the words of `q` are
        highlighted."""
        params: dict[str, Any] = {"job": int(job), "line": int(line), "replica": int(replica),
                                  "context": int(context)}
        if attempt is not None:
            params["attempt"] = int(attempt)
        if q:
            params["q"] = q
        return LogAround.from_api(self._request("GET", f"{AISTATION}/logs/around/",
                                                params=params))

    # -- working folders --------------------------------------------------------------------

    def workdir_limit(self) -> int:
        """The most bytes a working folder may hold (packed, and unpacked)."""
        try:
            data = self._request("GET", f"{AISTATION}/workdirs/limits/")
        except OgaiError as exc:
            if exc.status != 404:
                raise
            raise OgaiError("not_supported", f"{self.url} takes no working folders (an older "
                            "OGAI?): submit with --no-workdir (workdir=False)",
                            status=404) from None
        limit = data.get("max_bytes") if isinstance(data, dict) else None
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise OgaiError("bad_response", "the server answered no working-folder limit; is "
                            "this OGAI?")
        return limit

    def workdir(self, workdir_id: int) -> Workdir:
        """A working folder with its file list."""
        return Workdir.from_api(self._request("GET", f"{AISTATION}/workdirs/{int(workdir_id)}/"))

    def find_workdir(self, tenant: str, sha256: str) -> Workdir | None:
        """The tenant's working folder with this sha256, or None."""
        page = self._page(f"{AISTATION}/workdirs/", {"tenant": tenant, "sha256": sha256},
                          Workdir.from_api, limit=1, offset=0)
        return next((item for item in page.results if item.sha256 == sha256), None)

    def upload_workdir(self, tenant: str | None, folder: str | os.PathLike, *,
                       on_progress: Callable[[int, int], None] | None = None) -> Workdir:
        """Pack `folder` (honouring .gitignore and .ogaiignore files, see ogai_client.workdir)
        and ship it to `tenant` (None: your only tenant), unless the tenant already has that
        archive: then nothing is uploaded and the answer's `reused` is True. Raises
        OgaiError("workdir") when the folder cannot be packed or is over the platform's
        limit, before anything is sent."""
        limit = self.workdir_limit()
        tenant = tenant or self._sole_tenant()
        try:
            archive = build_archive(folder, max_bytes=limit)
        except WorkdirError as exc:
            raise OgaiError("workdir", str(exc)) from None
        with archive:
            found = self.find_workdir(tenant, archive.sha256)
            if found is not None:
                return replace(found, reused=True, left_out=archive.left_out)
            with archive.path.open("rb") as stream:
                reader = ProgressReader(stream, on_progress)
                timeout = httpx.Timeout(self.timeout,
                                        read=max(self.timeout, UPLOAD_READ_TIMEOUT_S))
                data = self._request(
                    "POST", f"{AISTATION}/workdirs/", timeout=timeout,
                    data={"tenant": tenant, "sha256": archive.sha256},
                    files={"archive": (f"{archive.sha256}.tar.gz", reader, "application/gzip")})
        return replace(Workdir.from_api(data), left_out=archive.left_out)

    def _sole_tenant(self) -> str:
        tenants = sorted({membership.tenant for membership in self.me().memberships})
        if len(tenants) == 1:
            return tenants[0]
        if not tenants:
            raise OgaiError("invalid", "you are in no tenant: ask a tenant's admin to add you")
        raise OgaiError("invalid", f"you are in several tenants ({', '.join(tenants)}): name "
                        "the tenant (tenant: in the spec, or --tenant)",
                        {"tenant": ["name the tenant"]})

    # -- notebooks --------------------------------------------------------------------------

    def notebooks(self, *, tenant: str | None = None,
                  state: str | Iterable[str] | None = None) -> list[Notebook]:
        """Your notebooks (a tenant admin: all of the tenant's), newest first, every page."""
        params: dict[str, Any] = {}
        if tenant:
            params["tenant"] = tenant
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        return self._all(f"{AISTATION}/notebooks/", params, Notebook.from_api,
                         key=lambda notebook: notebook.id)

    def list_notebooks(self, *, tenant: str | None = None,
                       state: str | Iterable[str] | None = None) -> list[Notebook]:
        """The same as `notebooks()`."""
        return self.notebooks(tenant=tenant, state=state)

    def notebook(self, notebook_id: int) -> Notebook:
        return Notebook.from_api(self._request("GET", f"{AISTATION}/notebooks/{int(notebook_id)}/"))

    def start_notebook(self, name: str, *, tenant: str | None = None, queue: str | None = None,
                       image: str | None = None, gpus: int | None = None,
                       gpu_model: str | None = None, cpu: float | None = None,
                       memory_mib: int | None = None) -> Notebook:
        """Create a notebook and start its first session (it waits in `queue` like any job).
        What is left out takes the server's default (queue "default", 0 GPUs, 2 CPU, 8 GiB)."""
        body: dict[str, Any] = {"name": name}
        for key, value in (("tenant", tenant), ("queue", queue), ("image", image),
                           ("gpus", gpus), ("gpu_model", gpu_model), ("cpu", cpu),
                           ("memory_mib", memory_mib)):
            if value is not None:
                body[key] = value
        return Notebook.from_api(self._request("POST", f"{AISTATION}/notebooks/", json=body))

    def stop_notebook(self, notebook_id: int) -> Notebook:
        """Stop its session: the GPUs are freed, the home folder stays."""
        return Notebook.from_api(
            self._request("POST", f"{AISTATION}/notebooks/{int(notebook_id)}/stop/"))

    def resume_notebook(self, notebook_id: int) -> Notebook:
        """Start a stopped notebook again, with its home folder as it was."""
        return Notebook.from_api(
            self._request("POST", f"{AISTATION}/notebooks/{int(notebook_id)}/resume/"))

    def delete_notebook(self, notebook_id: int) -> None:
        """Stop it if it runs and delete it."""
        self._request("DELETE", f"{AISTATION}/notebooks/{int(notebook_id)}/")

    # -- queues and quotas ------------------------------------------------------------------

    def queues(self, *, tenant: str | None = None) -> list[Queue]:
        params = {"tenant": tenant} if tenant else {}
        return self._all(f"{AISTATION}/queues/", params, Queue.from_api, key=lambda q: q.id)

    def quotas(self) -> list[Quota]:
        return self._all(f"{INFRA}/quotas/", {}, Quota.from_api, key=lambda q: q.id)

    # -- YLink: datasets --------------------------------------------------------------------

    def datasets(self, *, tenant: str | None = None, kind: str | None = None,
                 search: str | None = None) -> list[Dataset]:
        """Datasets of your tenants, every page."""
        params = {name: value for name, value in
                  (("tenant", tenant), ("kind", kind), ("q", search)) if value}
        return self._all(f"{YLINK}/datasets/", params, Dataset.from_api, key=lambda d: d.id)

    def dataset(self, dataset_id: int) -> Dataset:
        return Dataset.from_api(self._request("GET", f"{YLINK}/datasets/{int(dataset_id)}/"))

    def find_dataset(self, name: str, *, tenant: str | None = None) -> Dataset | None:
        """The dataset called `name` (in `tenant`), or None. Raises when several of your
        tenants have one of that name and no tenant is given."""
        return _one_named(self.datasets(tenant=tenant, search=name), name, "dataset")

    def create_dataset(self, name: str, *, kind: str = "text", description: str = "",
                       tenant: str | None = None) -> Dataset:
        """A new, empty dataset (`kind` "text", or "instruction" for prompt/response pairs);
        upload files to add versions."""
        body: dict[str, Any] = {"name": name, "kind": kind, "description": description}
        if tenant:
            body["tenant"] = tenant
        return Dataset.from_api(self._request("POST", f"{YLINK}/datasets/", json=body))

    def upload_dataset(self, dataset_id: int, path: str | os.PathLike,
                       *, on_progress: Callable[[int, int], None] | None = None
                       ) -> DatasetVersion:
        """Upload a corpus file (.jsonl, .txt/.md, or a .zip of them) as the dataset's next
        version. The file is streamed, never read whole into memory; `on_progress(sent,
        total)` is called as its bytes go out."""
        return self._upload_corpus(f"{YLINK}/datasets/{int(dataset_id)}/upload/", path, {},
                                   on_progress)

    def create_dataset_from_upload(self, name: str, path: str | os.PathLike, *,
                                   kind: str = "text", description: str = "",
                                   tenant: str | None = None,
                                   on_progress: Callable[[int, int], None] | None = None
                                   ) -> DatasetVersion:
        """A new dataset with a corpus file as its first version, in one request: when the
        server refuses the file, no dataset is created."""
        fields = {"name": name, "kind": kind, "description": description}
        if tenant:
            fields["tenant"] = tenant
        return self._upload_corpus(f"{YLINK}/datasets/upload/", path, fields, on_progress)

    def _upload_corpus(self, url: str, path: str | os.PathLike, fields: dict[str, str],
                       on_progress: Callable[[int, int], None] | None) -> DatasetVersion:
        path = Path(path)
        try:
            stream = path.open("rb")
        except OSError as exc:
            raise OgaiError("bad_file", f"cannot read {path}: {exc.strerror or exc}") from None
        with stream:
            if not path.is_file():
                raise OgaiError("bad_file", f"{path} is not a file")
            reader = ProgressReader(stream, on_progress)
            timeout = httpx.Timeout(self.timeout, read=max(self.timeout, UPLOAD_READ_TIMEOUT_S))
            data = self._request(
                "POST", url, timeout=timeout, data=fields or None,
                files={"file": (path.name, reader, "application/octet-stream")})
        return DatasetVersion.from_api(data)

    def dataset_versions(self, *, dataset: int | None = None,
                         format: str | None = None) -> list[DatasetVersion]:
        """Versions you can see (of one dataset, by its id), every page."""
        params = {name: value for name, value in (("dataset", dataset), ("format", format))
                  if value is not None}
        return self._all(f"{YLINK}/dataset-versions/", params, DatasetVersion.from_api,
                         key=lambda v: v.id)

    def dataset_version(self, version_id: int) -> DatasetVersion:
        return DatasetVersion.from_api(
            self._request("GET", f"{YLINK}/dataset-versions/{int(version_id)}/"))

    def dataset_samples(self, version_id: int, *, offset: int = 0,
                        limit: int = 10) -> Page[Sample]:
        """Documents `offset` to `offset + limit` of a version (the server allows at most
        100 a page); `count` is the version's number of documents."""
        data = self._request("GET", f"{YLINK}/dataset-versions/{int(version_id)}/samples/",
                             params={"offset": offset, "limit": limit})
        return Page(count=data.get("count", 0), offset=data.get("offset", offset),
                    results=[Sample.from_api(item) for item in data.get("results") or []])

    # -- YLink: pipelines -------------------------------------------------------------------

    def pipeline_steps(self) -> list[dict]:
        """The step catalogue: each step type, its description, and its parameters with type,
        default and range."""
        data = self._request("GET", f"{YLINK}/pipeline-steps/")
        if not isinstance(data, list):
            raise OgaiError("bad_response", "the server answered no step catalogue; is this "
                            "OGAI?")
        return data

    def start_pipeline(self, spec: dict) -> PipelineRun:
        """Start a data pipeline (see POST /api/v1/ylink/pipeline-runs/): `dataset_version`
        (an id) or `dataset` (a name, with `version` for an older one), `steps` (a step may be
        just its type name), `replicas`, `queue`, `resources` (`memory` may be "4Gi")."""
        body = run_body(spec)
        if isinstance(body.get("steps"), list):
            body["steps"] = [{"type": step} if isinstance(step, str) else step
                             for step in body["steps"]]
        return PipelineRun.from_api(self._request("POST", f"{YLINK}/pipeline-runs/", json=body))

    def pipeline_runs(self, *, tenant: str | None = None,
                      dataset: int | None = None) -> list[PipelineRun]:
        """Pipeline runs you can see, newest first, every page."""
        params = {name: value for name, value in (("tenant", tenant), ("dataset", dataset))
                  if value}
        return self._all(f"{YLINK}/pipeline-runs/", params, PipelineRun.from_api,
                         key=lambda run: run.id)

    def pipeline_run(self, run_id: int) -> PipelineRun:
        return PipelineRun.from_api(self._request("GET", f"{YLINK}/pipeline-runs/{int(run_id)}/"))

    def cancel_pipeline_run(self, run_id: int) -> PipelineRun:
        return PipelineRun.from_api(
            self._request("POST", f"{YLINK}/pipeline-runs/{int(run_id)}/cancel/"))

    def wait_pipeline_run(self, run_id: int, *, poll_s: float = 2.0,
                          timeout_s: float | None = None) -> PipelineRun:
        """Poll until the run ends (succeeded, failed or cancelled) and return it."""
        return self._wait(lambda: self.pipeline_run(run_id), f"pipeline run {run_id}",
                          poll_s, timeout_s)

    # -- YLink: training --------------------------------------------------------------------

    def start_training(self, spec: dict) -> TrainingRun:
        """Start a training run (see POST /api/v1/ylink/training-runs/): `kind` (tokenizer,
        pretrain, sft, lora, prompt_tuning, multitask_prompt_tuning), the dataset version as
        for a pipeline, `model`, `tokenizer`, `lora`, `prompt_tuning`, `training`, `base_run`,
        `replicas`, `resources` (`memory` may be "16Gi")."""
        return TrainingRun.from_api(
            self._request("POST", f"{YLINK}/training-runs/", json=run_body(spec)))

    def start_multitask_prompt_tuning(self, spec: dict) -> tuple[TrainingRun, TrainingRun]:
        """The two-stage recipe of multi-task prompt tuning (POST /api/v1/ylink/training-runs/
        multitask-prompt-tuning/): `base_run`, `source` and `target` (each `dataset_version`,
        or `dataset` and `version`), `prompt_tuning`, `source_training`, `target_training`,
        `target_init`, `source_task`, `replicas`, `resources`. Returns (source, target): the
        target's job starts once the source succeeded."""
        body = self._request("POST", f"{YLINK}/training-runs/multitask-prompt-tuning/",
                             json=run_body(spec))
        return TrainingRun.from_api(body["source"]), TrainingRun.from_api(body["target"])

    def training_runs(self, *, tenant: str | None = None, kind: str | None = None,
                      succeeded: bool | None = None,
                      search: str | None = None) -> list[TrainingRun]:
        """Training runs you can see, newest first, every page."""
        params: dict[str, Any] = {name: value for name, value in
                                  (("tenant", tenant), ("kind", kind), ("q", search)) if value}
        if succeeded is not None:
            params["succeeded"] = "true" if succeeded else "false"
        return self._all(f"{YLINK}/training-runs/", params, TrainingRun.from_api,
                         key=lambda run: run.id)

    def training_run(self, run_id: int) -> TrainingRun:
        return TrainingRun.from_api(self._request("GET", f"{YLINK}/training-runs/{int(run_id)}/"))

    def training_metrics(self, run_id: int, *, after_step: int | None = None
                         ) -> list[TrainingMetric]:
        """The run's logged metrics in step order (only steps after `after_step`)."""
        params = {} if after_step is None else {"after_step": after_step}
        data = self._request("GET", f"{YLINK}/training-runs/{int(run_id)}/metrics/",
                             params=params)
        return [TrainingMetric.from_api(item) for item in _rows(data)]

    def training_checkpoints(self, run_id: int) -> list[Checkpoint]:
        """The run's checkpoints, newest first."""
        data = self._request("GET", f"{YLINK}/training-runs/{int(run_id)}/checkpoints/")
        return [Checkpoint.from_api(item) for item in _rows(data)]

    def cancel_training_run(self, run_id: int) -> TrainingRun:
        return TrainingRun.from_api(
            self._request("POST", f"{YLINK}/training-runs/{int(run_id)}/cancel/"))

    def wait_training_run(self, run_id: int, *, poll_s: float = 5.0,
                          timeout_s: float | None = None) -> TrainingRun:
        """Poll until the run ends (succeeded, failed or cancelled) and return it."""
        return self._wait(lambda: self.training_run(run_id), f"training run {run_id}",
                          poll_s, timeout_s)

    def _wait(self, fetch: Callable[[], R], what: str, poll_s: float,
              timeout_s: float | None) -> R:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = fetch()
            if run.is_final:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise OgaiError("timeout", f"{what} is still {run.state} after "
                                f"{timeout_s:g} s")
            time.sleep(poll_s)


    # -- MModel: models and versions ----------------------------------------------------------

    def models(self, *, tenant: str | None = None, name: str | None = None,
               search: str | None = None) -> list[Model]:
        """Models of your tenants, every page."""
        params = {key: value for key, value in
                  (("tenant", tenant), ("name", name), ("q", search)) if value}
        return self._all(f"{MMODEL}/models/", params, Model.from_api, key=lambda m: m.id)

    def model(self, model_id: int) -> Model:
        return Model.from_api(self._request("GET", f"{MMODEL}/models/{int(model_id)}/"))

    def find_model(self, name: str, *, tenant: str | None = None) -> Model | None:
        """The model called `name` (in `tenant`), or None. Raises when several of your tenants
        have one of that name and no tenant is given."""
        return _one_named(self.models(tenant=tenant, name=name), name, "model")

    def create_model(self, name: str, *, description: str = "",
                     tenant: str | None = None) -> Model:
        """A new model without versions; import a folder or register a run to add one."""
        body: dict[str, Any] = {"name": name, "description": description}
        if tenant:
            body["tenant"] = tenant
        return Model.from_api(self._request("POST", f"{MMODEL}/models/", json=body))

    def import_model(self, model: str, source_path: str, *, allow_pickle: bool = False,
                     tenant: str | None = None, description: str = "") -> ModelImport:
        """Import a folder (or .gguf file) below an import root of the server as the next
        version of the model named `model` (created with the import when new). Quick checks
        (the path, remote code, pickle, config, tokenizer) answer at once as an OgaiError; the
        rest (loading the weights, the copy) runs on the server: follow it with
        `model_import(id)` or `wait_model_import(id)`."""
        body: dict[str, Any] = {"model": model, "source_path": str(source_path),
                                "allow_pickle": allow_pickle, "description": description}
        if tenant:
            body["tenant"] = tenant
        return ModelImport.from_api(self._request("POST", f"{MMODEL}/model-imports/",
                                                  json=body))

    def model_import(self, import_id: int) -> ModelImport:
        return ModelImport.from_api(self._request("GET",
                                                  f"{MMODEL}/model-imports/{int(import_id)}/"))

    def model_imports(self, *, model: int | None = None, tenant: str | None = None,
                      state: str | None = None) -> list[ModelImport]:
        params = {key: value for key, value in
                  (("model", model), ("tenant", tenant), ("state", state)) if value}
        return self._all(f"{MMODEL}/model-imports/", params, ModelImport.from_api,
                         key=lambda i: i.id)

    def wait_model_import(self, import_id: int, *, poll_s: float = 1.0,
                          timeout_s: float | None = None) -> ModelImport:
        """Poll until the import succeeded or failed and return it."""
        return self._poll(lambda: self.model_import(import_id), f"import {import_id}", poll_s,
                          timeout_s)

    def model_versions(self, *, model: int | None = None, model_name: str | None = None,
                       tenant: str | None = None, status: str | None = None,
                       training_run: int | None = None) -> list[ModelVersion]:
        """Versions you can see (without files and lineage), every page."""
        params = {key: value for key, value in
                  (("model", model), ("model_name", model_name), ("tenant", tenant),
                   ("status", status), ("training_run", training_run)) if value}
        return self._all(f"{MMODEL}/model-versions/", params, ModelVersion.from_api,
                         key=lambda v: v.id)

    def model_version(self, version_id: int) -> ModelVersion:
        """A version with its files and lineage."""
        return ModelVersion.from_api(
            self._request("GET", f"{MMODEL}/model-versions/{int(version_id)}/"))

    def find_version(self, ref: str, *, tenant: str | None = None) -> ModelVersion:
        """A version by reference: "tiny:v2" (or "tiny:2"), or "tiny" for its newest ready
        version. Raises OgaiError "not_found" (or "ambiguous" across tenants)."""
        name, number = parse_version_ref(ref)
        versions = self.model_versions(model_name=name, tenant=tenant)
        tenants = sorted({v.tenant for v in versions})
        if len(tenants) > 1:
            raise OgaiError("ambiguous", f"several of your tenants have a model {name!r} "
                            f"({', '.join(tenants)}): name the tenant")
        if number is not None:
            found = [v for v in versions if v.number == number]
            if not found:
                raise OgaiError("not_found", f"model version {name}:v{number} not found (or "
                                f"not visible to you); `ogai model show {name}` lists its "
                                "versions", status=404)
            return found[0]
        if not versions:
            raise OgaiError("not_found", f"model {name} not found (or not visible to you); "
                            "`ogai model list` shows yours", status=404)
        ready = sorted((v for v in versions if v.status == "ready"), key=lambda v: -v.number)
        if not ready:
            newest = max(versions, key=lambda v: v.number)
            raise OgaiError("not_ready", f"model {name} has no ready version ({newest.label} "
                            f"is {newest.status}); name one as {name}:vN")
        return ready[0]

    def register_version(self, training_run: int, model: str, *,
                         description: str = "") -> ModelVersion:
        """Register a finished training run's output as the next version of `model` (in the
        run's tenant; created when missing), with its lineage."""
        return ModelVersion.from_api(self._request(
            "POST", f"{MMODEL}/model-versions/register/",
            json={"training_run": int(training_run), "model": model,
                  "description": description}))

    def delete_version(self, version_id: int) -> None:
        self._request("DELETE", f"{MMODEL}/model-versions/{int(version_id)}/")

    # -- MModel: benchmarks and evaluation ----------------------------------------------------

    def benchmarks(self, *, tenant: str | None = None, kind: str | None = None,
                   search: str | None = None) -> list[Benchmark]:
        """Your tenants' benchmarks and the shared ones, every page."""
        params = {key: value for key, value in
                  (("tenant", tenant), ("kind", kind), ("q", search)) if value}
        return self._all(f"{MMODEL}/benchmarks/", params, Benchmark.from_api,
                         key=lambda b: b.id)

    def benchmark(self, benchmark_id: int) -> Benchmark:
        """A benchmark with a preview of its first documents as the model is asked them."""
        return Benchmark.from_api(self._request("GET",
                                                f"{MMODEL}/benchmarks/{int(benchmark_id)}/"))

    def upload_benchmark(self, path: str | os.PathLike, *, name: str, kind: str,
                         tenant: str | None = None, description: str = "",
                         prompt_template: str = "", target_template: str = "",
                         choices_template: str = "", text_field: str = "", few_shot: int = 0,
                         metrics: list[str] | None = None,
                         generation_kwargs: dict | None = None) -> Benchmark:
        """Upload a JSONL file as a benchmark (`kind`: multiple_choice, generation,
        perplexity or retrieval). The server checks every document against the templates (a
        retrieval file: its passages and queries): a mistake is an OgaiError naming the field
        and the line."""
        path = Path(path)
        fields: dict[str, str | list[str]] = {"name": name, "kind": kind,
                                              "description": description,
                                              "few_shot": str(int(few_shot))}
        for key, value in (("tenant", tenant), ("prompt_template", prompt_template),
                           ("target_template", target_template),
                           ("choices_template", choices_template), ("text_field", text_field)):
            if value:
                fields[key] = value
        if generation_kwargs is not None:
            fields["generation_kwargs"] = json.dumps(generation_kwargs)
        if metrics:
            fields["metrics"] = [str(metric) for metric in metrics]
        try:
            stream = path.open("rb")
        except OSError as exc:
            raise OgaiError("bad_file", f"cannot read {path}: {exc.strerror or exc}") from None
        with stream:
            if not path.is_file():
                raise OgaiError("bad_file", f"{path} is not a file")
            timeout = httpx.Timeout(self.timeout, read=max(self.timeout, UPLOAD_READ_TIMEOUT_S))
            data = self._request("POST", f"{MMODEL}/benchmarks/", timeout=timeout, data=fields,
                                 files={"file": (path.name, stream, "application/jsonl")})
        return Benchmark.from_api(data)

    def start_evaluation(self, version: int, benchmarks: Iterable[str | int], *,
                         tenant: str | None = None, queue: str | None = None,
                         name: str = "", limit: int | None = None,
                         deployment: int | None = None, gpus: int = 0) -> EvaluationRun:
        """Score a version (its id) on benchmarks (ids or names) in a job of `queue`; with
        `deployment` (an id) its endpoint is scored instead of the weights."""
        body: dict[str, Any] = {"version": int(version),
                                "benchmarks": [str(b) for b in benchmarks], "name": name,
                                "gpus": gpus}
        for key, value in (("tenant", tenant), ("queue", queue), ("limit", limit),
                           ("deployment", deployment)):
            if value is not None:
                body[key] = value
        return EvaluationRun.from_api(self._request("POST", f"{MMODEL}/evaluation-runs/",
                                                    json=body))

    def evaluation_runs(self, *, tenant: str | None = None, version: int | None = None,
                        model: int | None = None) -> list[EvaluationRun]:
        """Evaluation runs you can see, newest first, every page."""
        params = {key: value for key, value in
                  (("tenant", tenant), ("version", version), ("model", model)) if value}
        return self._all(f"{MMODEL}/evaluation-runs/", params, EvaluationRun.from_api,
                         key=lambda run: run.id)

    def evaluation_run(self, run_id: int) -> EvaluationRun:
        return EvaluationRun.from_api(
            self._request("GET", f"{MMODEL}/evaluation-runs/{int(run_id)}/"))

    def cancel_evaluation_run(self, run_id: int) -> EvaluationRun:
        return EvaluationRun.from_api(
            self._request("POST", f"{MMODEL}/evaluation-runs/{int(run_id)}/cancel/"))

    def wait_evaluation_run(self, run_id: int, *, poll_s: float = 2.0,
                            timeout_s: float | None = None) -> EvaluationRun:
        """Poll until the run ends (succeeded, failed or cancelled) and return it."""
        return self._poll(lambda: self.evaluation_run(run_id), f"evaluation run {run_id}",
                          poll_s, timeout_s)

    def evaluation_samples(self, run_id: int, *, benchmark: int | None = None,
                           offset: int = 0, limit: int = 20) -> Page[EvaluationSample]:
        """Documents of a run as the model answered them (of one benchmark, by its id)."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        if benchmark is not None:
            params["benchmark"] = benchmark
        data = self._request("GET", f"{MMODEL}/evaluation-runs/{int(run_id)}/samples/",
                             params=params)
        return Page(count=data.get("count", 0), offset=offset,
                    results=[EvaluationSample.from_api(item) for item in _rows(data)])

    def compare_evaluation_runs(self, run_id: int, other: int, *, benchmark: int,
                                offset: int = 0, limit: int = 50) -> list[dict]:
        """The same documents answered by two runs: [{"index", "prompt", "target", "a": {...},
        "b": {...}}]."""
        return _rows(self._request(
            "GET", f"{MMODEL}/evaluation-runs/{int(run_id)}/compare/",
            params={"other": other, "benchmark": benchmark, "offset": offset, "limit": limit}))

    def leaderboard(self, *, tenant: str | None = None) -> list[LeaderboardRow]:
        """Per version of a tenant, its newest succeeded scores."""
        params = {"tenant": tenant} if tenant else {}
        return [LeaderboardRow.from_api(row) for row in
                _rows(self._request("GET", f"{MMODEL}/leaderboard/", params=params))]

    # -- MModel: deployments ------------------------------------------------------------------

    def deployments(self, *, tenant: str | None = None) -> list[Deployment]:
        params = {"tenant": tenant} if tenant else {}
        return self._all(f"{MMODEL}/deployments/", params, Deployment.from_api,
                         key=lambda d: d.id)

    def deployment(self, deployment_id: int) -> Deployment:
        return Deployment.from_api(
            self._request("GET", f"{MMODEL}/deployments/{int(deployment_id)}/"))

    def find_deployment(self, name: str, *, tenant: str | None = None) -> Deployment:
        """The deployment called `name` (in `tenant`); OgaiError "not_found" when there is
        none, "ambiguous" when several of your tenants have one and no tenant is given."""
        found = _one_named(self.deployments(tenant=tenant), name, "deployment")
        if found is None:
            where = f" in tenant {tenant}" if tenant else ""
            raise OgaiError("not_found", f"deployment {name}{where} not found (or not visible "
                            "to you); `ogai deploy list` shows yours", status=404)
        return found

    def create_deployment(self, name: str, version: int, *, tenant: str | None = None,
                          queue: str | None = None, runtime: str | None = None,
                          replicas: int | None = None, gpus_per_replica: int | None = None,
                          gpu_model: str | None = None, cpu_per_replica: float | None = None,
                          memory_mib_per_replica: int | None = None,
                          idle_timeout_s: int | None = None,
                          pool: dict[str, int] | None = None,
                          pool_memory_mib: int | None = None,
                          max_loras: int | None = None) -> Deployment:
        """Deploy a version (its id) as `name` at the gateway: `replicas` service jobs of
        `queue`; with `pool` (model name -> version id) each replica serves those versions
        too. What is left out takes the server's default."""
        body: dict[str, Any] = {"name": name, "version": int(version)}
        if pool:
            body["pool"] = [{"name": key, "version": int(value)} for key, value in pool.items()]
        for key, value in (("tenant", tenant), ("queue", queue), ("runtime", runtime),
                           ("replicas", replicas), ("gpus_per_replica", gpus_per_replica),
                           ("gpu_model", gpu_model), ("cpu_per_replica", cpu_per_replica),
                           ("memory_mib_per_replica", memory_mib_per_replica),
                           ("idle_timeout_s", idle_timeout_s),
                           ("pool_memory_mib", pool_memory_mib), ("max_loras", max_loras)):
            if value is not None:
                body[key] = value
        return Deployment.from_api(self._request("POST", f"{MMODEL}/deployments/", json=body))

    def add_to_pool(self, deployment_id: int, name: str, version: int) -> Deployment:
        """Serve version `version` in the pool as `name`; its running replicas start again."""
        return Deployment.from_api(self._request(
            "POST", f"{MMODEL}/deployments/{deployment_id}/pool/",
            json={"name": name, "version": int(version)}))

    def remove_from_pool(self, deployment_id: int, name: str) -> Deployment:
        return Deployment.from_api(self._request(
            "DELETE", f"{MMODEL}/deployments/{deployment_id}/pool/{name}/"))

    def scale_deployment(self, deployment_id: int, replicas: int) -> Deployment:
        return Deployment.from_api(self._request(
            "POST", f"{MMODEL}/deployments/{int(deployment_id)}/scale/",
            json={"replicas": replicas}))

    def stop_deployment(self, deployment_id: int) -> Deployment:
        return Deployment.from_api(
            self._request("POST", f"{MMODEL}/deployments/{int(deployment_id)}/stop/"))

    def start_deployment(self, deployment_id: int) -> Deployment:
        return Deployment.from_api(
            self._request("POST", f"{MMODEL}/deployments/{int(deployment_id)}/start/"))

    def delete_deployment(self, deployment_id: int) -> None:
        self._request("DELETE", f"{MMODEL}/deployments/{int(deployment_id)}/")

    def deployment_stats(self, deployment_id: int, *, minutes: int = 60
                         ) -> list[DeploymentStat]:
        """Per minute of the last `minutes`: requests, errors, tokens, latency."""
        return [DeploymentStat.from_api(row) for row in _rows(self._request(
            "GET", f"{MMODEL}/deployments/{int(deployment_id)}/stats/",
            params={"minutes": minutes}))]

    # -- PODsys: nodes and health checks ------------------------------------------------------

    def nodes(self, *, cluster: str | None = None, name: str | None = None,
              health: str | None = None) -> list[Node]:
        """Nodes of the clusters you may run on (of one cluster, by its name), every page,
        with their GPUs allocated and their health."""
        params = {key: value for key, value in
                  (("cluster", cluster), ("name", name), ("health", health)) if value}
        found = self._all(f"{PODSYS}/nodes/", params, Node.from_api, key=lambda n: n.id)
        # The list may not filter by name: only that name, exactly.
        return [node for node in found if not name or node.name == name]

    def cluster_environments(self, cluster: str) -> list[ClusterEnvironment]:
        """The named environments a cluster offers jobs, the default first (for platform
        admins and tenants with a queue on it)."""
        return [ClusterEnvironment.from_api(row) for row in _rows(self._request(
            "GET", f"{PODSYS}/clusters/{quote(cluster, safe='')}/environments/"))]

    def node(self, node_id: int) -> Node:
        return Node.from_api(self._request("GET", f"{PODSYS}/nodes/{int(node_id)}/"))

    def find_node(self, name: str, *, cluster: str | None = None) -> Node:
        """The node called `name` (in `cluster`); OgaiError "not_found" when there is none,
        "ambiguous" when several clusters have one and no cluster is given."""
        found = self.nodes(cluster=cluster, name=name)
        if len(found) > 1:
            clusters = ", ".join(sorted(node.cluster for node in found))
            raise OgaiError("ambiguous", f"several clusters have a node {name!r} ({clusters}): "
                            "name the cluster (--cluster)")
        if not found:
            where = f" in cluster {cluster}" if cluster else ""
            raise OgaiError("not_found", f"node {name}{where} not found (or not visible to "
                            "you); `ogai node list` shows the nodes", status=404)
        return found[0]

    def cordon_node(self, node_id: int, *, reason: str = "") -> Node:
        """Take a node out of service (platform admins): running work stays, nothing new is
        placed there, and passing health checks never put it back."""
        return Node.from_api(self._request("POST", f"{PODSYS}/nodes/{int(node_id)}/cordon/",
                                           json={"reason": reason}))

    def uncordon_node(self, node_id: int) -> Node:
        return Node.from_api(self._request("POST", f"{PODSYS}/nodes/{int(node_id)}/uncordon/"))

    def check_node(self, node_id: int, check: str | None = None) -> list[HealthCheckRun]:
        """Run a health check on a node now (platform admins); without `check`, every
        single-node check. Returns the runs, pending until they start (a check already pending
        or running there is returned rather than started twice)."""
        data = self._request("POST", f"{PODSYS}/nodes/{int(node_id)}/check/",
                             json={"check": check or ""})
        return [HealthCheckRun.from_api(item) for item in _rows(data)]

    def node_metrics(self, node_id: int, *, names: Iterable[str] | None = None,
                     since_s: int | None = None) -> dict[str, dict[str, list[tuple[float,
                                                                                  float]]]]:
        """A node's metrics over the last `since_s` seconds (server default 3600): {metric:
        {GPU index (or CPU mode, device, ""): [(unix time, value), ...]}}; `names` are DCGM
        or node-exporter names (default: every metric the platform knows)."""
        params: dict[str, Any] = {}
        if names:
            params["names"] = ",".join(names)
        if since_s is not None:
            params["since"] = int(since_s)
        data = self._request("GET", f"{PODSYS}/nodes/{int(node_id)}/metrics/", params=params)
        if not isinstance(data, dict):
            raise OgaiError("bad_response", "the server answered no metrics; is this OGAI?")
        return {str(name): {str(key): [(float(p[0]), float(p[1])) for p in points
                                       if isinstance(p, list | tuple) and len(p) == 2]
                            for key, points in (series or {}).items()}
                for name, series in data.items() if isinstance(series, dict)}

    def health_check_types(self) -> list[HealthCheckType]:
        """The checks the platform runs, in the order they are configured."""
        return [HealthCheckType.from_api(item) for item in
                _rows(self._request("GET", f"{PODSYS}/health-check-types/"))]

    def health_check_runs(self, *, node: int | None = None, check_name: str | None = None,
                          state: str | None = None, cluster: str | None = None,
                          limit: int | None = 50) -> list[HealthCheckRun]:
        """Health check runs, newest first: the newest `limit`, or every page with None (the
        history is long)."""
        params = {key: value for key, value in
                  (("node", node), ("check_name", check_name), ("state", state),
                   ("cluster", cluster)) if value}
        if limit is None:
            return self._all(f"{PODSYS}/health-checks/", params, HealthCheckRun.from_api,
                             key=lambda run: run.id)
        return self._page(f"{PODSYS}/health-checks/", params, HealthCheckRun.from_api,
                          limit=limit, offset=0).results

    def health_check_run(self, run_id: int) -> HealthCheckRun:
        return HealthCheckRun.from_api(
            self._request("GET", f"{PODSYS}/health-checks/{int(run_id)}/"))

    def node_health(self, node_id: int) -> dict[str, HealthCheckRun | None]:
        """Each configured check's newest run on the node (None: never run there), in the
        order the checks are configured."""
        latest: dict[str, HealthCheckRun | None] = {}
        for check in self.health_check_types():
            runs = self.health_check_runs(node=node_id, check_name=check.name, limit=1)
            latest[check.name] = runs[0] if runs else None
        return latest

    # -- PODsys: stack profiles and deployment runs -------------------------------------------

    def stack_profiles(self) -> list[StackProfile]:
        """The software-stack profiles (shown to platform admins; everyone else sees none)."""
        return self._all(f"{PODSYS}/stack-profiles/", {}, StackProfile.from_api,
                         key=lambda p: p.id)

    def stack_profile(self, name: str) -> StackProfile:
        return StackProfile.from_api(
            self._request("GET", f"{PODSYS}/stack-profiles/{quote(name, safe='')}/"))

    def create_stack_profile(self, profile: dict) -> StackProfile:
        """A new profile from its fields (name, driver_version, cuda_version, …); the server
        checks it against the compatibility matrix and names the field it refuses."""
        if not isinstance(profile, dict):
            raise OgaiError("invalid", "a stack profile is a mapping of fields (name, "
                            "driver_version, cuda_version, …)")
        return StackProfile.from_api(self._request("POST", f"{PODSYS}/stack-profiles/",
                                                   json=profile))

    def deployment_run_page(self, *, cluster: str | None = None, state: str | None = None,
                            profile: str | None = None, limit: int = 50,
                            offset: int = 0) -> Page[DeploymentRun]:
        """One page of deployment runs, newest first (platform admins; others see none)."""
        params = {key: value for key, value in
                  (("cluster", cluster), ("state", state), ("profile", profile)) if value}
        return self._page(f"{PODSYS}/deployment-runs/", params, DeploymentRun.from_api,
                          limit=limit, offset=offset)

    def deployment_runs(self, *, cluster: str | None = None, state: str | None = None,
                        profile: str | None = None) -> list[DeploymentRun]:
        """Deployment runs, newest first, every page."""
        params = {key: value for key, value in
                  (("cluster", cluster), ("state", state), ("profile", profile)) if value}
        return self._all(f"{PODSYS}/deployment-runs/", params, DeploymentRun.from_api,
                         key=lambda run: run.id)

    def deployment_run(self, run_id: int) -> DeploymentRun:
        return DeploymentRun.from_api(
            self._request("GET", f"{PODSYS}/deployment-runs/{int(run_id)}/"))

    def deploy_stack(self, profile: str, *, cluster: str, hosts: Iterable[str],
                     check_mode: bool = False,
                     extra_vars: dict | None = None) -> DeploymentRun:
        """Queue a deployment of the profile (its name) to nodes (names) of a cluster;
        `check_mode` reports what would change and changes nothing."""
        body: dict[str, Any] = {"cluster": cluster, "profile": profile, "hosts": list(hosts),
                                "check_mode": bool(check_mode)}
        if extra_vars:
            body["extra_vars"] = dict(extra_vars)
        return DeploymentRun.from_api(self._request("POST", f"{PODSYS}/deployment-runs/",
                                                    json=body))

    def rerun_failed_deployment_run(self, run_id: int) -> DeploymentRun:
        """A new run of an ended run on only its nodes that failed or were unreachable."""
        return DeploymentRun.from_api(self._request(
            "POST", f"{PODSYS}/deployment-runs/{int(run_id)}/rerun-failed/"))

    def cancel_deployment_run(self, run_id: int) -> DeploymentRun:
        return DeploymentRun.from_api(
            self._request("POST", f"{PODSYS}/deployment-runs/{int(run_id)}/cancel/"))

    def deployment_run_results(self, run_id: int) -> DeploymentGrid:
        """The run's task results as a grid: a row per node, a cell per task."""
        data = self._request("GET", f"{PODSYS}/deployment-runs/{int(run_id)}/results/")
        if not isinstance(data, dict):
            raise OgaiError("bad_response", "the server answered no results; is this OGAI?")
        return DeploymentGrid.from_api(data)

    def wait_deployment_run(self, run_id: int, *, poll_s: float = 2.0,
                            timeout_s: float | None = None) -> DeploymentRun:
        """Poll until the run ends (succeeded, failed or cancelled) and return it."""
        return self._poll(lambda: self.deployment_run(run_id), f"deployment run {run_id}",
                          poll_s, timeout_s)

    # -- the gateway (OpenAI-compatible, at /v1/) ---------------------------------------------

    def gateway_models(self) -> list[dict]:
        """The models your token may call at the gateway: [{"id", "owned_by", …}]."""
        data = self._gateway("GET", "/models")
        return _rows(data.get("data") if isinstance(data, dict) else data)

    def chat(self, model: str, messages: list[dict], *, temperature: float | None = None,
             max_tokens: int | None = None, **extra: Any) -> str:
        """The answer of `model` (a deployment's name) to `messages`, whole."""
        body = _chat_body(model, messages, temperature, max_tokens, stream=False, **extra)
        data = self._gateway("POST", "/chat/completions", json=body)
        try:
            return data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise OgaiError("bad_response", f"the gateway answered no message for {model}; "
                            "is this OGAI?") from None

    def chat_stream(self, model: str, messages: list[dict], *,
                    temperature: float | None = None, max_tokens: int | None = None,
                    **extra: Any) -> Iterator[str]:
        """The answer of `model` to `messages` streamed: yields its text as each piece arrives
        (server-sent events). The gateway's refusals (404 model_not_found, 429 with Retry-After,
        503 while the model starts) raise OgaiError with the gateway's code and message."""
        body = _chat_body(model, messages, temperature, max_tokens, stream=True, **extra)
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, GENERATION_READ_TIMEOUT_S))
        try:
            with self._http.stream("POST", f"{GATEWAY}/chat/completions", json=body,
                                   timeout=timeout,
                                   headers={"Accept": "text/event-stream"}) as response:
                if response.is_error:
                    response.read()
                    raise _gateway_error(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    yield from _deltas(payload)
        except httpx.TimeoutException:
            raise OgaiError("timeout", f"{model} sent nothing for "
                            f"{GENERATION_READ_TIMEOUT_S:g} s") from None
        except httpx.TransportError as exc:
            raise OgaiError("unreachable", f"the answer of {model} broke off "
                            f"({str(exc) or type(exc).__name__})") from None

    def _gateway(self, method: str, path: str, **kwargs: Any) -> Any:
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, GENERATION_READ_TIMEOUT_S))
        try:
            response = self._http.request(method, f"{GATEWAY}{path}", timeout=timeout, **kwargs)
        except httpx.TimeoutException:
            raise OgaiError("timeout", f"the gateway at {self.url}{GATEWAY}/ did not answer "
                            f"within {GENERATION_READ_TIMEOUT_S:g} s") from None
        except httpx.TransportError as exc:
            raise OgaiError("unreachable", f"cannot connect to {self.url} "
                            f"({str(exc) or type(exc).__name__}); check the URL and that "
                            "the server is running") from None
        if response.is_error:
            raise _gateway_error(response)
        try:
            return response.json()
        except ValueError:
            raise OgaiError("bad_response", f"{response.request.url} did not answer JSON; is "
                            f"{self.url} the OGAI URL?", status=response.status_code) from None

    def _poll(self, fetch: Callable[[], Any], what: str, poll_s: float,
              timeout_s: float | None) -> Any:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            item = fetch()
            if item.is_final:
                return item
            if deadline is not None and time.monotonic() >= deadline:
                raise OgaiError("timeout", f"{what} is still {item.state} after "
                                f"{timeout_s:g} s")
            time.sleep(poll_s)


def _moment(value: Moment) -> str:
    """A time for the log API: text as given ("7d", ISO 8601), a datetime as ISO 8601 (a
    naive one taken as local time), a timedelta as the moment that long ago."""
    if isinstance(value, timedelta):
        return (datetime.now(UTC) - value).isoformat()
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.astimezone()).isoformat()
    return str(value).strip()


def _log_filters(q: str, *, job: int | None, attempt: int | None, replica: int | None,
                 level: str | None, source: str | None, request_id: str | None,
                 since: Moment | None, until: Moment | None) -> dict[str, Any]:
    params: dict[str, Any] = {"q": q or None, "job": job, "attempt": attempt,
                              "replica": replica, "level": level or None,
                              "source": source or None, "request_id": request_id or None,
                              "since": None if since is None else _moment(since),
                              "until": None if until is None else _moment(until)}
    return {name: value for name, value in params.items() if value is not None}


def _one_named(rows: Iterable[Any], name: str, what: str) -> Any:
    """The row called `name`, or None; OgaiError "ambiguous" when several of the caller's
    tenants have one (and no tenant was named)."""
    found = [row for row in rows if row.name == name]
    if len(found) > 1:
        tenants = ", ".join(sorted(row.tenant for row in found))
        raise OgaiError("ambiguous", f"several of your tenants have a {what} {name!r} "
                        f"({tenants}): name the tenant")
    return found[0] if found else None


def parse_version_ref(ref: str) -> tuple[str, int | None]:
    """"tiny:v2" or "tiny:2" -> ("tiny", 2); "tiny" -> ("tiny", None)."""
    name, _, number = str(ref).strip().partition(":")
    if not number:
        if not name:
            raise OgaiError("usage", "name a model version as MODEL:vN, or MODEL for its "
                            "newest ready version")
        return name, None
    digits = number[1:] if number[:1] in {"v", "V"} else number
    if not name or not digits.isdigit() or int(digits) < 1:
        raise OgaiError("usage", f"{ref!r} is not a model version: write MODEL:vN (e.g. "
                        "tiny:v2), or MODEL for its newest ready version")
    return name, int(digits)


def _chat_body(model: str, messages: list[dict], temperature: float | None,
               max_tokens: int | None, *, stream: bool, **extra: Any) -> dict:
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": stream,
                            **extra}
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def _deltas(payload: str) -> Iterator[str]:
    """The text of one streamed chunk; an error event (the model server broke off) raises."""
    try:
        event = json.loads(payload)
    except ValueError:
        raise OgaiError("bad_response", f"the gateway sent an event that is not JSON: "
                        f"{payload[:80]!r}") from None
    if not isinstance(event, dict):
        return
    if isinstance(event.get("error"), dict):
        raise _openai_error(event["error"], status=None)
    for choice in event.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str) and text:
            yield text


def _openai_error(error: dict, *, status: int | None, retry_after: str | None = None
                  ) -> OgaiError:
    code = str(error.get("code") or error.get("type") or f"http_{status}")
    message = str(error.get("message") or f"the gateway answered HTTP {status}")
    if retry_after and "retry after" not in message.lower():
        message = f"{message.rstrip('.')}; retry after {retry_after} s."
    param = error.get("param")
    return OgaiError(code, message, {str(param): [message]} if param else None, status)


def _gateway_error(response: httpx.Response) -> OgaiError:
    """The gateway's OpenAI-style error (`{"error": {"message", "type", "param", "code"}}`) as
    an OgaiError; the Retry-After of a 429 or 503 goes into its message."""
    try:
        data = response.json()
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        error = {"message": f"{response.request.method} {response.request.url} answered HTTP "
                            f"{response.status_code} {response.reason_phrase}; is the gateway "
                            "at /v1/ of the OGAI URL?"}
    return _openai_error(error, status=response.status_code,
                         retry_after=response.headers.get("retry-after"))


def _rows(data: Any) -> list[dict]:
    """An unpaginated list (or, should the server ever page it, a page's results)."""
    if isinstance(data, dict):
        data = data.get("results")
    return [item for item in data or [] if isinstance(item, dict)]


def run_body(spec: dict) -> dict:
    """A copy of a pipeline or training spec with `resources.memory` ("16Gi") converted to
    `resources.memory_mib`."""
    try:
        body = normalize_spec(spec)
    except SpecError as exc:
        raise OgaiError("invalid", str(exc)) from None
    # The API takes one or the other (a version's id, or a dataset's name and number).
    if body.get("dataset_version") is not None and (body.get("dataset") is not None
                                                    or body.get("version") is not None):
        raise OgaiError("invalid", "dataset_version: give dataset_version (a version's id) or "
                        "dataset (a name, with version for an older one), not both",
                        {"dataset_version": ["give dataset_version or dataset, not both"]})
    return body


class ProgressReader:
    """A binary file that tells `on_progress(sent, total)` how far it has been read: httpx
    streams a multipart body from the file 64 KiB at a time, so bytes read are bytes sent."""

    def __init__(self, stream: IO[bytes],
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self._stream = stream
        self._on_progress = on_progress
        self.total = os.fstat(stream.fileno()).st_size
        self.sent = 0

    @property
    def name(self) -> str:
        return str(getattr(self._stream, "name", "upload"))

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.sent += len(chunk)
        if self._on_progress is not None:
            self._on_progress(self.sent, self.total)
        return chunk

    def fileno(self) -> int:
        # httpx sizes the body by it, so the request has a Content-Length.
        return self._stream.fileno()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._stream.seek(offset, whence)
        self.sent = position
        return position

    def tell(self) -> int:
        return self._stream.tell()
