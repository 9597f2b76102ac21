"""The trace replay report: the sweep's targets and its table of every case, a scatter of average
JCT against longest wait per policy, one table per stressed cluster and their JCT distributions.

Written by `python bench/trace_replay.py --report` (needs matplotlib: `pip install -e '.[bench]'`,
or `make trace-report`, which does both).
"""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from pathlib import Path

COLUMNS = (
    ("avg_jct_s", "avg JCT"),
    ("median_jct_s", "median JCT"),
    ("p99_jct_s", "p99 JCT"),
    ("avg_queue_s", "avg queue"),
    ("p99_queue_s", "p99 queue"),
    ("max_queue_s", "max queue"),
    ("makespan_s", "makespan"),
)
TARGETS = (
    ("jct_vs_fifo", "fair avg JCT / fifo's", {"cluster04": 0.55, "cluster07": 0.55,
                                                 "cluster03": 0.35}),
    ("jct_vs_oracle", "fair avg JCT / srtf-oracle's", {"cluster04": 1.15, "cluster07": 1.15}),
    ("max_queue_vs_fifo", "fair max queue / fifo's", {"cluster04": 1.5, "cluster07": 1.5,
                                                       "cluster03": 1.5}),
    ("preemptions_per_job", "fair preemptions per job", {"cluster04": 1.0, "cluster07": 1.0,
                                                          "cluster03": 1.0}),
)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


SWEEP_TARGETS = (
    ("jct_vs_las_max", "worst case: fair avg JCT / las's", 1.0),
    ("preemptions_per_job_max", "worst case: fair preemptions per job", 1.0),
    ("max_wait_vs_fifo_max", "worst case: fair longest wait / fifo's", 2.0),
    ("median_jct_vs_oracle", "median over the cases: fair avg JCT / srtf-oracle's", 1.20),
    ("sweep_wall_s", "the whole sweep, seconds", 600),
)


