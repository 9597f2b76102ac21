"""Jobs on this machine through the local driver and a real Celery worker: real processes,
real logs, retries, cancel and resume from a checkpoint."""

import contextlib
import json
import os
import signal
import sys
import textwrap
import time

import pytest

from aistation.choices import FINAL_STATES, JobState
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from aistation.services.workloads import job_checkpoint_dir
from podsys.models import Cluster
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes
from tests.processes import job_processes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]



def _script(body: str) -> str:
    """A job's program, given on its command line: a tenant's sandbox sees none of this
    machine's files (a test's temporary folder included), only its own folders."""
    return textwrap.dedent(body)


def _submit(world, queue, script, **extra):
    return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="script",
                      command=[sys.executable, "-c", script], **extra)


def _wait(job, condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if condition(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job.pk} stuck in {job.state}: {job.reason}")



def test_a_script_runs_to_success_with_its_output_in_the_logs(
    api, world, local_queue, celery_worker_process
):
    script = _script("""
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
    world, local_queue, celery_worker_process
):
    script = _script("import sys\nprint('failing')\nsys.exit(3)\n")
    job = _submit(world, local_queue, script, max_restarts=2)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.FAILED
    assert job.exit_code == 3
    assert "exit code 3" in job.reason
    assert job.attempts.count() == 3


def test_cancel_ends_the_process_group(world, local_queue, celery_worker_process):
    script = _script("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        time.sleep(600)
    """)
    job = _submit(world, local_queue, script)
    job = _wait(job, lambda j: j.state == JobState.RUNNING and len(job_processes(j.pk)) >= 2)
    job_cancel(actor=world.alpha_member, job=job)
    deadline = time.monotonic() + 30
    while job_processes(job.pk) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes(job.pk) == []
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
        time.sleep(0.1)
    (checkpoint.parent / "result.txt").write_text(str(state["total"]))
"""


def test_a_killed_job_resumes_from_its_checkpoint_with_the_same_result(
    world, local_queue, celery_worker_process
):
    job = _submit(world, local_queue, _script(CHECKPOINTED), max_restarts=1)
    checkpoint = job_checkpoint_dir(job) / "state.json"
    result = checkpoint.parent / "result.txt"
    # Kill it mid-run, as soon as it has made some progress (whatever the worker's pace).
    deadline = time.monotonic() + 60
    while not (checkpoint.exists() and json.loads(checkpoint.read_text())["step"] >= 5):
        assert time.monotonic() < deadline, "the job never wrote its checkpoint"
        time.sleep(0.05)
    killed = 0
    for pid in job_processes(job.pk):
        # Killing the first of its processes (the sandbox) can take the others down with it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    assert killed, "the job ended before it could be killed"
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.SUCCEEDED, job.reason
    assert job.attempts.count() == 2
    assert int(result.read_text()) == sum(step * step for step in range(1, 41))


SAVES_ON_SIGTERM = """
import json, os, pathlib, signal, sys, time
checkpoint = pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"]) / "state.json"
state = json.loads(checkpoint.read_text()) if checkpoint.exists() else {"step": 0, "total": 0}
print(f"starting at step {state['step']}", flush=True)

def save_and_stop(signum, frame):
    tmp = checkpoint.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, checkpoint)
    (checkpoint.parent / "saved.txt").write_text(str(state["step"]))
    sys.exit(143)

signal.signal(signal.SIGTERM, save_and_stop)
while state["step"] < 100:
    state["step"] += 1
    state["total"] += state["step"] ** 2
    time.sleep(0.05)
(checkpoint.parent / "result.txt").write_text(str(state["total"]))
"""


def test_a_preempted_job_saves_on_sigterm_and_resumes_where_it_stopped(
    world, tmp_path, settings
):
    """Preemption through the checkpoint: the fair policy preempts a job that has had more
    service; the process gets SIGTERM and the grace period to save; its next attempt resumes
    from what it saved (this script saves only then) and ends with the uninterrupted result."""
    settings.OGAI_SCHEDULER_LEVELS_GPU_S = (1.0,)  # a level down after one GPU-second
    settings.OGAI_SCHEDULER_MIN_RUN_S = 0.5
    cluster = Cluster.objects.create(name="one-gpu", driver="local", options={
        "root": str(tmp_path / "cluster"), "grace_s": 5, "gpus": 1})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                         cluster=cluster)
    long = _submit(world, queue, _script(SAVES_ON_SIGTERM), gpus_per_replica=1)
    saved = job_checkpoint_dir(long) / "saved.txt"
    result = job_checkpoint_dir(long) / "result.txt"
    schedule_cluster(cluster_id=cluster.pk)
    _wait(long, lambda j: j.state == JobState.RUNNING)
    time.sleep(1.5)
    short = _submit(world, queue, _script("print('short done')\n"), gpus_per_replica=1)
    schedule_cluster(cluster_id=cluster.pk)  # preempts: SIGTERM, then waits for the save
    long.refresh_from_db()
    assert long.events.filter(to_state=JobState.PREEMPTED).exists()
    assert 0 < int(saved.read_text()) < 100
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reconcile_cluster(cluster=cluster)
        schedule_cluster(cluster_id=cluster.pk)
        long.refresh_from_db()
        if long.state in FINAL_STATES:
            break
        time.sleep(0.2)
    short.refresh_from_db()
    assert short.state == JobState.SUCCEEDED
    assert long.state == JobState.SUCCEEDED, long.reason
    assert [a.state for a in long.attempts.order_by("number")] == ["preempted", "succeeded"]
    assert int(result.read_text()) == sum(step * step for step in range(1, 101))
    second = long.attempts.get(number=2)
    log = driver_for(cluster).logs(second.workload_id)
    assert f"starting at step {int(saved.read_text())}" in log
