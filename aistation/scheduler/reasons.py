"""The wording of every decision: one short sentence a person can read, with the numbers that
bind. Waits start with "waiting: " (or "never fits: "), starts with "admitted: " or "borrowed: "."""

from __future__ import annotations

from collections.abc import Sequence

from .placement import Shape

SHOWN_NODES = 4


def num(value: float) -> str:
    """12 for 12.0, 12.5 for 12.5: times and cores without noise."""
    if value == int(value):
        return str(int(value))
    return f"{value:.1f}"


def amount(value: float) -> str:
    """Up to two decimals, without trailing zeros: 0.6 and 0.25 cores, 12 and 0.5 GiB."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def gib(mib: float) -> str:
    return amount(mib / 1024)


def n_cores(value: float) -> str:
    return f"{amount(value)} CPU core" + ("" if amount(value) == "1" else "s")


def node_list(names: Sequence[str]) -> str:
    if len(names) <= SHOWN_NODES:
        return ", ".join(names)
    return ", ".join(names[:SHOWN_NODES]) + f", … ({len(names)} nodes)"


def n_gpus(count: int, what: str = "") -> str:
    """"1 GPU", "8 GPUs"; with `what`: "1 free GPU", "8 free GPUs"."""
    what = f"{what} " if what else ""
    return f"1 {what}GPU" if count == 1 else f"{count} {what}GPUs"


def n_rdma(count: int) -> str:
    return "1 RDMA device" if count == 1 else f"{count} RDMA devices"


def of_model(model: str) -> str:
    return f"{model} " if model else ""


# -- waits ------------------------------------------------------------------------------------


def backoff(not_before: float, now: float) -> str:
    # Relative: the snapshot's clock is epoch seconds in the platform, a count in the replay.
    return f"waiting: retry backoff, {num(max(0.0, not_before - now))} s left"


def behind(job_id: int) -> str:
    return f"waiting: behind job {job_id} in a fifo queue"


def queue_full(used: int, limit: int, need: int) -> str:
    return f"waiting: queue limit {used}/{limit} GPUs in use, job needs {need}"


def quota_full(used: int, quota: int, need: int) -> str:
    return f"waiting: tenant quota {used}/{quota} GPUs in use, job needs {need}"


def cpu_quota_full(used: float, quota: float, need: float) -> str:
    return (f"waiting: tenant quota {amount(used)}/{amount(quota)} CPU cores in use, "
            f"job needs {amount(need)}")


def memory_quota_full(used_mib: int, quota_mib: int, need_mib: int) -> str:
    return (f"waiting: tenant quota {gib(used_mib)}/{gib(quota_mib)} GiB memory in use, "
            f"job needs {gib(need_mib)} GiB")


def rdma_quota_full(used: int, quota: int, need: int) -> str:
    return f"waiting: tenant quota {used}/{quota} RDMA devices in use, job needs {need}"


def model_full(model: str, used: int, limit: int, need: int) -> str:
    return f"waiting: GPU model {model} limit {used}/{limit} in use, job needs {need}"


def model_limits_full(blocked: Sequence[str]) -> str:
    return f"waiting: the tenant's GPU model limits are in use ({', '.join(sorted(blocked))})"


def over_quota(quota: int) -> str:
    return (
        f"waiting: exceeds the tenant's quota of {quota} GPUs; "
        "it can only run on borrowed capacity"
    )


def over_model_limit(model: str, limit: int) -> str:
    return (
        f"waiting: exceeds the tenant's {model} limit of {limit} GPUs; "
        "it can only run on borrowed capacity"
    )


def no_borrow(binding: str, capacity: str) -> str:
    """A job over its quota that found no idle capacity to borrow."""
    return f"{binding}; no idle capacity to borrow: {capacity}"


# What a replica asks that a node lacks: (resource, asked, free), resource one of GPU, CPU,
# MEMORY, RDMA.
GPU, CPU, MEMORY, RDMA = "gpu", "cpu", "memory", "rdma"
Short = tuple[str, float, float]
# A job holding some of the scarce resource where the wait looked: (display name, amount).
Holder = tuple[str, float]
SHOWN_HOLDERS = 3
# The holder that stands for all other tenants' work: their jobs' names are theirs alone.
OTHER_TENANTS = "other tenants' work"


def _asked(what: str, value: float, model: str) -> str:
    if what == GPU:
        return n_gpus(int(value), model)
    if what == CPU:
        return n_cores(value)
    if what == RDMA:
        return n_rdma(int(value))
    return f"{gib(value)} GiB of memory"


def _free(what: str, value: float, unit: bool) -> str:
    """What is left, with its unit when several resources are named together."""
    value = max(value, 0.0)
    if what == GPU:
        return f"{int(value)} GPU" + ("" if int(value) == 1 else "s") if unit else str(int(value))
    if what == CPU:
        return f"{amount(value)} core" + ("" if amount(value) == "1" else "s") \
            if unit else amount(value)
    if what == RDMA:
        return n_rdma(int(value)) if unit else str(int(value))
    return f"{gib(value)} GiB"


def _short_text(short: Sequence[Short], model: str) -> str:
    """"2 CPU cores asked, 1 free"; several: "2 CPU cores and 8 GiB of memory asked, 1 core and
    2 GiB free"."""
    unit = len(short) > 1
    asked = " and ".join(_asked(what, value, model) for what, value, _ in short)
    free = " and ".join(_free(what, left, unit) for what, _, left in short)
    return f"{asked} asked, {free} free"


