"""Replay real GPU job traces through the platform's scheduler core and compare policies.

Each run replays one trace of `../shared/data/traces/microsoft-itp-2021/` (69,351 training jobs
from ten Microsoft clusters; MIT licence, see the LICENSE.txt there) on N simulated nodes of 8 GPUs
with `aistation.scheduler.replay`, which calls the same `schedule` as the platform's cycle, and
prints one JSON line. Policies: `fifo`, `backfill`, `fair` (the platform's duration-agnostic
default) and two references that no queue can use (`aistation.scheduler.references`): `las`
(Tiresias' textbook least-attained service) and `srtf-oracle` (shortest remaining time first with
the trace's durations, preemptive).

    python bench/trace_replay.py --trace cluster04 --nodes 71 --policy fair
    python bench/trace_replay.py --all       # every policy on the stressed sizes, then targets
    python bench/trace_replay.py --light     # every policy on the lighter sizes
    python bench/trace_replay.py --scale     # all ten traces merged on 1,250 nodes
    python bench/trace_replay.py --sweep     # every cluster at 87% and 95% load, then targets
    python bench/trace_replay.py --report    # --sweep, then bench/results/trace_replay.md + PNGs

The last line is always one JSON object: the run's figures, or with --all and --sweep the
targets' ratios.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler_cycle import percentile  # noqa: E402  (bench/ is the script's folder)

from aistation.scheduler.policies import BACKFILL, FAIR, FIFO  # noqa: E402
from aistation.scheduler.references import (  # noqa: E402
    LAS,
    ORACLE,
    LeastAttained,
    ShortestRemaining,
)
from aistation.scheduler.replay import Replay, ReplayResult, TraceJob  # noqa: E402

TRACES = Path(os.environ.get("OGAI_TRACES_DIR", REPO.parent / "shared" / "data" / "traces"))
ITP = "microsoft-itp-2021"
POLICIES = (FIFO, BACKFILL, LAS, FAIR, ORACLE)
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
    reference = {LAS: LeastAttained, ORACLE: lambda: ShortestRemaining(RESTART_OVERHEAD_S)}.get(
        policy)
    started = time.perf_counter()
    result = Replay(
        jobs, nodes=nodes, policy=policy, reference=reference() if reference else None,
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


# -- the sweep: every ITP cluster at two loads --------------------------------------------------

LOADS = (0.87, 0.95)
NODE_GPUS = 8


def busy_gpus(jobs: list[TraceJob]) -> float:
    """GPUs busy on average, as the traces' README computes it: GPU-seconds over the span from
    the first submission to the last end."""
    first = min(j.submitted_at for j in jobs)
    last = max(j.submitted_at + j.duration_s for j in jobs)
    return sum(j.gpus * j.duration_s for j in jobs) / (last - first)


def sweep_nodes(jobs: list[TraceJob], load: float) -> int:
    """N = max(ceil(busy GPUs / (load x 8)), whole nodes for the largest job)."""
    return max(math.ceil(busy_gpus(jobs) / (load * NODE_GPUS)),
               math.ceil(max(j.gpus for j in jobs) / NODE_GPUS))


def sweep_cases() -> list[tuple[str, float, int]]:
    """(trace, load, nodes) for every ITP cluster at every load."""
    cases = []
    for path in sorted((TRACES / ITP).glob("cluster*.csv")):
        jobs = load_trace(path.stem)
        cases += [(path.stem, load, sweep_nodes(jobs, load)) for load in LOADS]
    return cases


@functools.lru_cache(maxsize=2)
def _cached_trace(name: str) -> list[TraceJob]:
    return load_trace(name)


def _sweep_run(task: tuple[str, int, str]) -> tuple[dict, list[float]]:
    trace, nodes, policy = task
    result, wall_s = replay(_cached_trace(trace), nodes, policy)
    return figures(trace, nodes, policy, result, wall_s), result.jct_s


def run_sweep(workers: int = 2) -> tuple[list[dict], dict, list[tuple[str, float, int]]]:
    """Every case under every policy, and the stressed sizes, `workers` runs at a time. A case
    whose N is the same at both loads (the largest job sets it) is run once. Prints one line
    per run as it ends, with the loads it stands for."""
    cases = sweep_cases()
    sizes = list(dict.fromkeys([(t, n) for t, _, n in cases] + list(STRESSED)))
    loads: dict[tuple[str, int], list[float]] = {}
    for trace, load, nodes in cases:
        loads.setdefault((trace, nodes), []).append(load)
    # The biggest traces first, so the last runs to end are short ones.
    tasks = sorted(((t, n, p) for t, n in sizes for p in POLICIES),
                   key=lambda task: -len(_cached_trace(task[0])))
    lines, jcts = [], {}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for line, jct in pool.imap_unordered(_sweep_run, tasks):
            line["loads"] = loads.get((line["trace"], line["nodes"]), [])
            print(json.dumps(line), flush=True)
            lines.append(line)
            jcts[(line["trace"], line["nodes"], line["policy"])] = jct
    order = {task: i for i, task in enumerate((t, n, p) for t, n in sizes for p in POLICIES)}
    lines.sort(key=lambda line: order[(line["trace"], line["nodes"], line["policy"])])
    return lines, jcts, cases


def sweep_rows(lines: list[dict], cases: list[tuple[str, float, int]]) -> list[dict]:
    """One row per case: the default's figures against fifo's, las's and the oracle's, and
    which of the issue's per-case targets it meets."""
    by = {(line["trace"], line["nodes"], line["policy"]): line for line in lines}
    rows = []
    for trace, load, nodes in cases:
        run = {policy: by[(trace, nodes, policy)] for policy in POLICIES}
        fair, fifo, las, oracle = run[FAIR], run[FIFO], run[LAS], run[ORACLE]
        row = {
            "trace": trace, "load": load, "nodes": nodes,
            **{f"{policy}_jct_h": round(run[policy]["avg_jct_s"] / 3600, 2)
               for policy in POLICIES},
            "fifo_max_wait_h": round(fifo["max_queue_s"] / 3600, 1),
            "fair_max_wait_h": round(fair["max_queue_s"] / 3600, 1),
            "jct_vs_las": round(fair["avg_jct_s"] / las["avg_jct_s"], 3),
            "jct_vs_oracle": round(fair["avg_jct_s"] / oracle["avg_jct_s"], 3),
            "las_vs_oracle": round(las["avg_jct_s"] / oracle["avg_jct_s"], 3),
            "preemptions_per_job": fair["preemptions_per_job"],
            "max_wait_vs_fifo": round(fair["max_queue_s"] / fifo["max_queue_s"], 3)
            if fifo["max_queue_s"] else 1.0,
        }
        row["missed"] = [name for name, value, limit in (
            ("jct_vs_las", row["jct_vs_las"], JCT_VS_LAS),
            ("preemptions_per_job", row["preemptions_per_job"], PREEMPTIONS_PER_JOB),
            ("max_wait_vs_fifo", row["max_wait_vs_fifo"], MAX_WAIT_VS_FIFO),
        ) if value > limit]
        rows.append(row)
    return rows


