"""Ray clusters on the local driver (`Workload.ray`): the ports a cluster's nodes listen on and
the command each replica runs (`podsys.drivers.ray_node`).

Every node of every local workload shares this machine's network, so nothing of Ray listens on
its default ports (6379, 8265, 52365, …): the driver picks free ones at launch, kept in the
workload's state so that `ray_addresses` can say where the cluster is. Each sandboxed replica
has its own private /dev/shm, which holds only its own node's object store: Ray's nodes move
objects between their stores over TCP (the object manager's port), as between machines.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import socket
from pathlib import Path
from typing import Any

from podsys.drivers.base import Resources, Workload

RAY_MISSING = ("ray is not installed in the platform's environment: install the ray extra: "
               "pip install 'ogai[ray]'")
# Each node's worker processes take their ports from a range of this many.
WORKER_PORTS = 40
# The smallest object store Ray starts with (its own minimum is 75 MiB).
MIN_OBJECT_STORE_BYTES = 80 * 1024 * 1024
# Where the replicas of a workload meet: a folder of its run folder (shared by every replica).
STATE_FOLDER = ".ogai-ray"
NODE_PORTS = ("node_manager", "object_manager", "dashboard_agent_listen",
              "dashboard_agent_grpc", "runtime_env_agent", "metrics_export")
HEAD_PORTS = ("gcs", "dashboard", "client_server")


def ray_missing() -> str | None:
    """Why the platform's environment cannot run Ray clusters, or None."""
    return None if importlib.util.find_spec("ray") is not None else RAY_MISSING


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free now, held together while picked."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def _free_range(count: int, avoid: set[int]) -> int:
    """The first of `count` consecutive ports free now (outside the kernel's ephemeral range
    the other ports come from, so they seldom meet)."""
    for _ in range(200):
        base = random.randrange(20000, 30000 - count)  # noqa: S311 - not for secrets
        ports = range(base, base + count)
        if avoid.intersection(ports):
            continue
        held = []
        try:
            for port in ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise OSError(f"no {count} consecutive free ports between 20000 and 30000")


def assign_ports(replicas: int) -> dict[str, Any]:
    """The ports of a cluster of `replicas` nodes: the head's and each node's own."""
    picked = _free_ports(len(HEAD_PORTS) + replicas * len(NODE_PORTS))
    head = dict(zip(HEAD_PORTS, picked, strict=False))
    rest = picked[len(HEAD_PORTS):]
    nodes = []
    taken = set(picked)
    for index in range(replicas):
        ports = dict(zip(NODE_PORTS, rest[index * len(NODE_PORTS):], strict=False))
        base = _free_range(WORKER_PORTS, taken)
        taken.update(range(base, base + WORKER_PORTS))
        ports["min_worker"], ports["max_worker"] = base, base + WORKER_PORTS - 1
        nodes.append(ports)
    return {"head": head, "nodes": nodes}


def _node_args(resources: Resources, gpus: int, ports: dict[str, int]) -> list[str]:
    memory = int(resources.memory_mib) * 1024 * 1024
    object_store = max(MIN_OBJECT_STORE_BYTES, memory // 4)
    return [
        f"--num-cpus={max(1, math.floor(resources.cpu_cores))}", f"--num-gpus={gpus}",
        f"--memory={max(memory - object_store, 64 * 1024 * 1024)}",
        f"--object-store-memory={object_store}",
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--min-worker-port={ports['min_worker']}", f"--max-worker-port={ports['max_worker']}",
        f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--metrics-export-port={ports['metrics_export']}",
    ]


def replica_command(workload: Workload, ports: dict[str, Any], *, index: int, python: str,
                    cwd: str, gpus: int, confined: bool) -> list[str]:
    """What replica `index` of a Ray workload runs: the head (0) or a worker."""
    spec = workload.ray
    assert spec is not None
    head = index == 0
    args = _node_args(spec.head if head else spec.worker, gpus, ports["nodes"][index])
    if head:
        head_ports = ports["head"]
        args += [f"--ray-client-server-port={head_ports['client_server']}",
                 f"--include-dashboard={'true' if spec.dashboard else 'false'}",
                 f"--dashboard-port={head_ports['dashboard']}", "--dashboard-host=127.0.0.1"]
    state = Path(cwd) / STATE_FOLDER
    # Inside a sandbox /tmp is the replica's own; outside, the link is named by the workload.
    link = "/tmp/ray" if confined else f"/tmp/ogai-ray-{workload.id}-{index}"  # noqa: S108
    return [
        python, "-m", "podsys.drivers.ray_node", "--role", "head" if head else "worker",
        "--state", str(state), "--nodes", str(workload.replicas),
        "--gcs-port", str(ports["head"]["gcs"]), "--ray-args", json.dumps(args),
        "--temp-dir", str(state / f"node-{index}"), "--temp-link", link,
        "--ready-timeout", str(spec.ready_timeout_s),
        "--", *workload.command,
    ]


def addresses(ports: dict[str, Any], *, dashboard: bool) -> dict[str, str]:
    head = ports["head"]
    return {"gcs": f"127.0.0.1:{head['gcs']}",
            "dashboard": f"http://127.0.0.1:{head['dashboard']}" if dashboard else ""}
