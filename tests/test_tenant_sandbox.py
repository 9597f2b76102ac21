"""The tenant boundary where work runs: a member of tenant beta, on the `local` cluster, tries
from a job and from a notebook every way across it that a review found (the data directory, the
database, the secret key, tenant alpha's datasets and workload folders, alpha's notebook's
tokens in /proc and on disk, writes outside its own folders) and fails at each, while its own
checkpoint, home and dataset still work. Real processes, real bubblewrap, a real JupyterLab."""

import hashlib
import json
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from websockets.sync.client import connect

from aistation.choices import FINAL_STATES, JobState
from aistation.models import Attempt
from aistation.services.jobs import job_submit
from aistation.services.notebooks import notebook_home, notebook_proxy_target, notebook_start
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from aistation.services.workloads import job_checkpoint_dir, tenant_uid
from podsys.drivers.base import DataMount
from podsys.models import Cluster
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Run by beta's job and in beta's notebook; prints what each attempt found as one JSON line.
ATTACKS = textwrap.dedent("""
    import hashlib, json, os, pathlib, urllib.request
    targets = json.loads(os.environ.get("TARGETS") or pathlib.Path(TARGETS_FILE).read_text())
    found = {}

    def attempt(name, action):
        try:
            found[name] = "worked: " + str(action())[:300]
        except Exception as exc:
            found[name] = f"refused: {type(exc).__name__} {exc}"[:300]

    data = targets["data_dir"]
    attempt("secret_key", lambda: pathlib.Path(data, "secret_key").read_text())
    attempt("database", lambda: pathlib.Path(targets["database"]).read_bytes()[:16])
    attempt("alpha_dataset", lambda: pathlib.Path(targets["alpha_dataset"]).read_text())
    attempt("alpha_workload", lambda: os.listdir(targets["alpha_workload"]))
    attempt("alpha_state", lambda: pathlib.Path(targets["alpha_workload"],
                                                "workload.json").read_text())
    attempt("alpha_log", lambda: pathlib.Path(targets["alpha_workload"],
                                              "replica-0.log").read_text())
    attempt("alpha_environ", lambda: pathlib.Path(
        f"/proc/{targets['alpha_pid']}/environ").read_bytes())
    attempt("alpha_home", lambda: os.listdir(targets["alpha_home"]))
    attempt("write_usr", lambda: pathlib.Path("/usr/lib/owned").write_text("x"))
    attempt("write_data_dir", lambda: pathlib.Path(data, "owned").write_text("x"))
    attempt("write_dataset", lambda: pathlib.Path(targets["own_dataset"], "x").write_text("x"))
    # Alpha's JupyterLab listens on this machine: without its token it answers nothing.
    attempt("alpha_jupyter", lambda: urllib.request.urlopen(
        targets["alpha_jupyter"], timeout=5).status)
    # Every value of every environment it can read, checked against the token's digest (the
    # attacker is not given the token itself, or its own environment would hold it).
    values = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                entries = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(bytes(1))
            except OSError:
                continue
            values += [entry.partition(b"=")[2] for entry in entries]
    found["alpha_token_in_proc"] = any(
        hashlib.sha256(value).hexdigest() == targets["alpha_token_sha256"] for value in values)
    found["uid"] = os.getuid()
    found["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
    attempt("own_dataset", lambda: pathlib.Path(targets["own_dataset"], "doc.jsonl").read_text())
    own = targets.get("own_folder") or os.environ["OGAI_CHECKPOINT_DIR"]
    attempt("own_folder", lambda: pathlib.Path(own, "mine.txt").write_text("ok"))
    print("ATTACKS " + json.dumps(found))
""")

REFUSED = ("secret_key", "database", "alpha_dataset", "alpha_workload", "alpha_state",
           "alpha_log", "alpha_environ", "alpha_home", "write_usr", "write_data_dir",
           "write_dataset", "alpha_jupyter")


@pytest.fixture
def local(world, tmp_path):
    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path / "cluster"), "grace_s": 2})
    cluster_sync_nodes(cluster=cluster)
    queues = {tenant.name: queue_create(actor=world.operator, tenant=tenant, name="default",
                                        cluster=cluster)
              for tenant in (world.alpha, world.beta)}
    yield cluster, queues
    for attempt in Attempt.objects.filter(cluster=cluster):  # no process outlives the test
        driver_for(cluster).cancel(attempt.workload_id)


def _cycle(cluster):
    reconcile_cluster(cluster=cluster)
    schedule_cluster(cluster_id=cluster.pk)


