"""The fleet's pure parts: the dispatcher's rule, the scale-up and scale-down rules, and the fleet
replay that runs them on a trace."""

import random

import pytest

from aistation.scheduler.dispatch import ClusterView, Dispatcher, dispatch, move_order
from aistation.scheduler.fleet_replay import FleetReplay, Pool
from aistation.scheduler.replay import TraceJob
from aistation.scheduler.scaling import (
    NodeShape,
    OpenRoom,
    PoolNode,
    plan_scale_up,
    scale_down,
)
from aistation.scheduler.types import JobSnap, NodeSnap


def job(i, gpus=8, replicas=1, model=""):
    return JobSnap(id=i, tenant="t", queue="t/q", priority=0, submitted_at=0.0,
                   gpus_per_replica=gpus, replicas=replicas, cpu_per_replica=1,
                   memory_mib_per_replica=1024, gpu_model=model)


def view(name, nodes, busy=0, model="H100", alive=True, queued=0):
    snaps = tuple(NodeSnap(f"{name}-{i}", 8, model) for i in range(nodes))
    held = tuple((f"{name}-{i}", 8, 1.0, 1024) for i in range(busy))
    return ClusterView(name=name, nodes=snaps, held=held, alive=alive, queued_gpus=queued)


def test_a_job_goes_where_it_fits_best_and_says_why():
    choice = Dispatcher([view("east", 4, busy=2), view("west", 4)]).choose(job(1, 8, 2))
    assert (choice.cluster, choice.fits_now) == ("east", True)
    assert choice.reason == "dispatched to east: 16 H100 free; west has 32"


def test_data_locality_wins_among_clusters_where_it_fits():
    d = Dispatcher([view("east", 4, busy=2), view("west", 4)])
    choice = d.choose(job(1), data_at=frozenset({"west"}))
    assert choice.cluster == "west" and choice.reason.endswith("its data is there")


def test_a_lost_cluster_takes_no_work():
    clusters = [view("east", 2, alive=False), view("west", 4, busy=4)]
    choice = Dispatcher(clusters).choose(job(1))
    assert choice.cluster == "west" and not choice.fits_now


def test_no_cluster_of_the_right_model_or_size_says_so():
    d = Dispatcher([view("east", 1), view("west", 1, model="A100", alive=False)])
    choice = d.choose(job(1, 8, 2, model="H100"))
    assert choice.cluster is None
    assert choice.reason == ("no cluster can take it: east is too small for its gang of 2 x 8 "
                             "H100 GPUs; west is not answering")


def test_a_job_that_fits_nowhere_waits_where_the_line_is_shortest():
    d = Dispatcher([view("east", 4, busy=4, queued=64), view("west", 2, busy=2)])
    choice = d.choose(job(1))
    assert choice.cluster == "west" and not choice.fits_now
    assert "fit nowhere now" in choice.reason and "west would start it soonest" in choice.reason


def test_ten_thousand_jobs_over_ten_clusters_never_overfill_a_cluster():
    rng = random.Random(3)  # noqa: S311  (test data)
    clusters = [view(f"c{i}", rng.randint(5, 50), busy=0) for i in range(10)]
    free = {c.name: len(c.nodes) * 8 for c in clusters}
    jobs = [job(i, *rng.choice([(1, 1), (4, 1), (8, 1), (8, 2), (8, 4)])) for i in range(10000)]
    choices = dispatch(jobs, clusters)
    assert len(choices) == 10000 and all(c.cluster for c in choices)
    placed = {name: 0 for name in free}
    for snap, choice in zip(jobs, choices, strict=True):
        if choice.fits_now:
            placed[choice.cluster] += snap.gpus
    assert all(placed[name] <= free[name] for name in free)
    assert sum(placed.values()) > 0.9 * sum(free.values())  # it fills the fleet first


def test_a_gang_gets_exactly_its_nodes_in_one_request_and_small_jobs_ride_along():
    shape = NodeShape(gpus=8, gpu_model="H100")
    plan = plan_scale_up([job(1, 8, 3), job(2, 2), job(3, 4), job(4, 4)], shape,
                         max_new_nodes=10)
    assert plan.requests[0] == (((1,), 3))
    assert plan.requests[1] == ((2, 3), 1)  # 2 + 4 GPUs on one new node
    assert plan.requests[2] == ((4,), 1)
    assert plan.new_nodes == 5


