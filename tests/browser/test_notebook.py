"""A notebook end to end in a real browser: JupyterLab started on the local driver, opened
through the platform's proxy (served by uvicorn, as `make run` serves it), a cell that submits a
job with the SDK, and the job's success seen in the cell's output. Strangers get 404 and the
signed-out are sent to sign in, over HTTP and WebSocket alike."""

import asyncio
import re
import socket
import sys
import threading
import time

import httpx
import pytest
import uvicorn
import websockets.sync.client
from django.conf import settings
from django.test import Client
from playwright.sync_api import Page, expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from aistation.models import Attempt, Job
from aistation.services.notebooks import (
    NotebookNotRunning,
    notebook_proxy_target,
    notebook_start,
)
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from podsys.models import Cluster
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def platform_url():
    """The platform's ASGI application (Django + the notebooks' proxy) under uvicorn."""
    from ogai.asgi import application

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _wait_running(notebook, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            target = notebook_proxy_target(user=notebook.owner, notebook_id=notebook.pk)
            if httpx.get(f"{target.upstream}/notebooks/{notebook.pk}/api/status", timeout=5,
                         headers={"Authorization": f"token {target.token}"}).is_success:
                return
        except (NotebookNotRunning, httpx.HTTPError):
            pass
        time.sleep(0.5)
    raise AssertionError("JupyterLab never answered")


def test_a_notebook_cell_submits_a_job_through_the_sdk_and_sees_it_succeed(
        page: Page, world, tmp_path, settings, platform_url, monkeypatch):
    settings.OGAI_INTERNAL_URL = platform_url
    # Let a refused handshake's redirect (to sign in) show instead of being followed.
    monkeypatch.setattr(websockets.sync.client.reconnect, "process_redirect",
                        lambda self, exc: exc)
    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path / "cluster"), "grace_s": 2})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                              name="explore")
    try:
        schedule_cluster(cluster_id=cluster.pk)
        _wait_running(notebook)
        lab = f"{platform_url}/notebooks/{notebook.pk}/lab"

        # Strangers and the signed-out, over HTTP and WebSocket.
        signed_out = httpx.get(lab)
        assert signed_out.status_code == 302
        assert "/login/?next=" in signed_out.headers["location"]
        stranger = {"Cookie": f"{settings.SESSION_COOKIE_NAME}="
                              f"{_session_cookie(world.beta_member)}"}
        assert httpx.get(lab, headers=stranger).status_code == 404
        ws_url = (platform_url.replace("http", "ws")
                  + f"/notebooks/{notebook.pk}/api/events/subscribe")
        for headers, status in (({}, 302), (stranger, 404)):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url, additional_headers=headers, open_timeout=10).close()
            assert refused.value.response.status_code == status

        # The owner, in a browser: JupyterLab through the proxy, a cell using the SDK.
        page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME,
                                   "value": _session_cookie(world.alpha_member),
                                   "url": platform_url}])
        code = (
            "from ogai_client import OgaiClient\n"
            "client = OgaiClient.from_env()\n"
            "job = client.submit_job({'name': 'from-notebook', 'queue': 'default',\n"
            f"                          'command': ['{sys.executable}', '-c', 'print(42)']}})\n"
            "print('job', job.id, client.wait_job(job.id, poll_s=0.5, timeout_s=120).state)"
        )
        target = notebook_proxy_target(user=notebook.owner, notebook_id=notebook.pk)
        httpx.put(f"{target.upstream}/notebooks/{notebook.pk}/api/contents/submit.ipynb",
                  headers={"Authorization": f"token {target.token}"}, timeout=10, json={
                      "type": "notebook", "format": "json", "content": {
                          "nbformat": 4, "nbformat_minor": 5, "metadata": {
                              "kernelspec": {"name": "python3", "display_name": "Python 3",
                                             "language": "python"}},
                          "cells": [{"cell_type": "code", "source": code, "metadata": {},
                                     "outputs": [], "execution_count": None,
                                     "id": "submit"}]}}).raise_for_status()
        page.goto(f"{lab}/tree/submit.ipynb")
        page.locator(".jp-Notebook:visible .jp-Cell .cm-content").first.click(timeout=60_000)
        # The kernel (over the proxied WebSocket) is up once the toolbar says so.
        expect(page.get_by_role("button", name=re.compile(r"Python 3.*\| Idle"))) \
            .to_be_visible(timeout=60_000)
        page.keyboard.press("Shift+Enter")

        # The job runs on the same cluster: cycles and reconcile play the worker here.
        deadline = time.monotonic() + 120
        output = page.locator(".jp-Notebook:visible .jp-OutputArea-output").first
        while time.monotonic() < deadline:
            schedule_cluster(cluster_id=cluster.pk)
            reconcile_cluster(cluster=cluster)
            if "succeeded" in (output.text_content(timeout=1000) or "") \
                    if output.count() else False:
                break
            time.sleep(0.5)
        expect(output).to_contain_text("succeeded", timeout=5_000)
        job = Job.objects.get(name="from-notebook")
        assert job.owner == world.alpha_member and job.state == "succeeded"
        assert f"job {job.pk} succeeded" in output.text_content()
    finally:  # whatever failed above, no JupyterLab outlives the test
        for attempt in Attempt.objects.filter(cluster=cluster):
            driver_for(cluster).cancel(attempt.workload_id)
