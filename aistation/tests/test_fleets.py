"""Fleets: dispatch over two fake clusters, a lost cluster, and an elastic pool of a simulated
provider whose clock the tests move."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Attempt, Job, Queue
from aistation.services.autoscale import fleet_autoscale
from aistation.services.fleets import fleet_redispatch
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from infra_os.models import Quota, UsageRecord
from podsys.choices import PoolNodeState, ScaleEventKind
from podsys.drivers.base import FEATURE_SANDBOX
from podsys.drivers.fake import fake_cluster
from podsys.models import Cluster, Node, NodeRequest, PoolBudget, PoolNode, ScaleEvent
from podsys.providers.simulated import simulated_cloud
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes
from podsys.services.fleets import fleet_create, pool_create

SIMULATED = "podsys.providers.simulated.SimulatedProvider"


@pytest.fixture
def fleet(world, settings):
    """Fleet `gpu` of clusters east (2 nodes x 8 H100) and west (1 node x 8 H100); alpha's and
    beta's queue `fleet` spans both (64-GPU quotas). `fleet.pool()` adds a pool of up to 4
    simulated h100x8 nodes (boot 300 s) joining east."""
    settings.OGAI_RETRY_BACKOFF_S = 0
    east = Cluster.objects.create(name="east", driver="fake", options={"nodes": 2})
    west = Cluster.objects.create(name="west", driver="fake", options={"nodes": 1})
    for cluster in (east, west):
        cluster_sync_nodes(cluster=cluster)
    gpu = fleet_create(actor=world.operator, name="gpu", clusters=[east, west])
    Quota.objects.filter(tenant__in=[world.alpha, world.beta]).update(gpus=64)
    queues = {t.name: queue_create(actor=world.operator, tenant=t, name="fleet", cluster=east,
                                   fleet=gpu) for t in (world.alpha, world.beta)}
    members = {"alpha": world.alpha_member, "beta": world.beta_member}

    def submit(tenant="alpha", *, gpus=8, replicas=1, duration=None, name="work"):
        env = {"OGAI_FAKE_DURATION_S": str(duration)} if duration else {}
        queue = queues[tenant]
        return job_submit(actor=members[tenant], tenant=queue.tenant, queue=queue, name=name,
                          command=["python", "train.py"], env=env, gpus_per_replica=gpus,
                          replicas=replicas)

    def pool(**options):
        return pool_create(actor=world.operator, fleet=gpu, name="burst", cluster=east,
                           provider=SIMULATED, node_type="h100x8", max_nodes=4,
                           provider_options={"joins": "east", **options})

    def cycles():
        for cluster in (east, west):
            schedule_cluster(cluster_id=cluster.pk)

    def reconcile(seconds=0.0):
        for cluster in (east, west):
            fake_cluster(cluster.name).advance(seconds)
            reconcile_cluster(cluster=cluster)

    return SimpleNamespace(fleet=gpu, east=east, west=west, submit=submit, pool=pool,
                           cycles=cycles, reconcile=reconcile,
                           cloud=lambda: simulated_cloud("burst"))


def refresh(*jobs):
    for job in jobs:
        job.refresh_from_db()
    return jobs


def test_a_job_is_dispatched_where_its_gang_fits_and_says_why(fleet):
    big = fleet.submit(gpus=8, replicas=2)
    fleet.cycles()
    small = fleet.submit(gpus=8)
    refresh(big, small)
    assert big.cluster == fleet.east  # only east holds 16 GPUs
    assert big.dispatch == ("dispatched to east: 16 H100 free; west is too small for its gang "
                            "of 2 x 8 GPUs")
    assert small.cluster == fleet.west
    assert small.dispatch == "dispatched to west: 8 H100 free; east has 0"
    assert small.events.first().reason == small.dispatch
    fleet.cycles()
    refresh(small)
    assert small.state == JobState.RUNNING and small.placement == ["fake-node-000"]


def test_a_waiting_job_moves_to_the_first_cluster_that_would_start_it(fleet):
    fleet.submit(gpus=8, replicas=2, duration=100)  # east
    fleet.submit(gpus=8, duration=10)  # west
    fleet.cycles()
    waiting = fleet.submit(gpus=8)  # fits nowhere: queued where it would start soonest
    refresh(waiting)
    assert waiting.state == JobState.QUEUED
    assert "fit nowhere now" in waiting.dispatch
    here = waiting.cluster
    fleet.reconcile(11)  # west's job ends
    moved = fleet_redispatch(fleet=fleet.fleet)
    refresh(waiting)
    if here == fleet.west:
        assert moved.moved == {}
    else:
        assert moved.moved == {waiting.pk: "west"}
        assert waiting.dispatch.startswith("moved from east: dispatched to west")
    fleet.cycles()
    refresh(waiting)
    assert waiting.state == JobState.RUNNING and waiting.cluster == fleet.west
    assert Attempt.objects.filter(job=waiting).count() == 1


def test_a_lost_cluster_gives_back_its_queued_jobs_and_keeps_its_running_ones(fleet, settings):
    running = fleet.submit(gpus=8, replicas=2, duration=1000)
    fleet.cycles()
    queued = fleet.submit(gpus=8, replicas=2)  # only east could ever hold it: it waits there
    fleet.submit(gpus=8, duration=1000)  # west busy too
    fleet.cycles()
    refresh(running, queued)
    assert running.cluster == fleet.east and queued.cluster == fleet.east
    assert running.state == JobState.RUNNING and queued.state == JobState.QUEUED
    # East's driver stops answering for longer than OGAI_CLUSTER_LOST_S.
    settings.OGAI_CLUSTER_LOST_S = 60
    Cluster.objects.filter(pk=fleet.east.pk).update(
        sync_error="connection refused", last_synced_at=timezone.now() - timedelta(seconds=120))
    result = fleet_redispatch(fleet=fleet.fleet)
    refresh(running, queued)
    assert result.moved == {} and queued.pk in result.stuck  # west can never hold 16 GPUs
    # A gang west can hold moves; what runs on east stays and is never started again.
    movable = Job.objects.create(
        tenant=queued.tenant, queue=queued.queue, cluster=fleet.east, name="m",
        command=["x"], gpus_per_replica=8, replicas=1, state=JobState.QUEUED,
        queued_at=timezone.now())
    result = fleet_redispatch(fleet=fleet.fleet)
    movable.refresh_from_db()
    assert result.moved == {movable.pk: "west"}
    assert movable.cluster == fleet.west
    assert "moved from east (not answering since" in movable.dispatch
    for _ in range(3):
        fleet.cycles()
        fleet_redispatch(fleet=fleet.fleet)
    refresh(running)
    assert running.cluster == fleet.east and running.state == JobState.RUNNING
    assert Attempt.objects.filter(job=running).count() == 1
    assert not Attempt.objects.filter(job=running, cluster=fleet.west).exists()


def test_a_gang_that_fits_nowhere_buys_exactly_its_nodes_and_starts_when_all_are_ready(fleet):
    pool = fleet.pool()
    fleet.submit(gpus=8, replicas=2, duration=5000)
    fleet.submit(gpus=8, duration=5000)
    fleet.cycles()
    gang = fleet.submit(gpus=8, replicas=2, duration=100)
    fleet.cycles()
    t0 = timezone.now()
    fleet_autoscale(pool=pool, now=t0)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=10))  # asks once, not every pass
    request = NodeRequest.objects.get()
    assert request.nodes == 2 and request.jobs == [gang.pk] and not request.failed
    bought = list(PoolNode.objects.order_by("name"))
    assert [n.state for n in bought] == [PoolNodeState.BOOTING] * 2
    refresh(gang)
    assert gang.dispatch.startswith("waiting for 2 new h100x8 nodes from pool burst")
    fleet.cloud().advance(299)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=299))
    fleet.cycles()
    refresh(gang)
    assert gang.state == JobState.QUEUED  # not admitted on half its nodes
    fleet.cloud().advance(2)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=301))
    assert set(Node.objects.filter(cluster=fleet.east).values_list("name", flat=True)) >= {
        n.name for n in bought}
    fleet.cycles()
    refresh(gang)
    assert gang.state == JobState.RUNNING
    assert sorted(gang.placement) == [n.name for n in bought]
    assert NodeRequest.objects.count() == 1
    # It ends; the nodes go back once empty for the cool-down (600 s), not before.
    fleet.reconcile(101)
    done = t0 + timedelta(seconds=410)
    fleet_autoscale(pool=pool, now=done)
    fleet_autoscale(pool=pool, now=done + timedelta(seconds=599))
    assert PoolNode.objects.filter(state=PoolNodeState.READY).count() == 2
    fleet_autoscale(pool=pool, now=done + timedelta(seconds=600))
    assert PoolNode.objects.filter(state=PoolNodeState.RETURNED).count() == 2
    assert not Node.objects.filter(cluster=fleet.east, name__in=[n.name for n in bought]).exists()
    assert {n.id for n in fleet.cloud().nodes() if n.state == "ready"} == set()
    kinds = list(ScaleEvent.objects.order_by("created_at", "id").values_list("kind", flat=True))
    assert kinds == [ScaleEventKind.UP, ScaleEventKind.DOWN, ScaleEventKind.DOWN]
    usage = UsageRecord.objects.filter(source__startswith="pool node").order_by("source")
    assert [u.tenant.name for u in usage] == ["alpha", "alpha"]
    assert usage[0].gpus == 8
    assert usage[0].ended_at - usage[0].started_at == timedelta(seconds=1010)  # boot and idle


def test_a_gang_bigger_than_every_cluster_runs_on_nodes_the_pool_buys(fleet):
    with pytest.raises(ValidationError, match="3 replicas of 8 GPUs need 24 GPUs"):
        fleet.submit(gpus=8, replicas=3)  # no pool yet: refused at once, nothing kept
    assert not Job.objects.exists()
    pool = fleet.pool()
    gang = fleet.submit(gpus=8, replicas=3, duration=100)
    assert gang.dispatch == ("waiting for pool burst to buy nodes: east is too small for its "
                             "gang of 3 x 8 GPUs; west is too small for its gang of 3 x 8 GPUs")
    fleet.cycles()
    refresh(gang)
    assert gang.state == JobState.QUEUED  # waits for the pool; not failed as too big
    t0 = timezone.now()
    fleet_autoscale(pool=pool, now=t0)
    assert NodeRequest.objects.get().nodes == 3
    refresh(gang)
    told = gang.dispatch
    assert told.startswith("waiting for 3 new h100x8 nodes from pool burst")
    fleet_redispatch(fleet=fleet.fleet, now=t0)  # while they boot it stays, and says so
    fleet.cycles()
    refresh(gang)
    assert (gang.state, gang.cluster, gang.dispatch) == (JobState.QUEUED, fleet.east, told)
    fleet.cloud().advance(301)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=301))
    fleet.cycles()
    refresh(gang)
    assert gang.state == JobState.RUNNING
    assert sorted(gang.placement) == sorted(PoolNode.objects.values_list("name", flat=True))
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=311))
    refresh(gang)
    assert gang.dispatch == "started on east, on nodes pool burst bought for it"


def test_a_gang_no_pool_could_hold_is_refused_at_submission(fleet):
    fleet.pool()  # up to 4 nodes of 8 GPUs
    with pytest.raises(ValidationError, match="5 replicas of 8 GPUs need 40 GPUs"):
        fleet.submit(gpus=8, replicas=5)
    with pytest.raises(ValidationError, match="16 GPUs per replica"):
        fleet.submit(gpus=16)
    assert not Job.objects.exists()


def test_a_stock_out_backs_off_and_the_job_says_so(fleet):
    pool = fleet.pool(stock={"h100x8": 1})
    fleet.submit(gpus=8, replicas=2, duration=5000)
    fleet.submit(gpus=8, duration=5000)
    fleet.cycles()
    gang = fleet.submit(gpus=8, replicas=2)
    t0 = timezone.now()
    fleet_autoscale(pool=pool, now=t0)
    refresh(gang)
    assert "stock-out at the provider (try 1 of 3)" in gang.dispatch
    assert "tries again at" in gang.dispatch
    assert not PoolNode.objects.exists()  # never half a gang
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=30))
    assert NodeRequest.objects.count() == 1  # backing off
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=61))
    assert NodeRequest.objects.count() == 2
    refresh(gang)
    assert "(try 2 of 3)" in gang.dispatch
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=120))
    assert NodeRequest.objects.count() == 2  # 120 s after the second try
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=182))
    assert NodeRequest.objects.count() == 3
    refresh(gang)
    assert "(try 3 of 3)" in gang.dispatch
    # After three tries it pauses an hour, then starts a new round.
    fleet.cloud().set_stock("h100x8", None)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=182 + 3599))
    assert NodeRequest.objects.count() == 3
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=182 + 3600))
    last = NodeRequest.objects.order_by("-created_at", "-id").first()
    assert last.tries == 1 and not last.failed
    assert NodeRequest.objects.values("request_id").distinct().count() == 4
    assert PoolNode.objects.filter(state=PoolNodeState.BOOTING).count() == 2
    assert ScaleEvent.objects.filter(kind=ScaleEventKind.FAILED).count() == 3
    refresh(gang)
    assert gang.dispatch.startswith("waiting for 2 new h100x8 nodes")


def test_a_node_that_fails_to_boot_fails_its_whole_request(fleet):
    pool = fleet.pool()
    fleet.submit(gpus=8, replicas=2, duration=5000)
    fleet.submit(gpus=8, duration=5000)
    fleet.cycles()
    gang = fleet.submit(gpus=8, replicas=2)
    fleet.cloud().fail_next(1, "no capacity in zone a")
    t0 = timezone.now()
    fleet_autoscale(pool=pool, now=t0)
    fleet.cloud().advance(300)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=300))
    assert not PoolNode.objects.filter(state__in=(PoolNodeState.BOOTING, PoolNodeState.READY))
    request = NodeRequest.objects.get()
    assert request.failed and "no capacity in zone a" in request.reason
    assert not Node.objects.filter(cluster=fleet.east, name__startswith="burst").exists()
    refresh(gang)
    assert gang.state == JobState.QUEUED


def test_an_oscillating_load_does_not_thrash(fleet):
    pool = fleet.pool()
    fleet.submit(gpus=8, replicas=2, duration=100000)
    fleet.submit(gpus=8, duration=100000)
    fleet.cycles()
    t0 = timezone.now()
    now = t0
    for _ in range(6):  # a 4-minute job every 5 minutes: the node idles 1 minute each time
        fleet.submit(gpus=8, duration=240)
        fleet_autoscale(pool=pool, now=now)
        fleet.cloud().advance(300)
        now += timedelta(seconds=300)
        fleet_autoscale(pool=pool, now=now)
        fleet.cycles()
        fleet_autoscale(pool=pool, now=now + timedelta(seconds=10))  # beat: the node is busy
        fleet.reconcile(240)
        fleet_autoscale(pool=pool, now=now + timedelta(seconds=240))
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() >= 5
    assert NodeRequest.objects.count() == 1
    assert not ScaleEvent.objects.filter(kind=ScaleEventKind.DOWN).exists()
    fleet_autoscale(pool=pool, now=now + timedelta(seconds=240 + 600))
    assert ScaleEvent.objects.filter(kind=ScaleEventKind.DOWN).count() == 1


def test_budgets_bound_what_a_pool_buys_and_say_so(fleet, world):
    pool = fleet.pool()
    PoolBudget.objects.create(pool=pool, tenant=world.alpha, max_nodes=1)
    fleet.submit(gpus=8, replicas=2, duration=5000)
    fleet.submit(gpus=8, duration=5000)
    fleet.cycles()
    gang = fleet.submit(gpus=8, replicas=2)
    result = fleet_autoscale(pool=pool, now=timezone.now())
    refresh(gang)
    assert not NodeRequest.objects.exists()
    assert "needs 2 new nodes; the pool may add 1 more now" in result.refused[gang.pk]
    assert "the pool cannot help" in gang.dispatch
    assert ScaleEvent.objects.filter(kind=ScaleEventKind.REFUSED).count() == 1
    fleet_autoscale(pool=pool, now=timezone.now())
    assert ScaleEvent.objects.filter(kind=ScaleEventKind.REFUSED).count() == 1  # told once


def test_another_tenant_cannot_take_a_node_bought_for_alpha(fleet):
    """An attack on the tenant boundary: beta's work on an idle node alpha pays for."""
    pool = fleet.pool()
    fleet.submit(gpus=8, replicas=2, duration=100000)
    fleet.submit(gpus=8, duration=100000)
    fleet.cycles()
    mine = fleet.submit(gpus=8, duration=10)
    t0 = timezone.now()
    fleet_autoscale(pool=pool, now=t0)
    fleet.cloud().advance(300)
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=300))
    fleet.cycles()
    fleet.reconcile(11)
    refresh(mine)
    assert mine.state == JobState.SUCCEEDED
    bought = PoolNode.objects.get()
    theirs = fleet.submit("beta", gpus=8)
    # Beta's job sees no room in the fleet, even on alpha's idle node, so the pool buys a node
    # for beta; the cycle never puts it on alpha's.
    fleet.cycles()
    refresh(theirs)
    assert theirs.state == JobState.QUEUED
    assert bought.name not in theirs.placement
    fleet_autoscale(pool=pool, now=t0 + timedelta(seconds=320))
    fleet.cycles()
    refresh(theirs)
    assert theirs.state == JobState.QUEUED
    assert PoolNode.objects.filter(tenant=theirs.tenant).count() == 1