def write_report(lines: list[dict], jcts: dict, summary: dict, rows: list[dict],
                 folder: Path, stressed: tuple = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    chart = folder / "trace_replay_jct_cdf.png"
    _chart({key: value for key, value in jcts.items() if key[:2] in stressed}, chart)
    scatter = folder / "trace_replay_sweep.png"
    _scatter(lines, rows, scatter)
    out = [
        "# Trace replay: the scheduler core on real GPU job traces",
        "",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"(Python {platform.python_version()}) by `python bench/trace_replay.py --report`.",
        "Traces: Microsoft ITP 2021 (`../shared/data/traces/microsoft-itp-2021/`, MIT licence). "
        "Nodes of 8 GPUs; a job of more than 8 GPUs takes whole nodes; a preempted job keeps "
        "its progress and pays 60 s on its GPUs at each restart. `fair` is the platform's "
        "default policy, with its default settings. Two references no queue can use: `las` is "
        "Tiresias' textbook least-attained service (3,600 / 36,000 / 360,000 GPU-s, preemption "
        "at once, no promotion) and `srtf-oracle` knows every job's remaining time. Times in "
        "hours.",
        "",
        "## The sweep: every ITP cluster at 87% and 95% load",
        "",
        f"{summary['cases_met']} of {summary['cases']} cases meet all three per-case targets "
        "(fair avg JCT at most las's, at most 1 preemption per job, longest wait at most 2x "
        f"fifo's). las's own median avg JCT / srtf-oracle's: {summary['median_las_vs_oracle']}.",
        "",
        "| target | measured | limit | met |",
        "|---|---:|---:|:---:|",
    ]
    for key, label, limit in SWEEP_TARGETS:
        value = summary[key]
        out.append(f"| {label} | {value} | {limit} | {'yes' if value <= limit else 'no'} |")
    out += [
        "",
        "Average JCT in hours; N = max(ceil(busy GPUs / (load x 8)), nodes of the largest job).",
        "",
        "| cluster | load | nodes | fifo | backfill | las | fair | srtf-oracle | fair / las "
        "| fair / oracle | preemptions per job | longest wait fair / fifo (h) | missed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        out.append(
            f"| {row['trace']} | {row['load']:.0%} | {row['nodes']} | {row['fifo_jct_h']} | "
            f"{row['backfill_jct_h']} | {row['las_jct_h']} | {row['fair_jct_h']} | "
            f"{row['srtf-oracle_jct_h']} | {row['jct_vs_las']} | {row['jct_vs_oracle']} | "
            f"{row['preemptions_per_job']} | {row['fair_max_wait_h']} / "
            f"{row['fifo_max_wait_h']} | {', '.join(row['missed']) or '-'} |")
    out += [
        "",
        f"![Average JCT against longest wait, every case and policy]({scatter.name})",
        "",
        "## The stressed clusters",
        "",
        "| target | cluster | measured | limit | met |",
        "|---|---|---:|---:|:---:|",
    ]
    for key, label, limits in TARGETS:
        for trace, limit in limits.items():
            value = summary.get(f"{trace}_{key}")
            if value is None:
                continue
            out.append(f"| {label} | {trace} | {value:.3f} | {limit} | "
                       f"{'yes' if value <= limit else 'no'} |")
    for trace, nodes in stressed:
        runs = [line for line in lines if (line["trace"], line["nodes"]) == (trace, nodes)]
        if not runs:
            continue
        out += [
            "",
            f"### {trace} on {nodes} nodes ({runs[0]['jobs']:,} jobs, average "
            f"duration {hours(runs[0]['lower_bound_s'])}: the lower bound of the average JCT)",
            "",
            "| policy | " + " | ".join(label for _, label in COLUMNS)
            + " | GPUs allocated while jobs wait | preemptions per job | replay wall |",
            "|---|" + "---:|" * (len(COLUMNS) + 3),
        ]
        for line in runs:
            allocation = line["gpu_allocation_while_waiting"]
            out.append(
                f"| {line['policy']} | "
                + " | ".join(hours(line[key]) for key, _ in COLUMNS)
                + f" | {allocation:.1%} | {line['preemptions_per_job']:.2f} | "
                f"{line['wall_s']:.1f} s |"
            )
    out += ["", f"![JCT distributions per policy]({chart.name})", ""]
    report = folder / "trace_replay.md"
    report.write_text("\n".join(out))
    return report


def _chart(jcts: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({key[:2] for key in jcts})
    fig, axes = plt.subplots(1, len(traces), figsize=(5 * len(traces), 4), squeeze=False)
    for ax, (trace, nodes) in zip(axes[0], traces, strict=True):
        for (t, n, policy), values in sorted(jcts.items()):
            if (t, n) != (trace, nodes):
                continue
            ordered = sorted(v / 3600 for v in values)
            ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))],
                    label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("job completion time (hours, log scale)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{trace} on {nodes} nodes")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scatter(lines: list[dict], rows: list[dict], path: Path) -> None:
    """Each case's average JCT and longest wait per policy, both over fifo's: the trade-off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(line["trace"], line["nodes"], line["policy"]): line for line in lines}
    fig, ax = plt.subplots(figsize=(7, 5))
    for policy in dict.fromkeys(line["policy"] for line in lines):
        points = []
        for row in rows:
            fifo, own = (by[(row["trace"], row["nodes"], name)] for name in ("fifo", policy))
            if fifo["max_queue_s"] and fifo["avg_jct_s"]:
                points.append((own["max_queue_s"] / fifo["max_queue_s"],
                               own["avg_jct_s"] / fifo["avg_jct_s"]))
        ax.scatter([x for x, _ in points], [y for _, y in points], label=policy, alpha=0.7)
    ax.axvline(2.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("longest wait / fifo's (log scale)")
    ax.set_ylabel("average JCT / fifo's (log scale)")
    ax.set_title(f"{len(rows)} cases: every ITP cluster at two loads")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
