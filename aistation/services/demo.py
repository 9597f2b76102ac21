from django.contrib.auth import get_user_model
from django.db import transaction

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from infra_os.choices import WRITE_ROLES
from infra_os.models import Membership, Quota, Tenant
from infra_os.services.quotas import quota_update
from podsys.models import Cluster, Fleet

DEMO_TENANT = "demo"
DEMO_FLEET = "demo-fleet"
DEMO_FLEET_QUEUE = "fleet"
# What the demo fleet's first jobs show: one dispatched where it fits, one on the other cluster,
# and a gang that fits on no cluster, so the pool buys nodes for it (they boot for a minute and
# go back three minutes after it ends). Durations are the simulation's: these jobs run nothing.
# (name, GPUs per replica, replicas, seconds it runs)
DEMO_FLEET_JOBS = [
    ("finetune-lora", 8, 1, 300),
    ("eval-sweep", 4, 1, 240),
    ("pretrain-3node", 8, 3, 420),
]
# Enough for all three at once.
DEMO_FLEET_GPUS = 40


@transaction.atomic
def demo_seed(*, stdout) -> None:
    """A `default` queue on the local cluster for every tenant that has no queue yet, and the
    demo tenant's queue on the simulated demo fleet, with its first jobs."""
    cluster = Cluster.objects.filter(name="local").first()
    admin = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if cluster is None or admin is None:
        return
    for tenant in Tenant.objects.filter(queues__isnull=True):
        queue_create(actor=admin, tenant=tenant, name="default", cluster=cluster,
                     description="Jobs on this machine")
        stdout.write(f"  queue           {tenant.name}/default on cluster local\n")
    _seed_fleet_queue(admin, stdout)


def _seed_fleet_queue(admin, stdout) -> None:
    fleet = Fleet.objects.filter(name=DEMO_FLEET).first()
    tenant = Tenant.objects.filter(name=DEMO_TENANT).first()
    if fleet is None or tenant is None or tenant.queues.filter(fleet=fleet).exists():
        return
    member = (Membership.objects.filter(tenant=tenant, role__in=WRITE_ROLES)
              .select_related("user").order_by("-role", "pk").first())  # a member first
    if member is None:
        return
    quota = Quota.objects.get(tenant=tenant)
    if quota.gpus < DEMO_FLEET_GPUS:
        quota_update(actor=admin, quota=quota, gpus=DEMO_FLEET_GPUS)
    first = fleet.clusters.order_by("name")[0]
    queue = queue_create(actor=admin, tenant=tenant, name=DEMO_FLEET_QUEUE, cluster=first,
                         fleet=fleet, description="The simulated demo fleet")
    stdout.write(f"  queue           {tenant.name}/{queue.name} on fleet {fleet.name}\n")
    for name, gpus, replicas, seconds in DEMO_FLEET_JOBS:
        submitted = job_submit(
            actor=member.user, tenant=tenant, queue=queue, name=name,
            command=["python", "train.py"], env={"OGAI_FAKE_DURATION_S": str(seconds)},
            gpus_per_replica=gpus, replicas=replicas)
        stdout.write(f"  job             {submitted.name}: {submitted.dispatch}\n")