def test_room_already_booting_is_used_before_anything_is_bought():
    plan = plan_scale_up([job(5, 2)], NodeShape(8), max_new_nodes=4,
                         open_room=[OpenRoom("p-1", gpus=4, claims=[1])])
    assert plan.rides == {5: ("p-1",)} and plan.requests == []


def test_scale_up_stays_within_the_pool_and_says_why_not():
    plan = plan_scale_up([job(1, 8, 4), job(2, 8, 1), job(3, 8, 1, "A100")], NodeShape(8, "H100"),
                         max_new_nodes=3)
    assert plan.refused[1] == "needs 4 new nodes; the pool may add 3 more now"
    assert plan.refused[3] == "the pool's nodes have H100, not A100"
    assert plan.requests == [((2,), 1)]


def test_a_node_goes_back_only_after_the_cool_down_and_never_new():
    nodes = [PoolNode("old-idle", 0.0, 100.0), PoolNode("new-idle", 500.0, 500.0),
             PoolNode("busy", 0.0, None), PoolNode("short-idle", 0.0, 650.0)]
    assert scale_down(nodes, 1099.0, 600.0) == ["old-idle"]
    assert scale_down(nodes, 1100.0, 600.0) == ["old-idle", "new-idle"]


def test_waiting_jobs_are_offered_other_clusters_in_their_policys_order():
    # (name, priority, attained GPU-s, queued at): an old job that ran 3 GPU-hours, a new one,
    # a newer one with a little service, and an urgent one.
    waiting = [("ran-for-hours", 0, 3 * 3600.0, 0.0), ("new", 0, 0.0, 50.0),
               ("newer-some-service", 0, 600.0, 60.0), ("urgent", 5, 9 * 3600.0, 70.0)]

    def order(first_level):
        return [name for name, *_ in sorted(waiting, key=lambda w: move_order(
            priority=w[1], attained_gpu_s=w[2], queued_at=w[3], ident=0,
            first_level=first_level))]

    # Fair: priority, then below the first level (least service first), then the rest.
    assert order(3600.0) == ["urgent", "new", "newer-some-service", "ran-for-hours"]
    # Fifo and backfill: priority, then the oldest.
    assert order(None) == ["urgent", "ran-for-hours", "new", "newer-some-service"]


def trace(*jobs):
    return [TraceJob(i, submitted, duration, gpus)
            for i, (submitted, duration, gpus) in enumerate(jobs)]


def test_a_fleet_replay_runs_every_job_once_across_its_clusters():
    rng = random.Random(5)  # noqa: S311  (test data)
    jobs = trace(*[(rng.uniform(0, 20000), rng.uniform(60, 4000), rng.choice([1, 2, 8, 16]))
                   for _ in range(400)])
    result = FleetReplay(jobs, clusters={"a": 4, "b": 2, "c": 1}).run()
    assert result.jobs == 400 and result.double_starts == 0
    assert min(result.jct_s) > 0
    assert result.moves > 0  # waiting jobs went where they would start


def test_an_elastic_replay_buys_for_a_burst_and_returns_after_the_cool_down():
    jobs = trace(*[(0.0, 3600.0, 8) for _ in range(6)])  # 6 nodes' worth, on 2
    result = FleetReplay(jobs, clusters={"base": 2},
                         pool=Pool("base", max_nodes=10, boot_s=300, cool_down_s=600)).run()
    assert result.scale_ups == 4 and result.nodes_bought == 4  # one request per gang
    assert result.scale_downs == 4 and result.returned_within_cool_down == 0
    assert max(result.jct_s) == 300 + 3600  # waited only for the boot
    # Paid: 2 base nodes for the hour, 4 bought ones from request to return (boot + run + idle).
    assert result.gpu_s_paid == pytest.approx(8 * (2 * 3900 + 4 * (300 + 3600 + 600)))


def test_an_oscillating_load_buys_once():
    jobs = trace((0.0, 10**6, 8), *[(300.0 * k, 240.0, 8) for k in range(1, 20)])
    result = FleetReplay(jobs, clusters={"base": 1},
                         pool=Pool("base", max_nodes=4, boot_s=60, cool_down_s=600)).run()
    assert result.nodes_bought == 1 and result.scale_downs == 1