def _server(notebook, cluster, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _cycle(cluster)
        try:
            target = notebook_proxy_target(user=notebook.owner, notebook_id=notebook.pk)
            response = httpx.get(f"{target.upstream}/notebooks/{notebook.pk}/api/status",
                                 headers={"Authorization": f"token {target.token}"}, timeout=5)
            if response.status_code == 200:
                return target
        except Exception:  # noqa: S110 - not up yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"notebook {notebook.pk} never answered")


def _run_in_kernel(target, notebook, code: str, timeout=60.0) -> str:
    """Run `code` in a new kernel of the notebook, over Jupyter's own protocol, and return
    what it printed."""
    base = f"{target.upstream}/notebooks/{notebook.pk}/api"
    headers = {"Authorization": f"token {target.token}"}
    kernel = httpx.post(f"{base}/kernels", headers=headers, json={}, timeout=30).json()
    url = base.replace("http://", "ws://") + f"/kernels/{kernel['id']}/channels"
    msg_id = uuid.uuid4().hex
    output = ""
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(ws.recv(timeout=timeout))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind == "stream":
                output += message["content"]["text"]
            elif kind == "error":
                output += "\n".join(message["content"]["traceback"])
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                return output
    raise AssertionError(f"the kernel did not finish: {output}")


def _found(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.startswith("ATTACKS "))
    return json.loads(line.removeprefix("ATTACKS "))


def _assert_contained(found: dict, tenant) -> None:
    for attack in REFUSED:
        assert found[attack].startswith("refused"), (attack, found[attack])
    assert found["alpha_token_in_proc"] is False
    assert found["uid"] == tenant_uid(tenant.pk)
    assert found["processes"] <= 8  # its own (bwrap's reaper, itself, Jupyter's kernel)
    assert found["own_dataset"] == 'worked: {"text": "beta\'s own"}\n'
    assert found["own_folder"].startswith("worked"), found["own_folder"]


def test_beta_reaches_nothing_of_alpha_from_a_job_or_a_notebook(world, local):
    cluster, queues = local
    data = Path(settings.DATA_DIR)
    alpha_dataset = data / "datasets" / world.alpha.name / f"1-corpus-{uuid.uuid4().hex[:6]}"
    alpha_dataset.mkdir(parents=True)
    (alpha_dataset / "doc.jsonl").write_text('{"text": "alpha\'s secret corpus"}\n')
    own_dataset = data / "datasets" / world.beta.name / f"2-corpus-{uuid.uuid4().hex[:6]}"
    own_dataset.mkdir(parents=True)
    (own_dataset / "doc.jsonl").write_text('{"text": "beta\'s own"}\n')

    # Alpha's notebook: a JupyterLab holding alpha's tokens.
    alpha_notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha,
                                    queue=queues["alpha"], name="alpha's")
    alpha = _server(alpha_notebook, cluster)
    alpha_notebook.refresh_from_db()
    alpha_attempt = alpha_notebook.job.attempts.get()
    alpha_folder = Path(cluster.options["root"]) / "workloads" / alpha_attempt.workload_id
    state = json.loads((alpha_folder / "workload.json").read_text())
    assert alpha.token.encode() not in (alpha_folder / "workload.json").read_bytes()
    targets = {
        "data_dir": str(data), "database": str(data / "test.sqlite3"),
        "alpha_dataset": str(alpha_dataset / "doc.jsonl"), "alpha_workload": str(alpha_folder),
        "alpha_pid": state["replicas"][0]["pid"], "alpha_home": str(notebook_home(alpha_notebook)),
        "alpha_token_sha256": hashlib.sha256(alpha.token.encode()).hexdigest(),
        "own_dataset": str(own_dataset),
        "alpha_jupyter": f"{alpha.upstream}/notebooks/{alpha_notebook.pk}/api/contents",
    }

    # Beta's job, with its dataset, as a toolchain step gets one.
    job = job_submit(actor=world.beta_member, tenant=world.beta, queue=queues["beta"],
                     name="attacker", command=[sys.executable, "-c", ATTACKS],
                     env={"TARGETS": json.dumps(targets)}, mounts=[DataMount(str(own_dataset))])
    deadline = time.monotonic() + 60
    while job.state not in FINAL_STATES and time.monotonic() < deadline:
        _cycle(cluster)
        job.refresh_from_db()
        time.sleep(0.2)
    log = driver_for(cluster).logs(job.attempts.get().workload_id)
    assert job.state == JobState.SUCCEEDED, log
    _assert_contained(_found(log), world.beta)
    assert (job_checkpoint_dir(job) / "mine.txt").read_text() == "ok"

    # Beta's notebook: the same attempts from a kernel, and its own home to write.
    beta_notebook = notebook_start(actor=world.beta_member, tenant=world.beta,
                                   queue=queues["beta"], name="beta's")
    beta = _server(beta_notebook, cluster)
    home = notebook_home(beta_notebook)
    code = ATTACKS.replace("TARGETS_FILE", repr(str(home / "targets.json")))
    (home / "targets.json").write_text(json.dumps({**targets, "own_folder": str(home)}))
    found = _found(_run_in_kernel(beta, beta_notebook, code))
    # A notebook reads its datasets through the API, not the disk: its sandbox holds its home.
    assert found["own_dataset"].startswith("refused")
    found["own_dataset"] = 'worked: {"text": "beta\'s own"}\n'
    _assert_contained(found, world.beta)
    assert (home / "mine.txt").read_text() == "ok"