JCT_VS_LAS, PREEMPTIONS_PER_JOB, MAX_WAIT_VS_FIFO, MEDIAN_JCT_VS_ORACLE = 1.0, 1.0, 2.0, 1.20


def sweep_targets(rows: list[dict]) -> dict:
    """The sweep's targets over all cases, measured side by side in this run."""
    return {
        "default": FAIR,
        "cases": len(rows),
        "cases_met": sum(not row["missed"] for row in rows),
        "jct_vs_las_max": max(row["jct_vs_las"] for row in rows),
        "preemptions_per_job_max": max(row["preemptions_per_job"] for row in rows),
        "max_wait_vs_fifo_max": max(row["max_wait_vs_fifo"] for row in rows),
        "median_jct_vs_oracle": round(statistics.median(r["jct_vs_oracle"] for r in rows), 3),
        "median_las_vs_oracle": round(statistics.median(r["las_vs_oracle"] for r in rows), 3),
    }


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
    parser.add_argument("--sweep", action="store_true",
                        help="every ITP cluster at 87%% and 95%% load under every policy")
    parser.add_argument("--report", action="store_true",
                        help="--sweep, then write bench/results/trace_replay.md and its charts")
    args = parser.parse_args()
    if args.sweep or args.report:
        started = time.perf_counter()
        lines, jcts, cases = run_sweep()
        rows = sweep_rows(lines, cases)
        summary = {**sweep_targets(rows), **targets(
            [line for line in lines if (line["trace"], line["nodes"]) in STRESSED])}
        summary["sweep_wall_s"] = round(time.perf_counter() - started, 1)
        if args.report:
            from trace_report import write_report

            write_report(lines, jcts, summary, rows, REPO / "bench" / "results", STRESSED)
        print(json.dumps(summary))
    elif args.scale:
        limit_s = args.scale_hours * 3600 if args.scale_hours else None
        print(json.dumps(scale_run(limit_s, args.scale_load)))
    elif args.all:
        lines, _ = run_sizes(STRESSED, args.limit)
        print(json.dumps(targets(lines)))
    elif args.light:
        run_sizes(LIGHT, args.limit)
    else:
        run_one(args.trace, args.nodes, args.policy, args.limit)


if __name__ == "__main__":
    main()
