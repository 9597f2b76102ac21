"""Stopping the platform stops the work it runs on this machine: Ctrl-C on `make run` (and a
SIGKILL of the command too) leaves no process of a job behind, and the jobs queue again with
the reason and run again when the platform starts again."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from aistation.services.platform_stop import PLATFORM_STOPPED
from tests.platform_process import free_port as _free_port
from tests.platform_process import processes_using as _processes_using
from tests.processes import job_processes

REPO = Path(__file__).resolve().parents[1]
STOP_BOUND_S = 60

# Run inside the platform's own environment (its data directory): a batch job and a service.
SUBMIT = """
import json, sys
from aistation.models import Queue
from aistation.services.jobs import job_submit
from infra_os.models import Tenant
from django.contrib.auth import get_user_model
tenant = Tenant.objects.get(name="demo")
queue = Queue.objects.get(tenant=tenant, name="default")
actor = get_user_model().objects.get(username="demo-admin")
common = dict(actor=actor, tenant=tenant, queue=queue, cpu_per_replica=0.5,
              memory_mib_per_replica=128)
batch = job_submit(name="batch", command=[sys.executable, "-c",
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(900)']); "
    "time.sleep(900)"], **common)
service = job_submit(name="files", command=[sys.executable, "-m", "http.server", "PORT",
                     "--bind", "127.0.0.1"], service=True, ports=[PORT], **common)
print(json.dumps([batch.pk, service.pk]))
"""


def _wait(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.5)


def _states(data_dir: Path, jobs: list[int]) -> dict[int, tuple[str, str]]:
    with sqlite3.connect(data_dir / "ogai.sqlite3") as db:
        rows = db.execute(f"SELECT id, state, reason FROM aistation_job "  # noqa: S608
                          f"WHERE id IN ({','.join('?' * len(jobs))})", jobs).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def _start(env: dict, log) -> subprocess.Popen:
    platform = subprocess.Popen(
        [sys.executable, "manage.py", "runplatform"], cwd=REPO, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    port = env["OGAI_PORT"]

    def ready() -> bool:
        assert platform.poll() is None, "runplatform exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                return json.loads(r.read())["checks"]["worker"]["ok"]
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError):
            return False

    _wait(ready, 180, "the platform to be ready")
    return platform


def _all_running(jobs: list[int]) -> bool:
    return all(job_processes(job) for job in jobs)


def _left(jobs: list[int], data_dir: Path) -> list[str]:
    """The processes of the jobs or of the platform still alive, with their command lines."""
    pids = {*(pid for job in jobs for pid in job_processes(job)), *_processes_using(data_dir)}
    found = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            found.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
    return found


def _wait_none_left(jobs: list[int], data_dir: Path, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := _left(jobs, data_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], log.read_text()[-6000:]


@pytest.mark.slow
def test_stopping_the_platform_stops_its_jobs_and_they_run_again(tmp_path):
    data_dir = tmp_path / "data"
    env = {key: value for key, value in os.environ.items()
           if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}}
    env.update({"OGAI_DATA_DIR": str(data_dir), "OGAI_PORT": str(_free_port()),
                "OGAI_DEMO_PASSWORD": "Smoke-test-pass-1", "VIRTUAL_ENV": sys.prefix,
                "PYTHONUNBUFFERED": "1", "OGAI_RECONCILE_INTERVAL_S": "1"})
    log_path = tmp_path / "platform.log"
    manage = [sys.executable, "manage.py"]
    # What `make run` does before it starts the platform (not its install step).
    for step in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([*manage, *step], cwd=REPO, env=env, check=True, capture_output=True)
    jobs: list[int] = []
    service_port = _free_port()
    code = SUBMIT.replace("PORT", str(service_port))
    with log_path.open("w") as log:
        platform = _start(env, log)
        try:
            jobs = json.loads(subprocess.run(
                [*manage, "shell", "-c", code], cwd=REPO, env=env, check=True,
                capture_output=True, text=True).stdout.strip().splitlines()[-1])
            _wait(lambda: _all_running(jobs), 120, "both jobs to run")

            os.killpg(platform.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
            platform.wait(timeout=STOP_BOUND_S)
            _wait_none_left(jobs, data_dir, 10, log_path)
            assert _states(data_dir, jobs) == {job: ("queued", PLATFORM_STOPPED) for job in jobs}
            assert "OGAI stopped." in log_path.read_text()

            # Started again, both run again; then the command is killed outright: its guard
            # stops the platform and the jobs all the same.
            platform = _start(env, log)
            _wait(lambda: _all_running(jobs) and {
                state for state, _ in _states(data_dir, jobs).values()} == {"running"}, 120,
                "both jobs to run again")
            os.kill(platform.pid, signal.SIGKILL)
            platform.wait(timeout=10)
            _wait_none_left(jobs, data_dir, STOP_BOUND_S, log_path)
            assert _states(data_dir, jobs) == {job: ("queued", PLATFORM_STOPPED) for job in jobs}
        finally:
            if platform.poll() is None:
                os.killpg(platform.pid, signal.SIGKILL)
            for pid in [*_processes_using(data_dir), *(
                    pid for job in jobs for pid in job_processes(job))]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
