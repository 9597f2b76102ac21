"""Fixtures shared by every test: two tenants with users of every role, and a platform admin."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.db import connection
from rest_framework.test import APIClient

from infra_os.choices import Role
from ogai.celery import QUEUES
from ogai.tasks import health_ping
from podsys.drivers import reset_drivers
from podsys.drivers.fake import reset_fake_clusters
from tests.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory

REPO = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The real hasher costs ~0.3 s a user on these cores; tests create dozens.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _clear_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _fresh_fake_clusters():
    """Fake clusters live in process memory: every test starts with none."""
    reset_fake_clusters()
    reset_drivers()
    yield
    reset_fake_clusters()
    reset_drivers()


@pytest.fixture
def password() -> str:
    return PASSWORD


@pytest.fixture
def world(db) -> SimpleNamespace:
    """Tenants `alpha` and `beta`, each with an admin, a member and a viewer; a platform admin
    (`operator`) who belongs to no tenant; `both`, a member of alpha and a viewer of beta."""
    alpha = TenantFactory(name="alpha")
    beta = TenantFactory(name="beta")
    people = {}
    for tenant in (alpha, beta):
        for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
            user = UserFactory(username=f"{tenant.name}-{role}")
            MembershipFactory(tenant=tenant, user=user, role=role)
            people[f"{tenant.name}_{role}"] = user
    both = UserFactory(username="both")
    MembershipFactory(tenant=alpha, user=both, role=Role.MEMBER)
    MembershipFactory(tenant=beta, user=both, role=Role.VIEWER)
    operator = UserFactory(username="operator", is_staff=True, is_superuser=True)
    return SimpleNamespace(alpha=alpha, beta=beta, operator=operator, both=both, **people)


@pytest.fixture
def api():
    """An API client; `api.as_user(user)` signs it in."""
    client = APIClient()

    def as_user(user):
        client.force_authenticate(user=user)
        return client

    client.as_user = as_user
    return client


def _database_url_of_tests() -> str:
    """The URL of the database the tests use, for a process the tests start."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    auth = settings["USER"] + (f":{settings['PASSWORD']}" if settings["PASSWORD"] else "")
    port = settings["PORT"] or 5432
    return f"postgres://{auth}@{settings['HOST'] or 'localhost'}:{port}/{settings['NAME']}"


@pytest.fixture
def celery_worker_process(tmp_path):
    """A real Celery worker process on the configured broker (Redis in CI, the filesystem
    transport otherwise), using the test database; stopped and reaped afterwards."""
    # Beat runs inside the worker, reconciling often, so jobs end promptly in tests.
    env = {**os.environ, "DATABASE_URL": _database_url_of_tests(),
           "OGAI_RECONCILE_INTERVAL_S": "0.5", "OGAI_SCHEDULE_INTERVAL_S": "2",
           "OGAI_RETRY_BACKOFF_S": "0.2",
           "OGAI_LAUNCH_GRACE_S": "5"}
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ogai", "worker", "--pool", "solo",
         "--queues", ",".join(QUEUES), "--without-gossip", "--without-mingle",
         "--without-heartbeat", "--loglevel", "INFO", "--hostname", f"test-{os.getpid()}@%h",
         "--beat", "--schedule", str(tmp_path / "beat-schedule")],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health_ping.apply_async(queue="default", expires=5).get(timeout=5)
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "The Celery worker did not start:\n" + (tmp_path / "worker.log").read_text()
                    ) from None
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
