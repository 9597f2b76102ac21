"""Notebooks: sessions as service jobs (quota, queue, GPUs freed on stop), tokens kept out of
sight, and, on the local driver, a real JupyterLab culled when idle and resumed with its home."""

import time
from datetime import timedelta

import httpx
import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Attempt, NotebookPolicy
from aistation.services import scheduling
from aistation.services.jobs import job_cancel
from aistation.services.manifests import job_manifests
from aistation.services.notebooks import (
    NotebookNotFound,
    NotebookNotRunning,
    notebook_cull,
    notebook_delete,
    notebook_home,
    notebook_proxy_target,
    notebook_resume,
    notebook_start,
    notebook_stop,
)
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.workloads import attempt_workload
from infra_os.models import ApiToken
from podsys.models import Cluster
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes


def cycle(cluster):
    return scheduling.schedule_cluster(cluster_id=cluster.pk)


def test_a_notebooks_gpus_count_against_quota_while_it_runs_and_are_freed_when_it_stops(
        farm, world):
    queue = farm.queues["alpha"]
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                              name="explore", gpus=8)
    cycle(farm.cluster)
    notebook.refresh_from_db()
    job = notebook.job
    assert job.state == JobState.RUNNING and job.service and job.gpus == 8
    other = farm.submit(gpus=1)
    cycle(farm.cluster)
    other.refresh_from_db()
    assert other.borrowed  # alpha's 8-GPU quota is the notebook's: the job runs above it

    notebook_stop(actor=world.alpha_member, notebook=notebook)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert ApiToken.objects.get(pk=notebook.sdk_token_id).revoked_at is not None
    after = farm.submit(gpus=4)
    cycle(farm.cluster)
    after.refresh_from_db()
    assert after.state == JobState.RUNNING and not after.borrowed
    assert [e.kind for e in notebook.events.all()] == ["started", "stopped"]


def test_tokens_reach_the_session_only(farm, world):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="explore")
    job = notebook.job
    assert "JUPYTER_TOKEN" not in job.env and "OGAI_TOKEN" not in job.env
    assert "--ServerApp.token" not in " ".join(job.command)
    cycle(farm.cluster)
    workload = attempt_workload(notebook.job.attempts.get())
    assert workload.service and workload.ports
    secrets = workload.secret_env
    assert secrets["JUPYTER_TOKEN"] and secrets["OGAI_TOKEN"].startswith("ogai_")
    # Secrets travel apart from the plain environment, which drivers may write down.
    assert "JUPYTER_TOKEN" not in workload.env and "OGAI_TOKEN" not in workload.env
    assert workload.env["OGAI_URL"].startswith("http")
    assert secrets["JUPYTER_TOKEN"] not in notebook.server_token  # stored encrypted


def test_only_the_owner_opens_a_notebook_and_tenant_admins_manage_it(farm, world):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="explore")
    with pytest.raises(NotebookNotRunning, match="waiting"):
        notebook_proxy_target(user=world.alpha_member, notebook_id=notebook.pk)
    for stranger in (world.beta_member, world.beta_admin, world.alpha_viewer):
        with pytest.raises(NotebookNotFound):
            notebook_proxy_target(user=stranger, notebook_id=notebook.pk)
        with pytest.raises(PermissionDenied):
            notebook_stop(actor=stranger, notebook=notebook)
    cycle(farm.cluster)
    assert notebook_proxy_target(user=world.alpha_member, notebook_id=notebook.pk).token
    # A tenant admin manages it but does not open it: the session acts as its owner.
    with pytest.raises(NotebookNotFound):
        notebook_proxy_target(user=world.alpha_admin, notebook_id=notebook.pk)
    notebook_stop(actor=world.alpha_admin, notebook=notebook)
    with pytest.raises(PermissionDenied):
        notebook_start(actor=world.alpha_viewer, tenant=world.alpha,
                       queue=farm.queues["alpha"], name="peek")


# -- a real JupyterLab on the local driver ---------------------------------------------------------

