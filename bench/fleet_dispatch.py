"""How fast the fleet dispatcher decides, on PostgreSQL: 10,000 queued jobs over 10 clusters.

Ten fake clusters of a fleet (100 nodes x 8 GPUs each, half of them busy), one tenant's fleet
queue, and 10,000 queued jobs of 1 to 64 GPUs on a cluster whose driver has stopped answering
(`OGAI_CLUSTER_LOST_S` past): one `fleet_redispatch` pass, the platform's own service (its
transaction, its locks, a job event per move), gives every one of them back to the fleet. The
rate is jobs decided / the pass's wall time. The pure dispatcher over the same clusters
(`aistation.scheduler.dispatch`) is timed beside it. Needs PostgreSQL: DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/ogai_bench (created when missing).

    python bench/fleet_dispatch.py [--jobs 10000] [--clusters 10]

Last line: {"jobs", "clusters", "decisions_per_s", "moved", "core_decisions_per_s", ...}.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import timedelta

from jobs_throughput import _setup_django

SIZES = (1, 1, 1, 2, 4, 8, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    args = parser.parse_args()
    _setup_django()
    from django.conf import settings
    from django.utils import timezone

    from aistation.choices import JobState
    from aistation.models import Job, JobEvent, Queue
    from aistation.scheduler.dispatch import Dispatcher
    from aistation.services.fleets import fleet_clusters, fleet_redispatch, fleet_views, job_snap
    from infra_os.models import Quota, Tenant
    from podsys.drivers.fake import reset_fake_clusters
    from podsys.models import Cluster, Fleet, Node

    # A clean slate in the bench database.
    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    Queue.objects.all().delete()
    Node.objects.all().delete()
    Cluster.objects.filter(name__startswith="bench-").delete()
    Fleet.objects.filter(name="bench").delete()
    reset_fake_clusters()
    rng = random.Random(7)  # noqa: S311  (a benchmark's job sizes, not a secret)
    tenant, _ = Tenant.objects.get_or_create(name="bench")
    Quota.objects.update_or_create(tenant=tenant, defaults={"gpus": 10**6})
    fleet = Fleet.objects.create(name="bench")
    now = timezone.now()
    clusters = []
    for c in range(args.clusters + 1):  # the first is the lost one
        cluster = Cluster.objects.create(name=f"bench-{c:02d}", driver="fake", fleet=fleet,
                                         last_synced_at=now)
        Node.objects.bulk_create([Node(cluster=cluster, name=f"n{n:04d}", gpus=8,
                                       gpu_model="H100", cpu_cores=64, memory_mib=524288)
                                  for n in range(args.nodes if c else 1)])
        clusters.append(cluster)
    lost = clusters[0]
    Cluster.objects.filter(pk=lost.pk).update(
        sync_error="connection refused",
        last_synced_at=now - timedelta(seconds=settings.OGAI_CLUSTER_LOST_S + 60))
    queue = Queue.objects.create(tenant=tenant, name="fleet", cluster=lost, fleet=fleet)
    # Half of every other cluster busy with running work.
    running = []
    for cluster in clusters[1:]:
        for n in range(args.nodes // 2):
            running.append(Job(tenant=tenant, queue=queue, cluster=cluster, name="busy",
                               command=["x"], gpus_per_replica=8, state=JobState.RUNNING,
                               placement=[f"n{n:04d}"]))
    Job.objects.bulk_create(running, batch_size=2000)
    jobs = []
    for i in range(args.jobs):
        gpus = rng.choice(SIZES)
        per, replicas = (gpus, 1) if gpus <= 8 else (8, gpus // 8)
        jobs.append(Job(tenant=tenant, queue=queue, cluster=lost, name=f"j{i}", command=["x"],
                        gpus_per_replica=per, replicas=replicas, state=JobState.QUEUED,
                        queued_at=now + timedelta(microseconds=i)))
    Job.objects.bulk_create(jobs, batch_size=2000)

    members = fleet_clusters(fleet.pk)
    started = time.perf_counter()
    views = fleet_views(members, timezone.now(), tenant.pk)
    dispatcher = Dispatcher(views)
    snaps = [job_snap(job) for job in Job.objects.filter(cluster=lost, state=JobState.QUEUED)]
    for snap in snaps:
        dispatcher.choose(snap, exclude=frozenset({lost.name}))
    core_s = time.perf_counter() - started

    started = time.perf_counter()
    result = fleet_redispatch(fleet=fleet)
    wall_s = time.perf_counter() - started
    decided = len(result.moved) + len(result.stuck)
    double = Job.objects.filter(pk__in=result.moved).exclude(cluster=lost).count()
    print(json.dumps({
        "jobs": args.jobs, "clusters": args.clusters, "nodes_per_cluster": args.nodes,
        "decided": decided, "moved": len(result.moved), "moved_off_the_lost_cluster": double,
        "wall_s": round(wall_s, 2), "decisions_per_s": round(decided / wall_s, 1),
        "core_decisions_per_s": round(len(snaps) / core_s, 1),
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
    }))


if __name__ == "__main__":
    main()
