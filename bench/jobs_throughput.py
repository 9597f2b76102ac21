"""How fast submitted jobs reach RUNNING, end to end on PostgreSQL with the fake driver.

Client processes submit jobs through the real service (validation, audit event, job event); a
second process plays the Celery worker, running the real cycle (snapshot, core, one transaction,
launches through the driver) at the cadence the platform's triggers give while submissions
stream in: one cycle per `aistation.triggers.BURST_S`, however many processes submit (a cycle
asked for while another already looked is skipped). The rate is
jobs / (last RUNNING - first submit). Needs PostgreSQL: DATABASE_URL, default postgres://postgres@127.0.0.1:5432/ogai_bench
(created when missing).
"""

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/ogai_bench"


def _setup_django() -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    os.environ.setdefault("OGAI_DATA_DIR", str(REPO / "var" / "bench"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
    # As in production: no DEBUG (which keeps every query in memory).
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only")
    url = os.environ["DATABASE_URL"]
    if not url.startswith("postgres"):
        raise SystemExit("bench/jobs_throughput.py measures PostgreSQL: set DATABASE_URL.")
    name = url.rsplit("/", 1)[1]
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name],  # noqa: S603, S607
                   capture_output=True, check=False)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def measure_submit_to_running(jobs: int = 2000, nodes: int = 1000, clients: int = 2) -> dict:
    _setup_django()
    from django.contrib.auth import get_user_model
    from django.db import close_old_connections, connections

    from aistation.choices import JobState
    from aistation.models import Job, Queue
    from aistation.services import jobs as job_services
    from aistation.services.jobs import job_submit
    from infra_os.choices import Role
    from infra_os.models import Membership, Quota, Tenant
    from podsys.drivers.fake import reset_fake_clusters
    from podsys.models import Cluster
    from podsys.services.clusters import cluster_sync_nodes

    # The bench's own loop plays the worker: no broker messages.
    job_services.request_cycle = lambda cluster_id: None
    reset_fake_clusters()
    Job.objects.all().delete()
    Queue.objects.filter(name="bench").delete()
    Cluster.objects.filter(name="bench").delete()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    tenant, _ = Tenant.objects.get_or_create(name="bench")
    Quota.objects.update_or_create(tenant=tenant, defaults={"gpus": nodes * 8})
    Membership.objects.get_or_create(tenant=tenant, user=user, defaults={"role": Role.MEMBER})
    cluster = Cluster.objects.create(name="bench", driver="fake",
                                     options={"nodes": nodes, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    queue = Queue.objects.create(tenant=tenant, name="bench", cluster=cluster)

    fork = multiprocessing.get_context("fork")
    connections.close_all()  # no process may share this process's connection
    worker = fork.Process(target=_worker, args=(cluster.pk, jobs), daemon=True)

    def submit(share: int) -> None:
        for index in range(share):
            job_submit(actor=user, tenant=tenant, queue=queue, name=f"bench-{index}",
                       command=["train"], gpus_per_replica=1)
        close_old_connections()

    # Several clients submit at once, each through its own API process, as on a shared
    # cluster behind an API server with several worker processes.
    def start_clients() -> list:
        clients_ = [fork.Process(target=submit, args=(jobs // clients,))
                    for _ in range(clients)]
        for client in clients_:
            client.start()
        return clients_

    started_at = time.perf_counter()
    worker.start()
    for client in start_clients():
        client.join()
    worker.join()
    elapsed = time.perf_counter() - started_at
    running = Job.objects.filter(cluster=cluster, state=JobState.RUNNING).count()

    # The same path once the jobs wait in the queue: how fast a backlog reaches RUNNING.
    reset_fake_clusters()
    Job.objects.filter(cluster=cluster).delete()
    connections.close_all()
    for client in start_clients():
        client.join()
    worker = fork.Process(target=_worker, args=(cluster.pk, jobs), daemon=True)
    backlog_started = time.perf_counter()
    worker.start()
    worker.join()
    backlog_elapsed = time.perf_counter() - backlog_started
    return {
        "submit_to_running_per_s": round(running / elapsed, 1),
        "e2e_jobs": running,
        "e2e_seconds": round(elapsed, 2),
        "backlog_to_running_per_s": round(jobs / backlog_elapsed, 1),
    }


def _worker(cluster_id: int, jobs: int) -> None:
    """The Celery worker's part: cycles until every submitted job runs, one per BURST_S (see
    `aistation.triggers`)."""
    from aistation.services.scheduling import schedule_cluster
    from aistation.triggers import BURST_S

    started = 0
    while started < jobs:
        began = time.monotonic()
        started += len(schedule_cluster(cluster_id=cluster_id).started)
        time.sleep(max(0.0, BURST_S - (time.monotonic() - began)))


if __name__ == "__main__":
    import json

    result = measure_submit_to_running()
    print(f"{result['e2e_jobs']} jobs from submit to RUNNING in {result['e2e_seconds']} s "
          "on PostgreSQL with the fake driver; a queued backlog reaches RUNNING at "
          f"{result['backlog_to_running_per_s']}/s")
    print(json.dumps(result))
