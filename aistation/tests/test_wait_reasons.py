"""How a wait for room is worded: the resource that binds, asked and free, on the node that
comes closest, how many nodes were looked at, and the work holding it there, by the names the
platform gives its work. Pure: the core needs no database (the cycle that names the holders
from job labels is in test_wait_reasons_cycle)."""

from aistation.scheduler import NodeSnap
from aistation.tests.test_scheduler_core import decide, job, nodes, running, snapshot

DEMO = "the deployment demo-tiny-gpt"


def cpu_node(name="local", cores=2, memory_mib=8192, gpus=0):
    return NodeSnap(name=name, gpus=gpus, cpu_cores=cores, memory_mib=memory_mib)


def test_cpu_bound_on_one_node_names_the_deployment_holding_the_core():
    r = decide(snapshot(
        [cpu_node(cores=2)],
        running_jobs=[running(1, gpus=0, on="local", cpu_per_replica=1, display=DEMO)],
        pending=[job(2, gpus=0, cpu_per_replica=2)],
    ))
    assert r.reason(2) == (
        "waiting: 2 CPU cores asked, 1 free on node local (the deployment demo-tiny-gpt holds 1)")
    assert "GPU" not in r.reason(2), "a job asking no GPU hears nothing of GPUs"


def test_memory_bound_names_memory_only():
    r = decide(snapshot(
        [cpu_node(cores=8, memory_mib=8192)],
        running_jobs=[running(1, gpus=0, on="local", memory_mib_per_replica=6144,
                              display="job 1 train-gpt")],
        pending=[job(2, gpus=0, cpu_per_replica=1, memory_mib_per_replica=4096)],
    ))
    assert r.reason(2) == (
        "waiting: 4 GiB of memory asked, 2 GiB free on node local (job 1 train-gpt holds 6 GiB)")


def test_gpu_bound_on_one_node_names_gpus_and_their_holders():
    r = decide(snapshot(
        nodes(1, gpus=8), quotas={"a": 64},
        running_jobs=[running(1, gpus=6, on="node-1", display="job 1 pretrain"),
                      running(3, gpus=1, on="node-1", display="the notebook lab-1")],
        pending=[job(2, gpus=4)],
    ))
    assert r.reason(2) == (
        "waiting: 4 GPUs asked, 1 free on node node-1 (job 1 pretrain holds 6, the notebook "
        "lab-1 holds 1)")


def test_two_resources_short_name_both_with_units():
    r = decide(snapshot(
        [cpu_node(cores=4, memory_mib=8192)],
        running_jobs=[running(1, gpus=0, on="local", cpu_per_replica=3,
                              memory_mib_per_replica=6144, display=DEMO)],
        pending=[job(2, gpus=0, cpu_per_replica=2, memory_mib_per_replica=4096)],
    ))
    assert r.reason(2) == (
        "waiting: 2 CPU cores and 4 GiB of memory asked, 1 core and 2 GiB free on node local "
        "(the deployment demo-tiny-gpt holds 3 cores)")


def test_several_nodes_give_the_closest_nodes_figures_and_how_many_were_looked_at():
    # b has 1.5 cores free, a and c 0.5: b is closest; its holders only are named.
    r = decide(snapshot(
        [cpu_node("a", cores=4), cpu_node("b", cores=4), cpu_node("c", cores=4)],
        running_jobs=[
            running(1, gpus=0, on="a", cpu_per_replica=3.5, display="evaluation run 3"),
            running(2, gpus=0, on="b", cpu_per_replica=2, display=DEMO),
            running(3, gpus=0, on="b", cpu_per_replica=0.5, display="job 3 etl"),
            running(4, gpus=0, on="c", cpu_per_replica=3.5, display="training run 4"),
        ],
        pending=[job(9, gpus=0, cpu_per_replica=2)],
    ))
    assert r.reason(9) == (
        "waiting: 2 CPU cores asked, 1.5 free on node b, the closest of 3 nodes looked at (the "
        "deployment demo-tiny-gpt holds 2, job 3 etl holds 0.5)")