def holders(found: Sequence[Holder], what: str, unit: bool) -> str:
    """" (the deployment demo holds 1, job 12 train holds 0.5)": the biggest first, at most
    SHOWN_HOLDERS of them; "" when nothing the platform runs holds any."""
    if not found:
        return ""
    shown = [f"{name} holds {_free(what, held, unit)}" for name, held in found[:SHOWN_HOLDERS]]
    more = len(found) - SHOWN_HOLDERS
    return " (" + ", ".join(shown) + (f" and {more} more" if more > 0 else "") + ")"


def no_room_on_node(model: str, short: Sequence[Short], node: str, looked_at: int,
                    held: Sequence[Holder]) -> str:
    """A replica that no node holds now: what binds on the node that comes closest, and who
    holds it there: "2 CPU cores asked, 1 free on node local (the deployment demo holds 1)"."""
    where = f" on node {node}"
    if looked_at > 1:
        where += f", the closest of {looked_at} nodes looked at"
    return _short_text(short, model) + where + holders(held, short[0][0], len(short) > 1)


def room_came_free(node: str) -> str:
    return f"room came free on node {node} later in this cycle; the next cycle looks again"


def no_node_takes_work(model: str) -> str:
    return f"no {of_model(model)}node takes new work now (all cordoned, unhealthy or reserved)"


def no_room_gang_resources(replicas: int, short: Sequence[Short], room: int, looked_at: int,
                           held: Sequence[Holder], model: str) -> str:
    """A gang whose GPUs would fit but whose CPU cores or memory do not."""
    per = " and ".join(_asked(what, value, model) for what, value, _ in short)
    names = " and ".join({GPU: "GPUs", CPU: "CPU cores", MEMORY: "memory",
                          RDMA: "RDMA devices"}[s[0]] for s in short)
    nodes = "1 node" if looked_at == 1 else f"{looked_at} nodes"
    return (f"{replicas} replicas of {per} must start together and the free {names} of "
            f"{nodes} hold {room} of them" + holders(held, short[0][0], len(short) > 1))


def no_room_whole_nodes(replicas: int, gpus: int, free_nodes: int) -> str:
    return (
        f"{replicas} replicas of {n_gpus(gpus)} need {replicas} free nodes ({free_nodes} free)"
    )


def no_room_gang(replicas: int, gpus: int, room: int) -> str:
    return (
        f"{replicas} replicas of {n_gpus(gpus)} must start together and the free GPUs hold "
        f"{room} of them"
    )


def reserved_elsewhere(names: Sequence[str], job_id: int) -> str:
    return f"; nodes {node_list(names)} are reserved for job {job_id}"


def reserved_for(names: Sequence[str], job_id: int, waited: float, bound: float) -> str:
    return (
        f"waiting: nodes {node_list(names)} are reserved for job {job_id}, waiting for "
        f"{num(waited)} s (over the {num(bound)} s starvation bound); nothing else starts "
        "there while their running work drains"
    )


def queue_reserved_elsewhere(held: str, waited: float, bound: float) -> str:
    return (
        f"waiting: {num(waited)} s, over the {num(bound)} s starvation bound; its queue's one "
        f"reservation across the fleet is held for {held}, and this job reserves nodes once "
        "that one has started"
    )


