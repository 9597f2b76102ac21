"""The trace replay report: one table per stressed cluster and a chart of the JCT distributions.

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


def write_report(lines: list[dict], jcts: dict, summary: dict, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    chart = folder / "trace_replay_jct_cdf.png"
    _chart(jcts, chart)
    out = [
        "# Trace replay: the scheduler core on real GPU job traces",
        "",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"(Python {platform.python_version()}) by `python bench/trace_replay.py --report`.",
        "Traces: Microsoft ITP 2021 (`../shared/data/traces/microsoft-itp-2021/`, MIT licence). "
        "Nodes of 8 GPUs; a job of more than 8 GPUs takes whole nodes; a preempted job keeps "
        "its progress and pays 60 s on its GPUs at each restart. `fair` is the platform's "
        "default policy, with its default settings; `srtf-oracle` knows every job's remaining "
        "time (a reference, not deployable). Times in hours.",
        "",
        "## Targets",
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
    for trace in sorted({line["trace"] for line in lines}):
        rows = [line for line in lines if line["trace"] == trace]
        out += [
            "",
            f"## {trace} on {rows[0]['nodes']} nodes ({rows[0]['jobs']:,} jobs, average "
            f"duration {hours(rows[0]['lower_bound_s'])}: the lower bound of the average JCT)",
            "",
            "| policy | " + " | ".join(label for _, label in COLUMNS)
            + " | GPUs allocated while jobs wait | preemptions per job | replay wall |",
            "|---|" + "---:|" * (len(COLUMNS) + 3),
        ]
        for line in rows:
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
