"""How long one scheduling cycle takes at the scale the design promises.

A seeded snapshot: 1,000 nodes of 8 GPUs (two GPU models), about half the GPUs busy with running
jobs (some of them borrowed), five tenants with quotas (one with a model limit) and two queues each
(fair, backfill and fifo, some with limits), and 10,000 pending jobs of 1, 2, 4 and 8 GPUs with
some multi-node gangs, retry backoffs, excluded nodes and jobs past the starvation bound. Most work
runs at the usual priority; a few pending jobs are urgent enough to preempt their tenant's
best-effort work, as in a cluster in steady state. The scheduler core is pure, so every cycle
decides the same snapshot afresh; each cycle fills the idle half of the cluster.

Beside each cycle it times a fixed pure-Python loop (the baseline): this machine is shared, and
the ratio of the two says how fast the cycle is whatever else runs at the time.

Prints a human line, then, last, one JSON object (`cycle_ms_p50`, `cycle_ms_p99`, …). `main()`
merges the dicts of the measurement functions into that object, so more measurements can join.

    OGAI_DATA_DIR=/tmp/sch .venv/bin/python bench/scheduler_cycle.py [--cycles 30]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aistation.scheduler import (
    JobSnap,
    NodeSnap,
    QueueSnap,
    Snapshot,
    TenantSnap,
    schedule,
)

NOW = 100_000.0
NODES = 1_000
GPUS_PER_NODE = 8
PENDING = 10_000


def build_snapshot(seed: int = 7, nodes: int = NODES, pending: int = PENDING) -> Snapshot:
    rng = random.Random(seed)  # noqa: S311  (a reproducible workload, not a secret)
    node_snaps = tuple(
        NodeSnap(
            name=f"fake-node-{i:04d}",
            gpus=GPUS_PER_NODE,
            gpu_model="H100" if i % 5 < 3 else "A100",
            cpu_cores=128,
            memory_mib=1_048_576,
            schedulable=rng.random() > 0.005,
        )
        for i in range(nodes)
    )
    capacity = nodes * GPUS_PER_NODE
    shares = {"ada": 0.30, "bell": 0.20, "curie": 0.20, "dirac": 0.15, "euler": 0.15}
    tenants = tuple(
        TenantSnap(
            name=name,
            gpu_quota=int(capacity * part),
            gpu_model_limits={"H100": int(capacity * part * 0.5)} if name == "curie" else {},
        )
        for name, part in shares.items()
    )
    policies = ("fair", "backfill", "fifo")
    queues: list[QueueSnap] = []
    for t, tenant in enumerate(tenants):
        queues.append(QueueSnap(key=f"{tenant.name}/train", tenant=tenant.name, policy="fair"))
        queues.append(
            QueueSnap(
                key=f"{tenant.name}/batch",
                tenant=tenant.name,
                policy=policies[t % 3],
                gpu_limit=tenant.gpu_quota // 2 if t % 2 else None,
            )
        )
    queue_keys = {t.name: [q.key for q in queues if q.tenant == t.name] for t in tenants}
    names = list(shares)
    weights = list(shares.values())

    # Running work: fill nodes in a random order up to about half the GPUs.
    free = [GPUS_PER_NODE] * nodes
    running: list[JobSnap] = []
    used = {name: 0 for name in names}
    quota = {t.name: t.gpu_quota for t in tenants}
    busy, job_id = 0, 1
    order = list(range(nodes))
    rng.shuffle(order)
    cursor = 0
    while busy < capacity // 2:
        gpus = rng.choice((1, 2, 2, 4, 4, 8))
        node = order[cursor % nodes]
        cursor += 1
        if free[node] < gpus:
            continue
        free[node] -= gpus
        busy += gpus
        tenant = rng.choices(names, weights)[0]
        borrowed = used[tenant] + gpus > quota[tenant] or rng.random() < 0.02
        if not borrowed:
            used[tenant] += gpus
        running.append(
            JobSnap(
                id=job_id,
                tenant=tenant,
                queue=rng.choice(queue_keys[tenant]),
                priority=rng.choices((0, 1, 2), (20, 75, 5))[0],
                submitted_at=NOW - rng.uniform(3_600, 20_000),
                gpus_per_replica=gpus,
                cpu_per_replica=gpus * 8,
                memory_mib_per_replica=gpus * 65_536,
                placement=(node_snaps[node].name,),
                started_at=NOW - rng.uniform(0, 3_600),
                borrowed=borrowed,
                attained_gpu_s=rng.uniform(0, 1e6),
            )
        )
        job_id += 1

    pending_jobs: list[JobSnap] = []
    for _ in range(pending):
        tenant = rng.choices(names, weights)[0]
        if rng.random() < 0.03:
            gpus, replicas = 8, rng.choice((2, 4, 8, 16))
        else:
            gpus, replicas = rng.choices((1, 2, 4, 8), (40, 30, 20, 10))[0], 1
        model = rng.choice(("", "", "", "H100", "A100"))
        excluded: frozenset[str] = frozenset()
        if rng.random() < 0.01:
            excluded = frozenset(node_snaps[rng.randrange(nodes)].name for _ in range(2))
        pending_jobs.append(
            JobSnap(
                id=job_id,
                tenant=tenant,
                queue=rng.choice(queue_keys[tenant]),
                priority=rng.choices((0, 1, 2), (90, 9, 1))[0],
                submitted_at=NOW - rng.uniform(0, 3_600),
                gpus_per_replica=gpus,
                replicas=replicas,
                cpu_per_replica=gpus * 8,
                memory_mib_per_replica=gpus * 65_536,
                gpu_model=model,
                attained_gpu_s=rng.choice((0.0, rng.uniform(0, 1e5))),
                excluded_nodes=excluded,
                not_before=NOW + 60 if rng.random() < 0.02 else 0.0,
            )
        )
        job_id += 1
    return Snapshot(
        now=NOW,
        nodes=node_snaps,
        tenants=tenants,
        queues=tuple(queues),
        running=tuple(running),
        pending=tuple(pending_jobs),
    )


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (0 for no values)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _baseline_loop() -> float:
    """Milliseconds for a fixed loop of a million additions: how fast Python runs right now."""
    started = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i
    return (time.perf_counter() - started) * 1000


def measure_cycle(cycles: int = 100, seed: int = 7) -> dict[str, Any]:
    """Median and p99 wall time of `schedule` on the generated snapshot, in milliseconds, and
    the baseline loop's median timed between the cycles."""
    snapshot = build_snapshot(seed)
    decisions = schedule(snapshot)  # warm up, and show what a cycle decides
    times: list[float] = []
    baseline: list[float] = []
    for _ in range(cycles):
        baseline.append(_baseline_loop())
        started = time.perf_counter()
        schedule(snapshot)
        times.append((time.perf_counter() - started) * 1000)
    p50 = statistics.median(times)
    p99 = percentile(times, 0.99)
    loop = statistics.median(baseline)
    busy = sum(j.gpus for j in snapshot.running)
    print(
        f"scheduler cycle: {len(snapshot.pending)} pending jobs on {len(snapshot.nodes)} nodes "
        f"({busy}/{len(snapshot.nodes) * GPUS_PER_NODE} GPUs busy): median {p50:.1f} ms, "
        f"p99 {p99:.1f} ms over {cycles} cycles; {len(decisions.starts)} starts, "
        f"{len(decisions.preemptions)} preemptions, {len(decisions.waits)} waits "
        f"(baseline loop {loop:.1f} ms: the cycle costs {p50 / loop:.2f} of it)"
    )
    return {
        "cycle_ms_p50": round(p50, 3),
        "cycle_ms_p99": round(p99, 3),
        "baseline_loop_ms_p50": round(loop, 3),
        "cycle_per_baseline": round(p50 / loop, 3),
        "cycles": cycles,
        "pending_jobs": len(snapshot.pending),
        "nodes": len(snapshot.nodes),
        "starts": len(decisions.starts),
        "preemptions": len(decisions.preemptions),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100,
                        help="cycles to time (default 100: a p99 needs that many)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated snapshot")
    parser.add_argument("--jobs", type=int, default=2000,
                        help="jobs for the end-to-end submit-to-running rate (default 2000)")
    parser.add_argument("--no-e2e", action="store_true",
                        help="skip the end-to-end part (it needs PostgreSQL)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    result.update(measure_cycle(args.cycles, args.seed))
    if not args.no_e2e:
        from jobs_throughput import measure_submit_to_running

        e2e = measure_submit_to_running(jobs=args.jobs)
        print(f"end to end: {e2e['e2e_jobs']} jobs from submit to RUNNING in "
              f"{e2e['e2e_seconds']} s on PostgreSQL with the fake driver "
              f"({e2e['submit_to_running_per_s']}/s)")
        result.update(e2e)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
