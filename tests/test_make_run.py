"""`make run` as a newcomer uses it: embedded defaults, demo credentials, Ctrl-C stops it all."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO_PASSWORD = "Smoke-test-pass-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes_using(data_dir: Path) -> list[int]:
    """PIDs of live processes whose environment names this data directory."""
    marker = f"OGAI_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _get_json(opener, url: str, data: dict | None = None, csrf: bool = False) -> tuple[int, dict]:
    body = json.dumps(data).encode() if data is not None else None
    headers = {"Content-Type": "application/json"}
    if csrf:  # a session's unsafe request carries the CSRF cookie back, as a browser would
        cookies = {c.name: c.value for c in opener.cookie_jar}
        headers |= {"X-CSRFToken": cookies.get("csrftoken", ""), "Referer": url}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.mark.slow
def test_make_run_starts_serves_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "data"
    port = _free_port()
    env = {
        key: value for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}
    }
    env.update({
        "OGAI_DATA_DIR": str(data_dir),
        "OGAI_PORT": str(port),
        "OGAI_DEMO_PASSWORD": DEMO_PASSWORD,
        "VIRTUAL_ENV": sys.prefix,
        "PYTHONUNBUFFERED": "1",
        "OGAI_RECONCILE_INTERVAL_S": "1",
    })
    log_path = tmp_path / "make-run.log"
    with log_path.open("w") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run"], cwd=REPO, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.cookie_jar = jar
    try:
        deadline = time.monotonic() + 180
        ready = None
        while time.monotonic() < deadline and make.poll() is None:
            try:
                status, body = _get_json(opener, f"{base}/readyz")
                if status == 200:
                    ready = body
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        assert ready is not None, f"never ready:\n{log_path.read_text()}"
        assert ready["checks"]["database"]["ok"] and ready["checks"]["worker"]["ok"]
        assert (data_dir / "ogai.sqlite3").exists(), "the embedded default is SQLite"

        status, me = _get_json(opener, f"{base}/api/v1/infra-os/auth/login/",
                               {"username": "demo-admin", "password": DEMO_PASSWORD})
        assert status == 200, me
        status, tenants = _get_json(opener, f"{base}/api/v1/infra-os/tenants/")
        assert status == 200
        assert "demo" in {tenant["name"] for tenant in tenants["results"]}
        demo = next(t for t in tenants["results"] if t["name"] == "demo")
        assert demo["quota"]["gpus"] > 0

        # The golden path's first step on one machine: a job on the local cluster.
        spec = {"name": "smoke", "tenant": "demo", "queue": "default",
                "command": [sys.executable, "-c", "print('hello from the local cluster')"],
                "resources": {"gpus": 0, "cpu": 1, "memory_mib": 256}}
        status, job = _get_json(opener, f"{base}/api/v1/aistation/jobs/", spec, csrf=True)
        assert status == 201, job
        deadline = time.monotonic() + 60
        while job["state"] not in {"succeeded", "failed", "cancelled"}:
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
            _, job = _get_json(opener, f"{base}/api/v1/aistation/jobs/{job['id']}/")
        assert job["state"] == "succeeded", job
        _, logs = _get_json(opener, f"{base}/api/v1/aistation/jobs/{job['id']}/logs/")
        assert "hello from the local cluster" in logs["text"]

        output = log_path.read_text()
        assert f"demo-admin   password: {DEMO_PASSWORD}" in output
        assert "platform admin  admin" in output
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            raise
    deadline = time.monotonic() + 10
    while _processes_using(data_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_using(data_dir) == [], log_path.read_text()
    assert "OGAI stopped." in log_path.read_text()
