"""Health checks as pluggable classes: what each is called, how bad its failure is, how often it
runs, the command its workload runs on the node, and how its result is judged.

A check's probe (`podsys.health.probes`) runs on the node and already compares what it measured
with what the platform told it to expect (`--expect-gpus`, `--expect-driver`...), since only
the node knows its own PCIe generation or DCGM's verdict; `judge` turns the printed result into
a `Verdict` and adds what only the platform knows.

`node_facts`, built by `podsys.services.health`, is a plain dict:
  python          the interpreter that runs the probe on the node
  node            the node's name
  driver          the cluster driver ("local", "kubernetes", "fake" ...)
  gpus            how many GPUs the node must have
  expected_driver the NVIDIA driver version it must run ("" when nothing says)
  internal_url    where the node reaches the platform (OGAI_INTERNAL_URL)
  peers           addresses of some other nodes of the cluster

Severity: a FATAL check takes the node out of service when its failure is confirmed (see
`podsys.services.health`); a WARNING check only labels the node and shows in the console.
driver-version is a warning: a driver other than the profile's still runs work (CUDA's forward
compatibility), and a driver too broken to run any is caught by gpu-presence, which is fatal.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from podsys.choices import CheckSeverity
from podsys.drivers.common import exit_reason

RUNNER = "podsys.health.run"


@dataclass(frozen=True)
class Verdict:
    """`passed` with a summary for people and what was measured; `error` when the check could
    not be carried out, which says nothing about the node."""

    passed: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    error: bool = False

    @classmethod
    def could_not_run(cls, summary: str, details: dict[str, Any] | None = None) -> Verdict:
        return cls(passed=False, summary=summary, details=details or {}, error=True)


class HealthCheck:
    """One kind of check. Subclass it and name the subclass in OGAI_HEALTH_CHECKS."""

    name: str = ""
    # The `podsys.health.run` subcommand (the name when blank): a subclass configured under
    # another name keeps its parent's probe.
    probe: str = ""
    label: str = ""
    severity: str = CheckSeverity.WARNING
    interval_s: float = 3600
    timeout_s: float = 120
    # Needs the node's GPUs to itself: runs only when no work holds any, and holds them all.
    exclusive: bool = False
    # One gang workload over at least 2 nodes of the cluster, one result per node.
    multi_node: bool = False
    max_nodes: int = 1  # a multi-node check's largest gang

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def arguments(self, node_facts: dict[str, Any]) -> list[str]:
        return ["--expect-gpus", str(int(node_facts.get("gpus", 0)))]

    def command(self, node_facts: dict[str, Any]) -> list[str]:
        return [str(node_facts.get("python") or "python"), "-m", RUNNER,
                self.probe or self.name, *self.arguments(node_facts)]

    def judge(self, exit_code: int | None, result: dict[str, Any] | None,
              node_facts: dict[str, Any]) -> Verdict:
        if result is None:
            how = "it never ended" if exit_code is None else exit_reason(exit_code)
            return Verdict.could_not_run(f"the probe printed no result ({how})")
        if result.get("error"):
            return Verdict.could_not_run(f"could not run: {result['error']}")
        if not isinstance(result.get("ok"), bool):
            return Verdict.could_not_run("the probe's result has no verdict")
        details = result.get("details")
        passed = result["ok"]
        summary = str(result.get("summary") or ("passed" if passed else "failed"))
        return Verdict(passed=passed, summary=summary,
                       details=details if isinstance(details, dict) else {})


class GpuPresence(HealthCheck):
    name = probe = "gpu-presence"
    label = "GPUs present"
    severity = CheckSeverity.FATAL
    interval_s = 300
    timeout_s = 120

    def judge(self, exit_code, result, node_facts) -> Verdict:
        verdict = super().judge(exit_code, result, node_facts)
        expected = int(node_facts.get("gpus", 0))
        found = verdict.details.get("found")
        # A probe told an older count still passes only what the node must have now.
        if verdict.passed and isinstance(found, int) and found < expected:
            return Verdict(passed=False, summary=f"{found} of {expected} GPUs found",
                           details=verdict.details)
        return verdict


class DriverVersion(HealthCheck):
    name = probe = "driver-version"
    label = "NVIDIA driver version"
    severity = CheckSeverity.WARNING
    interval_s = 3600
    timeout_s = 120

    def arguments(self, node_facts):
        return [*super().arguments(node_facts),
                "--expect-driver", str(node_facts.get("expected_driver") or "")]


class RemappedRows(HealthCheck):
    name = probe = "remapped-rows"
    label = "GPU memory remapped rows"
    severity = CheckSeverity.FATAL
    interval_s = 900
    timeout_s = 120


class PowerSlowdown(HealthCheck):
    name = probe = "power-slowdown"
    label = "Power and thermal slowdown"
    severity = CheckSeverity.WARNING
    interval_s = 300
    timeout_s = 120


class PcieBandwidth(HealthCheck):
    name = probe = "pcie-bandwidth"
    label = "PCIe bandwidth"
    severity = CheckSeverity.WARNING
    interval_s = 86400
    timeout_s = 600
    exclusive = True
    size_mib = 256

    def arguments(self, node_facts):
        return [*super().arguments(node_facts), "--size-mib", str(self.size_mib)]


class DcgmDiag(HealthCheck):
    """`dcgmi diag -r level`. Level 1 only reads; levels 2 and more load the GPUs, so a
    subclass with a higher level is exclusive (and takes minutes: raise its timeout)."""

    name = probe = "dcgm-diag"
    label = "DCGM diagnostic"
    severity = CheckSeverity.FATAL
    interval_s = 21600
    timeout_s = 600
    level = 1

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.exclusive = self.level >= 2

    def arguments(self, node_facts):
        return [*super().arguments(node_facts), "--level", str(self.level),
                "--timeout-s", str(max(30, int(self.timeout_s) - 60))]


class NcclAllReduce(HealthCheck):
    """torch.distributed all-reduce over nodes of the cluster, one process per node. The
    floor applies to NCCL (GPUs) only: it catches a fabric fallen back to TCP sockets."""

    name = probe = "nccl-allreduce"
    label = "NCCL all-reduce bandwidth"
    severity = CheckSeverity.WARNING
    interval_s = 86400
    timeout_s = 600
    exclusive = True
    multi_node = True
    min_busbw_gbps = 5.0
    # Nodes per gang: small gangs say which nodes are slow, and one bad node stalls only its own.
    max_nodes = 8

    def arguments(self, node_facts):
        gpus = int(node_facts.get("gpus", 0)) > 0
        return ["--size-mib", "64" if gpus else "16",
                "--min-busbw-gbps", str(self.min_busbw_gbps if gpus else 0),
                "--timeout-s", str(max(30, int(self.timeout_s) - 60))]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NetworkReachability(HealthCheck):
    """TCP to a few other nodes of the cluster (SSH; the kubelet on Kubernetes) and to the
    platform (OGAI_INTERNAL_URL).

    The rule: the node fails only when it reaches fewer than half of the peers it tried (and it
    tried at least one), so one dead peer, or a few, does not cordon the healthy nodes that
    try it. The platform unreachable never fails the node by itself: it shows in the summary and
    the details (a platform outage must not cordon the fleet); a node truly cut off also fails
    on its peers. A loopback platform URL is not tried: seen from another machine it is that
    machine itself, and on the local cluster the node is where the platform runs."""

    name = probe = "network"
    label = "Network reachability"
    severity = CheckSeverity.FATAL
    interval_s = 300
    timeout_s = 120
    peer_port = 22
    kubernetes_peer_port = 10250

    def platform_target(self, node_facts: dict[str, Any]) -> str:
        """The platform's host:port, "" when it is not to be tried."""
        url = urlsplit(str(node_facts.get("internal_url") or ""))
        if not url.hostname or _is_loopback(url.hostname):
            return ""
        port = url.port or (443 if url.scheme == "https" else 80)
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        return f"{host}:{port}"

    def peer_targets(self, node_facts: dict[str, Any]) -> list[str]:
        port = self.kubernetes_peer_port if node_facts.get("driver") == "kubernetes" \
            else self.peer_port
        return [f"[{peer}]:{port}" if ":" in peer else f"{peer}:{port}"
                for peer in node_facts.get("peers", ())]

    def arguments(self, node_facts):
        platform = self.platform_target(node_facts)
        args = ["--platform", platform] if platform else []
        for target in self.peer_targets(node_facts):
            args += ["--target", target]
        return args