def test_a_preempted_job_moves_where_it_starts_but_a_retrying_one_stays(fleet):
    fleet.submit(gpus=8, replicas=2, duration=1000)  # east full
    fleet.cycles()
    queue = Job.objects.first().queue

    def queued(name, restarts):
        return Job.objects.create(
            tenant=queue.tenant, queue=queue, cluster=fleet.east, name=name, command=["x"],
            gpus_per_replica=8, state=JobState.QUEUED, attempt_count=1, restarts=restarts,
            max_restarts=3, queued_at=timezone.now())

    preempted, retrying = queued("preempted", 0), queued("retrying", 1)
    result = fleet_redispatch(fleet=fleet.fleet)
    refresh(preempted, retrying)
    assert result.moved == {preempted.pk: "west"} and preempted.cluster == fleet.west
    assert retrying.cluster == fleet.east  # its checkpoints are where it failed


def test_freed_gpus_go_to_the_job_the_policy_would_start_first_not_the_oldest(fleet):
    """West frees 8 GPUs while two jobs wait on a full east: the new one (no service yet, the
    default policy's first level) moves, not the older one that already ran for hours."""
    fleet.submit(gpus=8, replicas=2, duration=1000)  # east full
    fleet.submit(gpus=8, duration=10)  # west full
    fleet.cycles()
    queue = Job.objects.first().queue
    start = timezone.now()

    def queued(name, attained_gpu_s, queued_at):
        return Job.objects.create(
            tenant=queue.tenant, queue=queue, cluster=fleet.east, name=name, command=["x"],
            gpus_per_replica=8, state=JobState.QUEUED, attained_gpu_s=attained_gpu_s,
            queued_at=queued_at)

    long_one = queued("ran-for-hours", 8 * 3 * 3600.0, start - timedelta(hours=2))
    new_one = queued("new", 0.0, start)
    fleet.reconcile(11)  # west's job ends
    result = fleet_redispatch(fleet=fleet.fleet)
    refresh(long_one, new_one)
    assert result.moved == {new_one.pk: "west"} and new_one.cluster == fleet.west
    assert long_one.cluster == fleet.east
    assert long_one.dispatch.startswith("waits on east; no other cluster takes it now")


