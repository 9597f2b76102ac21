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

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from infra_os.choices import Role
from ogai.celery import QUEUES
from ogai.tasks import health_ping
from podsys.drivers import reset_drivers
from podsys.drivers.fake import fake_cluster, reset_fake_clusters
from podsys.models import Cluster
from podsys.providers.simulated import reset_simulated_clouds
from podsys.services.clusters import cluster_sync_nodes
from tests.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory

pytest_plugins = ["tests.redfish.fixtures"]

REPO = Path(__file__).resolve().parent


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """Each worker its own data folder and broker database (tests/parallel.py)."""
    from tests.parallel import worker_environment

    for index, spec in enumerate(specs):
        spec.env.update(worker_environment(index))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.parallel import FileScheduling

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The files that start processes or a browser first (tests/parallel.py)."""
    from tests.parallel import long_files_first

    items[:] = long_files_first(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's fixtures (its database among them) are torn down, a gateway served in a
    thread stops its background work: a routing refresh meeting the flush's TRUNCATE can
    deadlock it, leaving the next test the rows of this one."""
    from mmodel.gateway import app as gateway_app

    gateway_app.quiesce()


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
def _fresh_fake_clusters(settings):
    """Fake clusters and simulated clouds live in process memory, on clocks the tests move:
    every test starts with none."""
    settings.OGAI_FAKE_STATE_DIR = ""
    reset_fake_clusters()
    reset_simulated_clouds()
    reset_drivers()
    yield
    reset_fake_clusters()
    reset_simulated_clouds()
    reset_drivers()


@pytest.fixture(autouse=True)
def _log_store_by_hand(settings):
    """The platform's own lines reach the log store only in tests that ask (`log_store`), and
    then when the test flushes them: no thread writes behind a test's back."""
    settings.OGAI_LOGS_PLATFORM = False
    settings.OGAI_LOGS_FLUSHER = False


@pytest.fixture(scope="session", autouse=True)
def _close_log_store():
    yield
    from aistation.logstore.config import reset_store

    reset_store()  # before the test database is dropped: it refuses while connected


@pytest.fixture
def log_store(db, settings):
    """This test database's log store (PostgreSQL or SQLite, as the tests' database), empty,
    with the platform's own lines going into this process's buffer."""
    from aistation.logstore.config import get_store, reset_store
    from aistation.logstore.handler import platform_buffer

    reset_store()
    store = get_store()
    store.clear()
    settings.OGAI_LOGS_PLATFORM = True
    buffer = platform_buffer()
    buffer.flush(store)
    store.clear()
    yield store
    store.clear()
    store.close()  # this one may no longer be the process's (a test may reset it)
    reset_store()


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


@pytest.fixture
def local_queue(world, tmp_path):
    """A cluster of this machine (the local driver, its files under tmp_path) and alpha's
    queue `default` on it."""
    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path / "cluster"), "grace_s": 2})
    cluster_sync_nodes(cluster=cluster)
    return queue_create(actor=world.operator, tenant=world.alpha, name="default",
                        cluster=cluster)


@pytest.fixture
def farm(world, settings):
    """A fake cluster of 2 nodes x 8 GPUs; tenants alpha and beta (8-GPU quotas) each with a
    queue `default` on it. `farm.submit(...)` submits as the tenant's member."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    cluster = Cluster.objects.create(name="farm", driver="fake",
                                     options={"nodes": 2, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    queues = {
        tenant.name: queue_create(actor=world.operator, tenant=tenant, name="default",
                                  cluster=cluster)
        for tenant in (world.alpha, world.beta)
    }
    members = {"alpha": world.alpha_member, "beta": world.beta_member}

    def submit(tenant="alpha", *, gpus=1, replicas=1, priority=0, duration=None, exit_code=None,
               max_restarts=0, name="work", env=None, **extra):
        env = dict(env or {})
        if duration is not None:
            env["OGAI_FAKE_DURATION_S"] = str(duration)
        if exit_code is not None:
            env["OGAI_FAKE_EXIT_CODE"] = str(exit_code)
        queue = queues[tenant]
        return job_submit(
            actor=members[tenant], tenant=queue.tenant, queue=queue, name=name,
            command=["python", "train.py"], env=env, gpus_per_replica=gpus, replicas=replicas,
            priority=priority, max_restarts=max_restarts, **extra,
        )

    def cycle():
        return schedule_cluster(cluster_id=cluster.pk)

    return SimpleNamespace(cluster=cluster, fake=fake_cluster("farm"), queues=queues,
                           submit=submit, cycle=cycle, world=world)


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
           "OGAI_RETRY_BACKOFF_S": "0.2", "OGAI_LOGS_SHIP_INTERVAL_S": "0.5",
           "OGAI_LAUNCH_GRACE_S": "5", "OGAI_FAKE_STATE_DIR": str(tmp_path / "fakes")}
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

