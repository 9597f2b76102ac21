"""Replay real GPU job traces through the platform's scheduler core and compare policies.

Each run replays one trace of `../shared/data/traces/microsoft-itp-2021/` (69,351 training jobs
from ten Microsoft clusters; MIT licence, see the LICENSE.txt there) on N simulated nodes of 8 GPUs
with `aistation.scheduler.replay`, which calls the same `schedule` as the platform's cycle, and
prints one JSON line. Policies: `fifo`, `backfill`, `fair` (the platform's duration-agnostic
default) and `srtf-oracle` (shortest remaining time first with the trace's durations, preemptive:
a reference, not deployable).

    python bench/trace_replay.py --trace cluster04 --nodes 71 --policy fair
    python bench/trace_replay.py --all       # every policy on the stressed sizes, then targets
    python bench/trace_replay.py --light     # every policy on the lighter sizes
    python bench/trace_replay.py --scale     # all ten traces merged on 1,250 nodes
    python bench/trace_replay.py --report    # --all, then bench/results/trace_replay.md + PNG

The last line is always one JSON object: the run's figures, or with --all the targets' ratios.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler_cycle import percentile  # noqa: E402  (bench/ is the script's folder)

from aistation.scheduler.policies import BACKFILL, FAIR, FIFO  # noqa: E402
from aistation.scheduler.replay import Replay, ReplayResult, TraceJob, remaining_s  # noqa: E402

TRACES = Path(os.environ.get("OGAI_TRACES_DIR", REPO.parent / "shared" / "data" / "traces"))
ITP = "microsoft-itp-2021"
ORACLE = "srtf-oracle"
POLICIES = (FIFO, BACKFILL, FAIR, ORACLE)
STRESSED = (("cluster04", 71), ("cluster07", 37), ("cluster03", 20))
LIGHT = (("cluster04", 128), ("cluster07", 128), ("cluster03", 64))
RESTART_OVERHEAD_S = 60.0
SCALE_NODES = 1250
SCALE_LOAD = 0.85


def load_trace(name: str, limit: int | None = None) -> list[TraceJob]:
    path = TRACES / ITP / f"{name}.csv"
    if not path.exists():
        raise SystemExit(f"No trace {path}: set OGAI_TRACES_DIR to the folder holding {ITP}/.")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))[:limit]
    return [
        TraceJob(i, float(r["submission_time"]), float(r["duration"]), int(r["num_gpu"]))
        for i, r in enumerate(rows)
    ]


def replay(jobs: list[TraceJob], nodes: int, policy: str, **options) -> tuple[ReplayResult, float]:
    rank = None
    queue_policy = policy
    if policy == ORACLE:
        # Priority = minus the remaining seconds: the core's priority preemption makes it SRTF.
        queue_policy = BACKFILL

        def rank(job, now):
            return -int(remaining_s(job, now, RESTART_OVERHEAD_S))

    started = time.perf_counter()
    result = Replay(
        jobs, nodes=nodes, policy=queue_policy, rank=rank,
        restart_overhead_s=RESTART_OVERHEAD_S, **options,
    ).run()
    return result, time.perf_counter() - started


def figures(trace: str, nodes: int, policy: str, result: ReplayResult, wall_s: float) -> dict:
    jct, queue = result.jct_s, result.queue_s
    return {
        "trace": trace,
        "nodes": nodes,
        "policy": policy,
        "jobs": result.jobs,
        "avg_jct_s": round(statistics.fmean(jct), 1),
        "median_jct_s": round(statistics.median(jct), 1),
        "p99_jct_s": round(percentile(jct, 0.99), 1),
        "avg_queue_s": round(statistics.fmean(queue), 1),
        "p99_queue_s": round(percentile(queue, 0.99), 1),
        "max_queue_s": round(max(queue), 1),
        "makespan_s": round(result.makespan_s, 1),
        "gpu_allocation_while_waiting": round(
            result.waiting_allocated_gpu_s / result.waiting_capacity_gpu_s, 4)
        if result.waiting_capacity_gpu_s else None,
        "preemptions": result.preemptions,
        "preemptions_per_job": round(result.preemptions / result.jobs, 3),
        "lower_bound_s": round(statistics.fmean(result.durations_s), 1),
        "restart_overhead_gpu_h": round(result.overhead_gpu_s / 3600, 1),
        "cycles": result.cycles,
        "wall_s": round(wall_s, 2),
    }


def run_one(trace: str, nodes: int, policy: str, limit: int | None = None) -> tuple[dict, list]:
    result, wall_s = replay(load_trace(trace, limit), nodes, policy)
    line = figures(trace, nodes, policy, result, wall_s)
    print(json.dumps(line), flush=True)
    return line, result.jct_s


def run_sizes(sizes, limit: int | None = None) -> tuple[list[dict], dict]:
    lines, jcts = [], {}
    for trace, nodes in sizes:
        for policy in POLICIES:
            line, jct = run_one(trace, nodes, policy, limit)
            lines.append(line)
            jcts[(trace, nodes, policy)] = jct
    return lines, jcts


def targets(lines: list[dict]) -> dict:
    """The issue's targets, as ratios measured side by side in this run."""
    by = {(line["trace"], line["policy"]): line for line in lines}
    out: dict = {}
    for trace, _ in STRESSED:
        fair, fifo, oracle = by.get((trace, FAIR)), by.get((trace, FIFO)), by.get((trace, ORACLE))
        if not (fair and fifo and oracle):
            continue
        out[f"{trace}_jct_vs_fifo"] = round(fair["avg_jct_s"] / fifo["avg_jct_s"], 3)
        out[f"{trace}_jct_vs_oracle"] = round(fair["avg_jct_s"] / oracle["avg_jct_s"], 3)
        out[f"{trace}_max_queue_vs_fifo"] = round(fair["max_queue_s"] / fifo["max_queue_s"], 3)
        out[f"{trace}_preemptions_per_job"] = fair["preemptions_per_job"]
        out[f"{trace}_fair_wall_s"] = fair["wall_s"]
    return out


