from django.contrib.auth import get_user_model
from django.db import transaction

from aistation.services.queues import queue_create
from infra_os.models import Tenant
from podsys.models import Cluster


@transaction.atomic
def demo_seed(*, stdout) -> None:
    """A `default` queue on the local cluster for every tenant that has no queue yet."""
    cluster = Cluster.objects.filter(name="local").first()
    admin = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if cluster is None or admin is None:
        return
    for tenant in Tenant.objects.filter(queues__isnull=True):
        queue_create(actor=admin, tenant=tenant, name="default", cluster=cluster,
                     description="Jobs on this machine")
        stdout.write(f"  queue           {tenant.name}/default on cluster local\n")
