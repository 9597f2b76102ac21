"""Small pieces every driver shares, so that they all word statuses the same way."""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Sequence

from podsys.drivers.base import (
    DriverError,
    EnvironmentInfo,
    Phase,
    ReplicaStatus,
    Workload,
    WorkloadStatus,
)

# A DNS-1123 label: the id becomes a folder name or a Kubernetes name, so nothing else may pass.
_WORKLOAD_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def network_summary(workload: Workload) -> str:
    """The network a workload asks for, in words: "attachments ib, roce; 2 RDMA devices per
    replica", or "default network only"."""
    parts = []
    if workload.networks:
        parts.append(f"attachments {', '.join(workload.networks)}")
    if workload.resources.rdma:
        count = workload.resources.rdma
        parts.append(f"{count} RDMA device{'' if count == 1 else 's'} per replica")
    return "; ".join(parts) or "default network only"


def is_valid_workload_id(workload_id: str) -> bool:
    return bool(_WORKLOAD_ID.match(workload_id))


def check_workload_id(workload_id: str) -> None:
    if not is_valid_workload_id(workload_id):
        raise DriverError(
            f"invalid workload id {workload_id!r}: it must be a DNS-1123 label "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )


def check_workload_shape(workload: Workload) -> None:
    """What every driver refuses: no replicas, no command, a placement that does not name a
    node for each replica."""
    if workload.replicas < 1:
        raise DriverError(f"workload {workload.id} has {workload.replicas} replicas")
    if not workload.command:
        raise DriverError(f"workload {workload.id} has no command")
    if workload.placement and len(workload.placement) != workload.replicas:
        raise DriverError(f"workload {workload.id} places {len(workload.placement)} replicas "
                          f"but has {workload.replicas}")


def exit_reason(exit_code: int) -> str:
    """'exit code 3', or 'killed by signal SIGKILL' for a negative (signal) code."""
    if exit_code >= 0:
        return f"exit code {exit_code}"
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        name = f"signal {-exit_code}"
    return f"killed by signal {name}"


def finished_replica(
    index: int, exit_code: int, *, node: str = "", reason: str = ""
) -> ReplicaStatus:
    phase = Phase.SUCCEEDED if exit_code == 0 else Phase.FAILED
    text = reason or ("" if exit_code == 0 else exit_reason(exit_code))
    return ReplicaStatus(index=index, phase=phase, node=node, exit_code=exit_code, reason=text)


def summarize(
    workload_id: str,
    replicas: list[ReplicaStatus],
    *,
    failed_at: dict[int, float] | None = None,
    node_lost: str = "",
) -> WorkloadStatus:
    """The workload's phase from its replicas: FAILED as soon as one fails (the first to fail
    speaks for the workload: a rank that crashed, not the ranks that then timed out waiting for
    it), SUCCEEDED when all succeeded, RUNNING otherwise."""
    failed = [r for r in replicas if r.phase == Phase.FAILED]
    if failed:
        times = failed_at or {}
        first = min(failed, key=lambda r: (times.get(r.index, math.inf), r.index))
        return WorkloadStatus(
            workload_id=workload_id,
            phase=Phase.FAILED,
            exit_code=first.exit_code,
            reason=first.reason,
            replicas=tuple(replicas),
            node_lost=node_lost,
        )
    if replicas and all(r.phase == Phase.SUCCEEDED for r in replicas):
        return WorkloadStatus(
            workload_id=workload_id, phase=Phase.SUCCEEDED, exit_code=0, replicas=tuple(replicas)
        )
    pending = any(r.phase == Phase.PENDING for r in replicas)
    return WorkloadStatus(
        workload_id=workload_id,
        phase=Phase.PENDING if pending else Phase.RUNNING,
        replicas=tuple(replicas),
        node_lost=node_lost,
    )


def missing(workload_id: str) -> WorkloadStatus:
    return WorkloadStatus(workload_id=workload_id, phase=Phase.MISSING, reason="unknown workload")


def tail_lines(text: str, tail: int | None) -> str:
    if tail is None:
        return text
    if tail <= 0:
        return ""
    return "".join(text.splitlines(keepends=True)[-tail:])


def describe_environments(offered: Sequence[EnvironmentInfo]) -> str:
    """'platform (Python 3.11.9, torch 2.13.0), bare (Python 3.11.9, no torch)'."""
    return ", ".join(f"{env.name} ({environment_summary(env)})" for env in offered) or "none"


def environment_summary(env: EnvironmentInfo) -> str:
    """What the environment holds, or why it cannot run jobs (a local one's `problem`)."""
    problem = getattr(env, "problem", "")
    if problem:
        return f"unusable: {problem}"
    if not env.python:
        return f"image {env.where}" if env.where else "versions unknown"
    return f"Python {env.python}, " + (f"torch {env.torch}" if env.torch else "no torch")
