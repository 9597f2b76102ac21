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
    python bench/fleet_replay.py --limit 3000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler_cycle import percentile  # noqa: E402
from trace_replay import RESTART_OVERHEAD_S, load_trace  # noqa: E402

from aistation.scheduler.fleet_replay import FleetReplay, FleetResult, Pool  # noqa: E402

TRACE = "cluster04"
SPLIT = (1 / 2, 1 / 3, 1 / 6)
FLEET_SIZES = (71, 118)
BASE, POOL_MAX, BOOT_S, COOL_DOWN_S = 32, 222, 300.0, 600.0
DAY_S = 86400.0


def split(nodes: int) -> dict[str, int]:
    """Three clusters of 1/2, 1/3 and 1/6 of `nodes` (rounded, the rest to the largest)."""
    sizes = [round(nodes * share) for share in SPLIT]
    sizes[0] += nodes - sum(sizes)
    return {name: size for name, size in zip(("east", "west", "north"), sizes, strict=True)}


def run(case: tuple[str, int, int | None]) -> tuple[str, int, dict]:
    kind, nodes, limit = case
    jobs = load_trace(TRACE, limit)
    started = time.perf_counter()
    if kind == "fleet":
        replay = FleetReplay(jobs, clusters=split(nodes), restart_overhead_s=RESTART_OVERHEAD_S)
    elif kind == "elastic":
        replay = FleetReplay(jobs, clusters={"base": BASE}, restart_overhead_s=RESTART_OVERHEAD_S,
                             pool=Pool("base", POOL_MAX, BOOT_S, COOL_DOWN_S))
    else:
        replay = FleetReplay(jobs, clusters={"one": nodes}, restart_overhead_s=RESTART_OVERHEAD_S)
    result = replay.run()
    line = figures(kind, nodes, result, time.perf_counter() - started)
    print(json.dumps(line), flush=True)
    return kind, nodes, line


def figures(kind: str, nodes: int, r: FleetResult, wall_s: float) -> dict:
    days = r.makespan_s / DAY_S
    return {
        "case": kind, "nodes": nodes, "jobs": r.jobs,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    cases = [("elastic", BASE, args.limit), ("static", 118, args.limit),
             ("static", 71, args.limit)]
    cases += [("fleet", n, args.limit) for n in FLEET_SIZES]
    cases += [("static", n, args.limit) for n in FLEET_SIZES if n not in (71, 118)]
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        lines = {(kind, nodes): line for kind, nodes, line in pool.imap_unordered(run, cases)}
    elastic, s118, s71 = lines[("elastic", BASE)], lines[("static", 118)], lines[("static", 71)]
    out: dict = {}
    for n in FLEET_SIZES:
        fleet, single = lines[("fleet", n)], lines[("static", n)]
        suffix = "" if n == 71 else f"_{n}"
        out[f"fleet_avg_jct_s{suffix}"] = fleet["avg_jct_s"]
        out[f"single_avg_jct_s{suffix}"] = single["avg_jct_s"]
        out[f"fleet_vs_single{suffix}"] = round(fleet["avg_jct_s"] / single["avg_jct_s"], 3)
    out["dispatch_ms_p99"] = max(lines[("fleet", n)]["dispatch_ms_p99"] for n in FLEET_SIZES)
    out["double_starts"] = sum(line["double_starts"] for line in lines.values())
    out.update({
        "elastic_avg_jct_s": elastic["avg_jct_s"], "static118_avg_jct_s": s118["avg_jct_s"],
        "static71_avg_jct_s": s71["avg_jct_s"], "elastic_gpu_hours": elastic["gpu_hours"],
        "static118_gpu_hours": s118["gpu_hours"], "static71_gpu_hours": s71["gpu_hours"],
        "elastic_jct_vs_static118": round(elastic["avg_jct_s"] / s118["avg_jct_s"], 3),
        "elastic_gpu_hours_vs_static118": round(elastic["gpu_hours"] / s118["gpu_hours"], 3),
        "scale_ups": elastic["scale_ups"], "scale_downs": elastic["scale_downs"],
        "node_churn_per_day": elastic["node_churn_per_day"],
        "returned_within_cool_down": elastic["returned_within_cool_down"],
    })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
