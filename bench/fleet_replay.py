"""Replay cluster04 on a fleet of clusters and on an elastic pool, against single clusters.

On the replay core of `bench/trace_replay.py` (`aistation.scheduler.fleet_replay`, the same
scheduler core, dispatcher and scale-up/down rules as the platform), under the default policy:

- dispatch: three clusters of 1/2, 1/3 and 1/6 of N nodes, the trace's jobs dispatched to them
  in submission order, against one cluster of N nodes; N = 71 (the trace at 86% load, the
  stressed size of bench/trace_replay.py) and N = 118 (sized for its 99th percentile of
  demand). Keys `fleet_avg_jct_s`, `single_avg_jct_s` (N = 71), `dispatch_ms_p99`,
  `double_starts`, and the same per N.
- elastic: 32 nodes plus a pool of up to 222 (boot 5 min, cool-down 10 min) against static
  clusters of 118 and 71 nodes. Keys `elastic_*`, `static118_*`, `static71_*` (average JCT,
  GPU-hours paid), `scale_ups` (provisioning requests), `scale_downs` (nodes returned),
  `node_churn_per_day` ((nodes bought + nodes returned) per day of the replay).

    python bench/fleet_replay.py            # everything, the targets on the last line
    python bench/fleet_replay.py --more     # also cluster07 and cluster03, sized by one rule
    python bench/fleet_replay.py --limit 3000

Sizes for another trace, by the rule that gives cluster04's: static clusters at the 99th
percentile of zero-wait demand (every job running from its submission, ceil(busy GPUs / 8)
nodes, time-weighted; cluster04: 118) and at 86% load (bench/trace_replay.py's rule: 71), a base
of half the median demand (31; the issue's 32 is kept for cluster04) and a pool up to the peak
(254 - 32 = 222).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler_cycle import percentile  # noqa: E402
from trace_replay import NODE_GPUS, RESTART_OVERHEAD_S, load_trace, sweep_nodes  # noqa: E402

from aistation.scheduler.fleet_replay import FleetReplay, FleetResult, Pool  # noqa: E402

TRACE = "cluster04"
SPLIT = (1 / 2, 1 / 3, 1 / 6)
BASE, POOL_MAX, BOOT_S, COOL_DOWN_S = 32, 222, 300.0, 600.0
DAY_S = 86400.0


def split(nodes: int, least: int = 1) -> dict[str, int]:
    """Three clusters of 1/2, 1/3 and 1/6 of `nodes` (rounded, the rest to the largest, which
    holds at least `least` nodes: the largest job's; what that adds comes off the others, the
    bigger first, so the fleet has `nodes` nodes in all)."""
    sizes = [max(1, round(nodes * share)) for share in SPLIT]
    sizes[0] = max(least, nodes - sizes[1] - sizes[2])
    while sum(sizes) > nodes and max(sizes[1:]) > 1:
        sizes[1 if sizes[1] >= sizes[2] else 2] -= 1
    return {name: size for name, size in zip(("east", "west", "north"), sizes, strict=True)}


def demand_nodes(jobs) -> tuple[int, int, int]:
    """Zero-wait demand in nodes (every job running from its submission; ceil(GPUs busy / 8)):
    its peak, its time-weighted median and 99th percentile."""
    events = sorted([(j.submitted_at, j.gpus) for j in jobs]
                    + [(j.submitted_at + j.duration_s, -j.gpus) for j in jobs])
    time_at: dict[int, float] = {}
    busy, last = 0, events[0][0]
    for at, change in events:
        nodes = math.ceil(busy / NODE_GPUS)
        time_at[nodes] = time_at.get(nodes, 0.0) + at - last
        busy, last = busy + change, at
    total, seen, marks = sum(time_at.values()), 0.0, {}
    for nodes in sorted(time_at):
        seen += time_at[nodes]
        for share in (0.5, 0.99):
            if share not in marks and seen >= share * total:
                marks[share] = nodes
    return max(time_at), marks[0.5], marks[0.99]


def sizes_for(trace: str, jobs) -> dict[str, int]:
    """The issue's sizes for cluster04; for another trace the same rule: static at the 99th
    percentile of zero-wait demand and at 86% load, a base of half the median demand, a pool
    up to the peak."""
    if trace == TRACE:
        return {"base": BASE, "pool": POOL_MAX, "p99": 118, "loaded": 71}
    peak, median, p99 = demand_nodes(jobs)
    base = max(1, round(median / 2))
    return {"base": base, "pool": peak - base, "p99": p99, "loaded": sweep_nodes(jobs, 0.86)}


def run(case: tuple[str, str, int, int | None]) -> tuple[str, str, int, dict]:
    trace, kind, nodes, limit = case
    jobs = load_trace(trace, limit)
    started = time.perf_counter()
    if kind == "fleet":
        least = math.ceil(max(j.gpus for j in jobs) / NODE_GPUS)
        replay = FleetReplay(jobs, clusters=split(nodes, least),
                             restart_overhead_s=RESTART_OVERHEAD_S)
    elif kind == "elastic":
        pool = sizes_for(trace, jobs)["pool"]  # the same jobs, so the same sizes
        replay = FleetReplay(jobs, clusters={"base": nodes}, restart_overhead_s=RESTART_OVERHEAD_S,
                             pool=Pool("base", pool, BOOT_S, COOL_DOWN_S))
    else:
        replay = FleetReplay(jobs, clusters={"one": nodes}, restart_overhead_s=RESTART_OVERHEAD_S)
    result = replay.run()
    line = figures(trace, kind, nodes, result, time.perf_counter() - started)
    print(json.dumps(line), flush=True)
    return trace, kind, nodes, line


def figures(trace: str, kind: str, nodes: int, r: FleetResult, wall_s: float) -> dict:
    days = r.makespan_s / DAY_S
    return {
        "trace": trace, "case": kind, "nodes": nodes, "jobs": r.jobs,
        "avg_jct_s": round(statistics.fmean(r.jct_s), 1),
        "p99_jct_s": round(percentile(r.jct_s, 0.99), 1),
        "avg_queue_s": round(statistics.fmean(r.queue_s), 1),
        "gpu_hours": round(r.gpu_s_paid / 3600),
        "preemptions": r.preemptions, "moves": r.moves,
        "dispatch_ms_p99": round(percentile(r.dispatch_s, 0.99) * 1000, 3)
        if r.dispatch_s else None,
        "double_starts": r.double_starts, "scale_ups": r.scale_ups,
        "nodes_bought": r.nodes_bought, "scale_downs": r.scale_downs,
        "returned_within_cool_down": r.returned_within_cool_down,
        "peak_pool_nodes": r.peak_pool_nodes,
        "node_churn_per_day": round((r.nodes_bought + r.scale_downs) / days, 2) if days else 0,
        "wall_s": round(wall_s, 1),
    }


def cases(trace: str, limit: int | None) -> list[tuple[str, str, int, int | None]]:
    sizes = sizes_for(trace, load_trace(trace, limit))
    static = dict.fromkeys((sizes["p99"], sizes["loaded"]))
    return ([(trace, "elastic", sizes["base"], limit)]
            + [(trace, "static", n, limit) for n in static]
            + [(trace, "fleet", n, limit) for n in static])


def targets(trace: str, lines: dict, limit: int | None) -> dict:
    sizes = sizes_for(trace, load_trace(trace, limit))
    p99, loaded = sizes["p99"], sizes["loaded"]
    elastic = lines[(trace, "elastic", sizes["base"])]
    s_p99, s_loaded = lines[(trace, "static", p99)], lines[(trace, "static", loaded)]
    fleet, single = lines[(trace, "fleet", loaded)], lines[(trace, "static", loaded)]
    fleet_p99 = lines[(trace, "fleet", p99)]
    # cluster04's keys as the issue names them; another trace's carry its name.
    a, b = ("static118", "static71") if trace == TRACE else (f"static{p99}", f"static{loaded}")
    out = {
        "fleet_avg_jct_s": fleet["avg_jct_s"], "single_avg_jct_s": single["avg_jct_s"],
        "fleet_vs_single": round(fleet["avg_jct_s"] / single["avg_jct_s"], 3),
        f"fleet_avg_jct_s_{p99}": fleet_p99["avg_jct_s"],
        f"single_avg_jct_s_{p99}": s_p99["avg_jct_s"],
        f"fleet_vs_single_{p99}": round(fleet_p99["avg_jct_s"] / s_p99["avg_jct_s"], 3),
        "dispatch_ms_p99": max(fleet["dispatch_ms_p99"], fleet_p99["dispatch_ms_p99"]),
        "double_starts": sum(line["double_starts"] for key, line in lines.items()
                             if key[0] == trace),
        "elastic_avg_jct_s": elastic["avg_jct_s"], f"{a}_avg_jct_s": s_p99["avg_jct_s"],
        f"{b}_avg_jct_s": s_loaded["avg_jct_s"], "elastic_gpu_hours": elastic["gpu_hours"],
        f"{a}_gpu_hours": s_p99["gpu_hours"], f"{b}_gpu_hours": s_loaded["gpu_hours"],
        f"elastic_jct_vs_{a}": round(elastic["avg_jct_s"] / s_p99["avg_jct_s"], 3),
        f"elastic_gpu_hours_vs_{a}": round(elastic["gpu_hours"] / s_p99["gpu_hours"], 3),
        "scale_ups": elastic["scale_ups"], "scale_downs": elastic["scale_downs"],
        "node_churn_per_day": elastic["node_churn_per_day"],
        "returned_within_cool_down": elastic["returned_within_cool_down"],
    }
    if trace != TRACE:
        out = {"trace": trace, "base": sizes["base"], "pool": sizes["pool"], **out}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--more", action="store_true",
                        help="also cluster07 and cluster03, sized by the same rule")
    args = parser.parse_args()
    traces = [TRACE, *(("cluster07", "cluster03") if args.more else ())]
    todo = [case for trace in traces for case in cases(trace, args.limit)]
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        lines = {(trace, kind, nodes): line
                 for trace, kind, nodes, line in pool.imap_unordered(run, todo)}
    for trace in traces[1:]:
        print(json.dumps(targets(trace, lines, args.limit)), flush=True)
    print(json.dumps(targets(TRACE, lines, args.limit)))


if __name__ == "__main__":
    main()
