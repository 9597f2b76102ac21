from types import SimpleNamespace

import pytest

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from podsys.drivers.fake import fake_cluster
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes


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
               max_restarts=0, name="work", **extra):
        env = {}
        if duration is not None:
            env["OGAI_FAKE_DURATION_S"] = str(duration)
        if exit_code is not None:
            env["OGAI_FAKE_EXIT_CODE"] = str(exit_code)
        queue = queues[tenant]
        return job_submit(
            actor=members[tenant], tenant=queue.tenant, queue=queue, name=name,
            command=["train"], env=env, gpus_per_replica=gpus, replicas=replicas,
            priority=priority, max_restarts=max_restarts, **extra,
        )

    return SimpleNamespace(cluster=cluster, fake=fake_cluster("farm"), queues=queues,
                           submit=submit)