def outranked_no_drain(waited: float, bound: float, min_run: float) -> str:
    return (
        f"waiting: {num(waited)} s, over the {num(bound)} s starvation bound, but no nodes drain "
        "for it while work its queue ranks above it waits: that work would preempt it once it "
        f"had run {num(min_run)} s; it starts where room frees up, and its total wait promotes "
        "it in time"
    )


def waiting(body: str) -> str:
    return f"waiting: {body}"


# -- never fits -------------------------------------------------------------------------------


def no_such_model(model: str) -> str:
    return f"never fits: no node has GPU model {model}"


def replica_too_big(shape: Shape, largest: int) -> str:
    model, g = shape[0], shape[1]
    return (
        f"never fits: needs {n_gpus(g)} per replica, more than any {of_model(model)}node has "
        f"({largest})"
    )


def replica_resources_too_big(shape: Shape) -> str:
    g, c, m, d = shape[1], shape[3], shape[4], shape[6]
    with_gpus = f" with {n_gpus(g)}" if g > 0 else ""
    if d > 0:
        return (
            f"never fits: no node{with_gpus} has {n_rdma(d)}, {n_cores(c)} and {gib(m)} GiB of "
            "memory for one replica"
        )
    return (
        f"never fits: no node{with_gpus} has {n_cores(c)} and {gib(m)} GiB of memory for one "
        "replica"
    )


def cluster_too_small(shape: Shape, total: int, room: int) -> str:
    model, g, r = shape[0], shape[1], shape[2]
    if g * r > total:
        return (
            f"never fits: needs {g * r} GPUs in total, more than the whole cluster has "
            f"({total} {of_model(model)}GPUs)"
        )
    return f"never fits: {r} replicas of {n_gpus(g)}, and the whole cluster holds only {room}"


def only_excluded(excluded: Sequence[str]) -> str:
    return (
        f"never fits: only nodes it failed on before ({node_list(sorted(excluded))}) could hold "
        "it, and they stay excluded"
    )


def over_queue_limit(need: int, limit: int) -> str:
    return f"never fits: needs {need} GPUs, more than its queue's limit of {limit}"


def over_cpu_quota(need: float, quota: float) -> str:
    return f"never fits: needs {n_cores(need)}, more than the tenant's CPU quota of {amount(quota)}"


def over_memory_quota(need_mib: int, quota_mib: int) -> str:
    return (f"never fits: needs {gib(need_mib)} GiB of memory, more than the tenant's memory "
            f"quota of {gib(quota_mib)} GiB")


def over_rdma_quota(need: int, quota: int) -> str:
    return (f"never fits: needs {n_rdma(need)}, more than the tenant's RDMA quota of "
            f"{quota}")


def negative_request() -> str:
    return "never fits: it asks for a negative amount of GPUs, CPU or memory"


def no_replicas() -> str:
    return "never fits: it has no replicas to place"


# -- starts and preemptions --------------------------------------------------------------------


def admitted(used: int, quota: int) -> str:
    return f"admitted: tenant quota {used}/{quota} GPUs"


def borrowed(used: int, quota: int, need: int) -> str:
    return (
        f"borrowed: over the tenant's quota or a GPU model limit (quota {used}/{quota} GPUs in "
        f"use, job needs {need}), so it runs on idle capacity until its owner reclaims it"
    )


def after_preempting(reason: str, job_ids: Sequence[int]) -> str:
    return f"{reason}, after preempting job {', '.join(str(i) for i in job_ids)}"


def after_waiting(reason: str, waited: float) -> str:
    return f"{reason}, after waiting {num(waited)} s (over the starvation bound)"


def preempted_by(job_id: int, priority: int) -> str:
    return f"preempted by job {job_id} (priority {priority})"


def preempted_for_less_served(job_id: int, attained_gpu_s: float, was: int, now: int) -> str:
    return (f"preempted for job {job_id}, which has had less service: attained "
            f"{attained_gpu_s / 3600:.1f} GPU-hours, {_levels(was, now)}")


def preempted_for_promoted(
    job_id: int, waited_s: float, attained_gpu_s: float, was: int, now: int
) -> str:
    return (f"preempted for job {job_id}, promoted after waiting {waited_s / 3600:.1f} h in "
            f"all: attained {attained_gpu_s / 3600:.1f} GPU-hours, {_levels(was, now)}")


def _levels(was: int, now: int) -> str:
    return f"level {was} → {now}" if now != was else f"level {now}"


def reclaimed(tenant: str, job_id: int) -> str:
    return f"reclaimed: tenant {tenant} needs its quota back for job {job_id}"
