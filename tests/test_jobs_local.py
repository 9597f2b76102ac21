"""Jobs on this machine through the local driver and a real Celery worker: real processes,
real logs, retries, cancel and resume from a checkpoint."""

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aistation.choices import FINAL_STATES, JobState
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.queues import queue_create
from aistation.services.workloads import job_checkpoint_dir
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def local_queue(world, tmp_path):
    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path / "cluster"), "grace_s": 2})
    cluster_sync_nodes(cluster=cluster)
    return queue_create(actor=world.operator, tenant=world.alpha, name="default",
                        cluster=cluster)


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _submit(world, queue, script, **extra):
    return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="script",
                      command=[sys.executable, script], **extra)


def _wait(job, condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if condition(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job.pk} stuck in {job.state}: {job.reason}")


def _processes_of(job_id: int) -> list[int]:
    marker = f"OGAI_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_script_runs_to_success_with_its_output_in_the_logs(
    api, world, local_queue, tmp_path, celery_worker_process
):
    script = _script(tmp_path, "hello.py", """
        import os
        print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])
    """)
    job = _submit(world, local_queue, script)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.SUCCEEDED, job.reason
    seen = [event.to_state for event in job.events.all()]
    assert seen[:3] == ["queued", "admitted", "running"]
    logs = api.as_user(world.alpha_member).get(f"/api/v1/aistation/jobs/{job.pk}/logs/").json()
    assert "hello from rank 0 of 1" in logs["text"]


def test_a_failing_script_is_retried_then_fails_with_its_exit_code(
    world, local_queue, tmp_path, celery_worker_process
):
    script = _script(tmp_path, "fail.py", "import sys\nprint('failing')\nsys.exit(3)\n")
    job = _submit(world, local_queue, script, max_restarts=2)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.FAILED
    assert job.exit_code == 3
    assert "exit code 3" in job.reason
    assert job.attempts.count() == 3


def test_cancel_ends_the_process_group(world, local_queue, tmp_path, celery_worker_process):
    script = _script(tmp_path, "sleepy.py", """
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        time.sleep(600)
    """)
    job = _submit(world, local_queue, script)
    job = _wait(job, lambda j: j.state == JobState.RUNNING and len(_processes_of(j.pk)) >= 2)
    job_cancel(actor=world.alpha_member, job=job)
    deadline = time.monotonic() + 30
    while _processes_of(job.pk) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(job.pk) == []
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    _wait(job, lambda j: j.attempts.get().state == "cancelled")


CHECKPOINTED = """
    import json, os, pathlib, time
    checkpoint = pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"]) / "state.json"
    state = json.loads(checkpoint.read_text()) if checkpoint.exists() else {"step": 0, "total": 0}
    if state["step"]:
        print("resumed from step", state["step"], flush=True)
    while state["step"] < 40:
        state["step"] += 1
        state["total"] += state["step"] ** 2
        tmp = checkpoint.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, checkpoint)
        time.sleep(0.05)
    pathlib.Path(os.environ["RESULT"]).write_text(str(state["total"]))
"""


def test_a_killed_job_resumes_from_its_checkpoint_with_the_same_result(
    world, local_queue, tmp_path, celery_worker_process
):
    script = _script(tmp_path, "count.py", CHECKPOINTED)
    result = tmp_path / "result.txt"
    job = _submit(world, local_queue, script, max_restarts=1, env={"RESULT": str(result)})
    checkpoint = job_checkpoint_dir(job) / "state.json"
    _wait(job, lambda j: j.state == JobState.RUNNING and checkpoint.exists())
    time.sleep(0.5)
    for pid in _processes_of(job.pk):
        os.kill(pid, signal.SIGKILL)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.SUCCEEDED, job.reason
    assert job.attempts.count() == 2
    assert int(result.read_text()) == sum(step * step for step in range(1, 41))