def _wait_for_server(notebook, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            target = notebook_proxy_target(user=notebook.owner, notebook_id=notebook.pk)
            response = httpx.get(f"{target.upstream}/notebooks/{notebook.pk}/api/status",
                                 headers={"Authorization": f"token {target.token}"}, timeout=5)
            if response.status_code == 200:
                return target
        except (NotebookNotRunning, httpx.HTTPError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"JupyterLab of notebook {notebook.pk} never answered")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_idle_notebook_is_culled_and_resumes_with_its_home(world, tmp_path, settings):
    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path / "cluster"), "grace_s": 2})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)
    NotebookPolicy.objects.create(tenant=world.alpha, idle_timeout_s=600)
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                              name="explore")
    try:
        cycle(cluster)
        target = _wait_for_server(notebook)
        api = f"{target.upstream}/notebooks/{notebook.pk}/api"
        headers = {"Authorization": f"token {target.token}"}
        saved = httpx.put(f"{api}/contents/notes.txt", headers=headers, timeout=10, json={
            "type": "file", "format": "text", "content": "kept across sessions"})
        assert saved.status_code in (200, 201), saved.text
        assert (notebook_home(notebook) / "notes.txt").read_text() == "kept across sessions"

        status = f"{api}/status?no_track_activity=1"
        before = httpx.get(status, headers=headers, timeout=10).json()["last_activity"]
        assert notebook_cull() == []  # just used
        after = httpx.get(status, headers=headers, timeout=10).json()["last_activity"]
        assert after == before  # asking whether it is idle is not activity
        later = timezone.now() + timedelta(minutes=11)
        assert notebook_cull(now=later) == [notebook.pk]
        notebook.refresh_from_db()
        assert notebook.job.state == JobState.CANCELLED
        reconcile_cluster(cluster=cluster)  # stops the server (a worker would at once)
        culled = notebook.events.get(kind="culled")
        assert "idle for 1" in culled.reason and "limit is 10 min" in culled.reason
        assert (notebook_home(notebook) / "notes.txt").exists()

        notebook = notebook_resume(actor=world.alpha_member, notebook=notebook)
        cycle(cluster)
        target = _wait_for_server(notebook)
        again = httpx.get(f"{target.upstream}/notebooks/{notebook.pk}/api/contents/notes.txt",
                          headers={"Authorization": f"token {target.token}"}, timeout=10)
        assert again.json()["content"] == "kept across sessions"
    finally:  # whatever failed above, no JupyterLab outlives the test
        for attempt in Attempt.objects.filter(cluster=cluster):
            driver_for(cluster).cancel(attempt.workload_id)


def test_notebook_homes_count_against_the_tenants_storage_quota(farm, world):
    quota = world.alpha.quota
    quota.storage_gib = 1
    quota.save()
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="explore")
    cycle(farm.cluster)
    home = notebook_home(notebook)
    with (home / "weights.bin").open("wb") as f:
        f.truncate(2**30)  # a sparse GiB: its size counts
    notebook_stop(actor=world.alpha_member, notebook=notebook)
    notebook.refresh_from_db()
    assert notebook.home_bytes >= 2**30
    with pytest.raises(ValidationError, match=r"1\.0 GiB of its 1 GiB storage quota"):
        notebook_resume(actor=world.alpha_member, notebook=notebook)
    (home / "weights.bin").unlink()
    notebook_delete(actor=world.alpha_member, notebook=notebook)
    fresh = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                           queue=farm.queues["alpha"], name="again")
    assert fresh.job.state == JobState.QUEUED


def test_job_logs_count_against_the_tenants_storage_quota(farm, world, log_store,
                                                         monkeypatch):
    from datetime import UTC, datetime

    from aistation.logstore.base import LogLine
    from aistation.selectors_logs import tenant_log_bytes
    from aistation.services import notebooks

    log_store.append([LogLine(ts=datetime.now(UTC), message="x" * 99, tenant_id=tenant.pk,
                              job_id=1, attempt=1, replica=0, line_no=1)
                      for tenant in (world.alpha, world.alpha, world.beta)])
    assert tenant_log_bytes(world.alpha.pk) == 200  # its lines, with their newlines
    quota = world.alpha.quota
    quota.storage_gib = 1
    quota.save()
    # A GiB of lines costs minutes to write: the store's count is read as it would say.
    monkeypatch.setattr(notebooks, "tenant_log_bytes",
                        lambda pk: 2**30 if pk == world.alpha.pk else 0)
    with pytest.raises(ValidationError, match=r"job logs 1\.0 GiB"):
        notebook_start(actor=world.alpha_member, tenant=world.alpha,
                       queue=farm.queues["alpha"], name="explore")
    assert notebook_start(actor=world.beta_member, tenant=world.beta,
                          queue=farm.queues["beta"], name="explore")


def test_rendered_manifests_name_the_session_secrets_but_never_show_them(farm, world):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="explore", image="lab:1")
    cycle(farm.cluster)
    secrets = attempt_workload(notebook.job.attempts.get()).secret_env
    rendered = job_manifests(job=notebook.job)
    assert "JUPYTER_TOKEN" in rendered and "OGAI_TOKEN" in rendered
    assert secrets["JUPYTER_TOKEN"] not in rendered and secrets["OGAI_TOKEN"] not in rendered


def test_a_sessions_sdk_token_is_revoked_however_the_session_ends(farm, world):
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                              queue=farm.queues["alpha"], name="explore")
    cycle(farm.cluster)
    job_cancel(actor=world.alpha_member, job=notebook.job)  # from the job page
    notebook.refresh_from_db()
    assert notebook.sdk_token.revoked_at is None
    notebook_cull()
    notebook.sdk_token.refresh_from_db()
    assert notebook.sdk_token.revoked_at is not None