# -- the scale run -----------------------------------------------------------------------------


def merged_trace(load: float, nodes: int) -> tuple[list[TraceJob], float]:
    """All ten traces merged by submission time, submissions compressed so the offered load on
    `nodes` x 8 GPUs is `load`. Returns the jobs and the compression factor."""
    jobs: list[TraceJob] = []
    files = sorted((TRACES / ITP).glob("cluster*.csv"))
    for f in files:
        jobs.extend(load_trace(f.stem))
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    gpu_s = sum(j.gpus * j.duration_s for j in jobs)
    span = max(j.submitted_at for j in jobs) - min(j.submitted_at for j in jobs)
    factor = (gpu_s / (load * nodes * 8)) / span  # new span / old span
    return [
        TraceJob(i, j.submitted_at * factor, j.duration_s, j.gpus) for i, j in enumerate(jobs)
    ], factor


def scale_run(limit_s: float | None, load: float = SCALE_LOAD) -> dict:
    jobs, factor = merged_trace(load, SCALE_NODES)
    if limit_s is not None:
        start = jobs[0].submitted_at
        jobs = [j for j in jobs if j.submitted_at - start <= limit_s]
    started = time.perf_counter()
    replay_ = Replay(jobs, nodes=SCALE_NODES, policy=FAIR, restart_overhead_s=RESTART_OVERHEAD_S,
                     time_cycles=True)
    result = replay_.run()
    wall_s = time.perf_counter() - started
    ms = [s * 1000 for s in result.cycle_s]
    # Decision time as the backlog grows: by backlog size, in powers of two.
    buckets: dict[int, list[float]] = {}
    for cycle_ms, backlog in zip(ms, result.backlog, strict=True):
        buckets.setdefault(1 << max(0, backlog.bit_length() - 1), []).append(cycle_ms)
    for low in sorted(buckets):
        times = buckets[low]
        print(json.dumps({"backlog_from": low, "cycles": len(times),
                          "cycle_ms_p50": round(statistics.median(times), 2),
                          "cycle_ms_p99": round(percentile(times, 0.99), 2),
                          "cycle_ms_max": round(max(times), 2)}), flush=True)
    return {
        "trace": "all-ten-merged", "nodes": SCALE_NODES, "policy": FAIR, "jobs": result.jobs,
        "offered_load": load, "time_compression": round(factor, 4),
        "cycles": result.cycles, "max_backlog": max(result.backlog, default=0),
        "cycle_ms_p50": round(statistics.median(ms), 2),
        "cycle_ms_p99": round(percentile(ms, 0.99), 2),
        "cycle_ms_max": round(max(ms), 2),
        "avg_jct_s": round(statistics.fmean(result.jct_s), 1),
        "preemptions": result.preemptions, "wall_s": round(wall_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="cluster04")
    parser.add_argument("--nodes", type=int, default=71)
    parser.add_argument("--policy", default=FAIR, choices=POLICIES)
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--all", action="store_true", help="every policy on the stressed sizes")
    parser.add_argument("--light", action="store_true", help="every policy on the lighter sizes")
    parser.add_argument("--scale", action="store_true", help="all traces merged, 1,250 nodes")
    parser.add_argument("--scale-hours", type=float,
                        help="with --scale, replay only the first H hours of submissions")
    parser.add_argument("--scale-load", type=float, default=SCALE_LOAD,
                        help="with --scale, the offered load the submissions are compressed to")
    parser.add_argument("--report", action="store_true",
                        help="--all, then write bench/results/trace_replay.md and its chart")
    args = parser.parse_args()
    if args.scale:
        limit_s = args.scale_hours * 3600 if args.scale_hours else None
        print(json.dumps(scale_run(limit_s, args.scale_load)))
    elif args.all or args.report:
        lines, jcts = run_sizes(STRESSED, args.limit)
        summary = targets(lines)
        if args.report:
            from trace_report import write_report

            write_report(lines, jcts, summary, REPO / "bench" / "results")
        print(json.dumps(summary))
    elif args.light:
        run_sizes(LIGHT, args.limit)
    else:
        run_one(args.trace, args.nodes, args.policy, args.limit)


if __name__ == "__main__":
    main()
