import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_healthz_answers_without_dependencies(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_says_why_when_no_worker_answers(client, db, settings):
    settings.OGAI_READY_WORKER_TIMEOUT = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] is True
    assert checks["worker"]["ok"] is False
    assert "no Celery worker answered" in checks["worker"]["detail"]


def test_readyz_leaves_out_an_excluded_check(client, db, settings):
    settings.OGAI_READY_WORKER_TIMEOUT = 0.5
    response = client.get("/readyz?exclude=worker")
    assert response.status_code == 200
    assert set(response.json()["checks"]) == {"database"}
    refused = client.get("/readyz?exclude=wroker")
    assert refused.status_code == 400
    assert "no check named wroker" in refused.json()["detail"]


@pytest.mark.slow
def test_readyz_is_ready_with_a_live_worker(client, db, celery_worker_process):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["worker"]["ok"] is True


def test_the_production_profile_passes_the_deploy_check(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "OGAI_PROFILE": "production",
        "OGAI_DATA_DIR": str(tmp_path),
        "SECRET_KEY": "x" * 60 + "-production-check-Q7$",
        "ALLOWED_HOSTS": "ogai.example.org",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OGAI_PROFILE": "production", "OGAI_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True,
        timeout=120, check=False, cwd=REPO,
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr
