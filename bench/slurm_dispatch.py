"""Submit-to-running rate of one-replica jobs on a real 2-node Slurm: through OGAI against
`sbatch` of the same jobs directly, side by side on the same cluster.

The cluster is the tests' (`tests/slurm_cluster.py`: Debian's Slurm, accounting in the local
MariaDB), with nodes big enough that every job runs at once (256 CPUs and 256 stand-in GPUs
each, Slurm's `config_overrides`), so the rate is dispatch's, not the cluster's size. Each job
asks for 1 GPU, 1 CPU and 128 MiB and runs `true` as the tenant's account.

- OGAI: a client process submits the jobs through the real service (`job_submit`: validation,
  quota, audit and job events) while a second process plays the Celery worker, running the
  real scheduling cycle (snapshot, core, one transaction, `sbatch` through the slurm driver) at
  the cadence the platform's triggers give, one per `aistation.triggers.BURST_S`.
- `sbatch`: the same jobs (the very batch scripts and `sbatch` options the driver writes, each
  in its own folder, prepared before the clock starts) submitted one after another.

A job is running when its rank starts on a node: `slurm_launcher` writes `replica-0.node`
before it runs the command, on both paths. The rate is jobs started / (last rank start -
first submit); a job Slurm itself failed to launch (a node's step launch timing out under the
load of hundreds of jobs on two cores) is counted in `launches_slurm_failed`, not in the
rate. Rounds alternate (sbatch, OGAI, sbatch, OGAI, …) and the figures are the medians.
Needs root, Slurm (`make slurm`), MariaDB at 127.0.0.1:3306 and PostgreSQL: DATABASE_URL,
default postgres://postgres@127.0.0.1:5432/ogai_bench_slurm (made afresh).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/ogai_bench_slurm"
NODE_SIZE = 256  # CPUs and GPUs per node: room for every job at once
JOB_MEMORY_MIB = 128
COMMAND = ("true",)
WAIT_S = 900.0
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


def _setup(data_dir: Path) -> None:
    os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
    os.environ["OGAI_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
    os.environ.setdefault("DEBUG", "0")  # as in production: no query log kept in memory
    os.environ.setdefault("SECRET_KEY", "bench-only")
    url = os.environ["DATABASE_URL"]
    if not url.startswith("postgres"):
        raise SystemExit("bench/slurm_dispatch.py measures on PostgreSQL: set DATABASE_URL.")
    name = url.rsplit("/", 1)[1]
    for program in ("dropdb", "createdb"):
        args = [program, "-h", "127.0.0.1", "-U", "postgres", name]
        if program == "dropdb":
            args.insert(1, "--if-exists")
        subprocess.run(args, capture_output=True, check=False)  # noqa: S603
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _wait_started(slurm, folders: list[Path], since: float) -> tuple[float, int]:
    """The rate at which ranks started, once every folder's `replica-0.node` is written or
    Slurm ended its job without starting it (under load a node may fail a launch: counted,
    and left out of the rate, on both paths alike); and how many never started."""
    deadline = time.monotonic() + WAIT_S
    waiting = {folder.name: folder for folder in folders}
    checked = time.monotonic()
    while waiting:
        waiting = {name: folder for name, folder in waiting.items()
                   if not (folder / "replica-0.node").exists()}
        if waiting and time.monotonic() - checked > 2:
            checked = time.monotonic()
            for job in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]:
                if job["name"] in waiting and job["job_state"] not in LIVE_STATES \
                        and not (waiting[job["name"]] / "replica-0.node").exists():
                    del waiting[job["name"]]
        if waiting and time.monotonic() > deadline:
            raise SystemExit(f"{len(waiting)} of {len(folders)} jobs never started on Slurm "
                             f"in {WAIT_S:.0f} s (e.g. {next(iter(waiting.values()))})")
        time.sleep(0.05)
    starts = [(folder / "replica-0.node").stat().st_mtime for folder in folders
              if (folder / "replica-0.node").exists()]
    return len(starts) / (max(starts) - since), len(folders) - len(starts)


def _wait_drained(cluster) -> None:
    """Until Slurm runs nothing: each round starts on an idle cluster."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        queue = json.loads(cluster.run("squeue", "--json").stdout)["jobs"]
        if not [job for job in queue if job["job_state"] in LIVE_STATES]:
            return
        time.sleep(0.5)
    raise SystemExit("Slurm did not finish the round's jobs")


# Direct sbatch -----------------------------------------------------------------------------

def direct_round(slurm, driver, uid: int, jobs: int, label: str) -> tuple[float, int]:
    """`sbatch` of the driver's own scripts and options, prepared beforehand (not timed)."""
    from podsys.drivers.base import Resources, Workload

    prepared = []
    for index in range(jobs):
        workload = Workload(id=f"d{label}-{index}", command=COMMAND, tenant="bench",
                            run_as=uid, resources=Resources(gpus=1, cpu_cores=1,
                                                            memory_mib=JOB_MEMORY_MIB))
        folder = driver._prepare(workload, uid, [])  # no data folders to bind
        driver._batch_script(workload, folder)
        token = secrets.token_hex(16)
        prepared.append((folder, driver._sbatch_args(workload, folder, uid, token)))
    started_at = time.time()
    for _folder, args in prepared:
        driver.cli.run("sbatch", *args, timeout=120)
    return _wait_started(slurm, [folder for folder, _args in prepared], started_at)


# Through OGAI ------------------------------------------------------------------------------

def ogai_round(slurm, cluster_id: int, queue_id: int, driver, jobs: int,
               label: str) -> tuple[float, int]:
    from django.db import connections

    from aistation.models import Attempt

    fork = multiprocessing.get_context("fork")
    connections.close_all()  # no process may share this one's connection
    worker = fork.Process(target=_worker, args=(cluster_id, jobs), daemon=True)
    client = fork.Process(target=_client, args=(queue_id, jobs, label), daemon=True)
    started_at = time.time()
    worker.start()
    client.start()
    client.join()
    worker.join()
    if client.exitcode or worker.exitcode:
        raise SystemExit(f"the {'client' if client.exitcode else 'worker'} process failed")
    ids = Attempt.objects.filter(job__name__startswith=f"bench-{label}-") \
        .values_list("workload_id", flat=True)
    folders = [driver._folder(workload_id) for workload_id in ids]
    if len(folders) != jobs:
        raise SystemExit(f"OGAI launched {len(folders)} of {jobs} jobs")
    return _wait_started(slurm, folders, started_at)


def _client(queue_id: int, jobs: int, label: str) -> None:
    from django.contrib.auth import get_user_model

    from aistation.models import Queue
    from aistation.services.jobs import job_submit

    queue = Queue.objects.select_related("tenant", "cluster").get(pk=queue_id)
    user = get_user_model().objects.get(username="bench")
    for index in range(jobs):
        job_submit(actor=user, tenant=queue.tenant, queue=queue, name=f"bench-{label}-{index}",
                   command=list(COMMAND), gpus_per_replica=1, cpu_per_replica=1,
                   memory_mib_per_replica=JOB_MEMORY_MIB)


def _worker(cluster_id: int, jobs: int) -> None:
    """The Celery worker's part: cycles until every submitted job is launched, one per
    BURST_S (see `aistation.triggers`)."""
    from aistation.services.scheduling import schedule_cluster
    from aistation.triggers import BURST_S

    started = 0
    while started < jobs:
        began = time.monotonic()
        started += len(schedule_cluster(cluster_id=cluster_id).started)
        time.sleep(max(0.0, BURST_S - (time.monotonic() - began)))


def _finish_round(cluster_id: int) -> None:
    """The platform's jobs of the round end (Slurm ran them): cancel what OGAI still counts, so
    the next round's capacity is the whole cluster."""
    from aistation.choices import FINAL_STATES
    from aistation.models import Job
    from aistation.services.jobs import job_cancel

    for job in Job.objects.filter(cluster_id=cluster_id).exclude(state__in=FINAL_STATES):
        job_cancel(actor=job.owner, job=job)


# The whole ---------------------------------------------------------------------------------

def measure(jobs: int, rounds: int) -> dict:
    from tests.slurm_cluster import SlurmCluster, posix_accounts

    data_dir = Path(tempfile.mkdtemp(prefix="ogai-bench-slurm-"))
    shared = Path(tempfile.mkdtemp(prefix="ogai-bench-slurm-shared-"))
    shared.chmod(0o755)
    _setup(data_dir)
    from django.contrib.auth import get_user_model

    from aistation.models import Queue
    from aistation.services import jobs as job_services
    from aistation.services.workloads import tenant_uid
    from infra_os.choices import Role
    from infra_os.models import Membership, Quota, Tenant
    from podsys.runtime import driver_for
    from podsys.services.clusters import cluster_create, cluster_sync_nodes

    # The bench's own worker process runs the cycles: no broker messages.
    job_services.request_cycle = lambda cluster_id: None
    user = get_user_model().objects.create(username="bench", is_staff=True, is_superuser=True)
    tenant = Tenant.objects.create(name="bench")
    Quota.objects.create(tenant=tenant, gpus=2 * NODE_SIZE)
    Membership.objects.create(tenant=tenant, user=user, role=Role.MEMBER)
    uid = tenant_uid(tenant.pk)
    ogai, direct, failed = [], [], {"ogai": 0, "sbatch": 0}
    with SlurmCluster.temporary(cpus=NODE_SIZE, gpus=NODE_SIZE, memory_mib=2 * jobs *
                                JOB_MEMORY_MIB) as slurm, posix_accounts(uid):
        cluster = cluster_create(actor=user, name="hpc", driver="slurm", options={
            "slurm_conf": str(slurm.conf), "shared_dir": str(shared), "grace_s": 1})
        cluster_sync_nodes(cluster=cluster)
        queue = Queue.objects.create(tenant=tenant, name="bench", cluster=cluster)
        driver = driver_for(cluster)
        for round_ in range(rounds):
            rate, lost = direct_round(slurm, driver, uid, jobs, str(round_))
            direct.append(rate)
            failed["sbatch"] += lost
            _wait_drained(slurm)
            rate, lost = ogai_round(slurm, cluster.pk, queue.pk, driver, jobs, str(round_))
            ogai.append(rate)
            failed["ogai"] += lost
            _wait_drained(slurm)
            _finish_round(cluster.pk)
            print(f"round {round_ + 1}: sbatch {direct[-1]:.1f} jobs/s, OGAI {ogai[-1]:.1f} "
                  "jobs/s", flush=True)
    ogai_s, sbatch_s = statistics.median(ogai), statistics.median(direct)
    return {"jobs": jobs, "rounds": rounds, "ogai_jobs_s": round(ogai_s, 2),
            "sbatch_jobs_s": round(sbatch_s, 2), "ratio": round(ogai_s / sbatch_s, 3),
            "ogai_rounds_jobs_s": [round(rate, 2) for rate in ogai],
            "sbatch_rounds_jobs_s": [round(rate, 2) for rate in direct],
            "launches_slurm_failed": failed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    # Stopped, it still stops the Slurm it started and removes the accounts it made.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if os.geteuid() != 0:
        raise SystemExit("bench/slurm_dispatch.py runs Slurm's daemons: run it as root.")
    result = measure(options.jobs, options.rounds)
    print(f"{result['jobs']} one-replica jobs to running on a real 2-node Slurm: OGAI "
          f"{result['ogai_jobs_s']}/s, sbatch {result['sbatch_jobs_s']}/s "
          f"(ratio {result['ratio']}, target at least 0.8)")
    print(json.dumps(result))