def test_a_cluster_that_cannot_run_the_job_is_passed_over_and_named(fleet, settings):
    settings.OGAI_SINGLE_TENANT = False
    driver_for(fleet.west).unsupported = {FEATURE_SANDBOX: "it runs work unconfined"}
    job = fleet.submit(gpus=8)  # best fit would be west's 8 free GPUs
    assert job.cluster == fleet.east
    assert job.dispatch == ("dispatched to east: 16 H100 free; west cannot run a tenant's work "
                            "(it runs work unconfined)")
    driver_for(fleet.east).unsupported = {FEATURE_SANDBOX: "it runs work unconfined"}
    with pytest.raises(ValidationError) as refused:
        fleet.submit(gpus=8)
    assert "Cluster east runs no tenant's work" in refused.value.message_dict["queue"][0]


def test_a_fleet_queue_drains_nodes_for_one_starving_job_at_a_time(fleet, settings):
    """Two of alpha's jobs starve, one queued on each cluster: east drains a node for the first,
    west drains nothing for the second (it says whose turn it is) and keeps taking work; once
    the first starts, west reserves for the second."""
    settings.OGAI_SCHEDULER_STARVATION_S = 60
    fleet.submit("beta", gpus=8, replicas=2, duration=1000)  # east full
    fleet.cycles()
    fleet.submit("beta", gpus=4, duration=2000)  # west half full
    fleet.cycles()
    alpha, beta = (Queue.objects.get(tenant__name=t, name="fleet") for t in ("alpha", "beta"))

    def queued(queue, cluster, gpus, waited_s):
        return Job.objects.create(
            tenant=queue.tenant, queue=queue, cluster=cluster, name="starving", command=["x"],
            gpus_per_replica=gpus, state=JobState.QUEUED,
            queued_at=timezone.now() - timedelta(seconds=waited_s))

    first = queued(alpha, fleet.east, 8, 300)
    second = queued(alpha, fleet.west, 8, 200)
    small = queued(beta, fleet.west, 4, 0)
    fleet.cycles()
    refresh(first, second, small)
    assert first.state == JobState.QUEUED and len(first.reserved_nodes) == 1
    assert first.reason.startswith(f"waiting: nodes {first.reserved_nodes[0]} are reserved for "
                                   f"job {first.pk}")
    assert second.reserved_nodes == []
    assert f"its queue's one reservation across the fleet is held for job {first.pk} on east" \
        in second.reason
    assert small.state == JobState.RUNNING, "west drained nothing"

    fleet.reconcile(1001)  # beta's work on east ends
    fleet.cycles()
    refresh(first, second)
    assert first.state == JobState.RUNNING and first.reserved_nodes == []
    assert second.state == JobState.QUEUED and second.reserved_nodes == ["fake-node-000"]
    assert second.reason.startswith(f"waiting: nodes fake-node-000 are reserved for job "
                                    f"{second.pk}")