def test_gpu_bound_on_several_nodes():
    r = decide(snapshot(
        nodes(2, gpus=8), quotas={"a": 64},
        running_jobs=[running(1, gpus=8, on="node-1", display="job 1 big"),
                      running(2, gpus=5, on="node-2", display="job 2 mid")],
        pending=[job(3, gpus=4)],
    ))
    assert r.reason(3) == (
        "waiting: 4 GPUs asked, 3 free on node node-2, the closest of 2 nodes looked at (job 2 "
        "mid holds 5)")


def test_at_most_three_holders_biggest_first_and_replicas_of_one_deployment_are_one():
    r = decide(snapshot(
        [cpu_node(cores=8)],
        running_jobs=[
            running(1, gpus=0, on="local", cpu_per_replica=1, display="job 1 small"),
            running(2, gpus=0, on="local", cpu_per_replica=1.5, display=DEMO),
            running(3, gpus=0, on="local", cpu_per_replica=1.5, display=DEMO),
            running(4, gpus=0, on="local", cpu_per_replica=2, display="job 4 mid"),
            running(5, gpus=0, on="local", cpu_per_replica=1, display="job 5 small"),
            running(6, gpus=0, on="local", cpu_per_replica=0.5),
        ],
        pending=[job(9, gpus=0, cpu_per_replica=2)],
    ))
    assert r.reason(9) == (
        "waiting: 2 CPU cores asked, 0.5 free on node local (the deployment demo-tiny-gpt holds 3, "
        "job 4 mid holds 2, job 1 small holds 1 and 2 more)")


def test_work_started_in_the_same_cycle_is_named_and_work_without_a_name_is_job_n():
    r = decide(snapshot(
        [cpu_node(cores=2)],
        pending=[job(1, gpus=0, cpu_per_replica=1.5), job(2, gpus=0, cpu_per_replica=1)],
    ))
    assert set(r.starts) == {1}
    assert r.reason(2) == "waiting: 1 CPU core asked, 0.5 free on node local (job 1 holds 1.5)"


def test_a_gang_short_of_cores_says_how_many_of_its_replicas_fit():
    r = decide(snapshot(
        [cpu_node("a", cores=4), cpu_node("b", cores=4)],
        running_jobs=[running(1, gpus=0, on="a", cpu_per_replica=3, display=DEMO)],
        pending=[job(2, gpus=0, cpu_per_replica=2, replicas=3)],
    ))
    assert r.reason(2) == (
        "waiting: 3 replicas of 2 CPU cores must start together and the free CPU cores of 2 "
        "nodes hold 2 of them (the deployment demo-tiny-gpt holds 3)")


def test_no_node_taking_work_says_so():
    r = decide(snapshot(
        [NodeSnap(name="local", gpus=0, cpu_cores=4, memory_mib=8192, schedulable=False)],
        pending=[job(1, gpus=0, cpu_per_replica=1)],
    ))
    assert r.reason(1) == (
        "waiting: no node takes new work now (all cordoned, unhealthy or reserved)")


def test_a_cpu_job_too_big_for_any_node_never_fits_without_a_word_of_gpus():
    r = decide(snapshot([cpu_node(cores=2)], pending=[job(1, gpus=0, cpu_per_replica=4)]))
    assert r.waits[1].never_fits
    assert r.reason(1) == "never fits: no node has 4 CPU cores and 1 GiB of memory for one replica"


def test_another_tenants_work_is_not_named_in_a_wait():
    # A cluster is shared: tenant b's wait must not tell it the names of tenant a's work.
    r = decide(snapshot(
        [cpu_node(cores=4)],
        running_jobs=[running(1, "a", gpus=0, on="local", cpu_per_replica=2, display=DEMO),
                      running(3, "b", gpus=0, on="local", cpu_per_replica=1,
                              display="job 3 etl")],
        pending=[job(2, "b", gpus=0, cpu_per_replica=2), job(4, "a", gpus=0, cpu_per_replica=2)],
    ))
    assert r.reason(2) == (
        "waiting: 2 CPU cores asked, 1 free on node local (other tenants' work holds 2, "
        "job 3 etl holds 1)")
    assert "demo-tiny-gpt" not in r.reason(2)
    # Its own tenant's wait still names it, and not the other tenant's job.
    assert r.reason(4) == (
        "waiting: 2 CPU cores asked, 1 free on node local (the deployment demo-tiny-gpt holds "
        "2, other tenants' work holds 1)")
