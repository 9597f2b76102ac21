"""The demo fleet `make run` seeds: two simulated clusters and a pool, the demo tenant's fleet
queue and its first jobs, which dispatch, buy nodes for a gang no cluster holds, and run."""

import io
from datetime import timedelta

from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job
from aistation.services.autoscale import fleet_autoscale
from aistation.services.demo import demo_seed as aistation_seed
from aistation.services.scheduling import schedule_cluster
from infra_os.models import Quota
from infra_os.services.demo import demo_seed as infra_seed
from podsys.choices import PoolNodeState
from podsys.models import Cluster, ElasticPool, NodeRequest, PoolNode
from podsys.providers.simulated import simulated_cloud
from podsys.services.demo import demo_seed as podsys_seed


def _seed() -> str:
    out = io.StringIO()
    for seed in (infra_seed, podsys_seed, aistation_seed):
        seed(stdout=out)
    return out.getvalue()


def test_the_demo_fleet_is_seeded_once_and_its_gang_runs_on_bought_nodes(db, settings,
                                                                         tmp_path):
    settings.DATA_DIR = tmp_path
    said = _seed()
    assert "fleet           demo-fleet" in said
    assert _seed().count("fleet") == 0  # a second `make run` adds nothing
    clusters = list(Cluster.objects.filter(fleet__name="demo-fleet").order_by("name"))
    assert [c.name for c in clusters] == ["sim-east", "sim-west"]
    pool = ElasticPool.objects.get(fleet__name="demo-fleet")
    assert (pool.cluster.name, pool.max_nodes) == ("sim-east", 4)
    assert Quota.objects.get(tenant__name="demo").gpus == 40
    jobs = {job.name: job for job in Job.objects.filter(queue__fleet=pool.fleet)}
    assert sorted(jobs) == ["eval-sweep", "finetune-lora", "pretrain-3node"]
    assert {job.tenant.name for job in jobs.values()} == {"demo"}
    assert jobs["finetune-lora"].dispatch.startswith("dispatched to ")

    # What the worker does every few seconds, with the simulated clock moved by hand.
    now = timezone.now()
    for cluster in clusters:
        schedule_cluster(cluster_id=cluster.pk)
    fleet_autoscale(pool=pool, now=now)
    assert NodeRequest.objects.get().nodes == 3
    simulated_cloud(pool.name).advance(61)  # the demo's nodes boot in a minute
    fleet_autoscale(pool=pool, now=now + timedelta(seconds=61))
    assert PoolNode.objects.filter(state=PoolNodeState.READY).count() == 3
    schedule_cluster(cluster_id=pool.cluster_id)
    gang = Job.objects.get(name="pretrain-3node")
    assert gang.state == JobState.RUNNING
    assert sorted(gang.placement) == sorted(PoolNode.objects.values_list("name", flat=True))
