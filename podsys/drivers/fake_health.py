"""What a health probe prints on a simulated node, for the `fake` driver: the result a healthy
machine of that shape gives, or a failing one where a test injected a fault
(`FakeCluster.inject_fault`). Simulated hardware: the platform's real checks judge the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from podsys.health.result import format_result, measured

SIMULATED_DRIVER = "550.127.05"


@dataclass(frozen=True)
class Fault:
    """What a probe finds on a faulty node: a failing result with this summary and details,
    or, with `hang`, nothing ever (a probe stuck on a wedged GPU)."""

    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    hang: bool = False


def _option(command: tuple[str, ...], name: str, default: str) -> str:
    for index, arg in enumerate(command[:-1]):
        if arg == name:
            return command[index + 1]
    return default


def _healthy(check: str, command: tuple[str, ...], gpus: int, gpu_model: str
             ) -> tuple[bool, str, dict[str, Any]]:
    """(ok, summary, details) of a probe on a healthy node with `gpus` GPUs, told what the
    command line tells it."""
    expected = int(_option(command, "--expect-gpus", "0") or 0)
    if check == "gpu-presence":
        details = {"found": gpus, "expected": expected, "models": [gpu_model] if gpus else []}
        if expected <= 0:
            return True, "no GPUs expected", details
        if gpus < expected:
            return False, f"{gpus} of {expected} GPUs found", details
        return True, f"all {expected} GPUs present ({gpu_model})", details
    if check == "driver-version":
        # The stack deployment installed what was asked for.
        version = _option(command, "--expect-driver", "") or SIMULATED_DRIVER
        return True, f"driver {version}", {"driver": version}
    if check == "nccl-allreduce":
        return True, "all-reduce bus bandwidth 180.00 GB/s (simulated)", {"busbw_gbps": 180.0}
    if check == "network":
        return True, "reached all addresses (simulated)", {}
    if expected <= 0:
        return True, "no GPUs expected", {}
    return True, f"healthy on {gpus} GPUs (simulated)", {}


def probe_line(check: str, command: tuple[str, ...], *, gpus: int, gpu_model: str,
               fault: Fault | None) -> str:
    """The `OGAI-HEALTH-RESULT` line the probe prints."""
    if fault is not None:
        return format_result(measured(check, False, fault.summary, dict(fault.details)))
    ok, summary, details = _healthy(check, command, gpus, gpu_model)
    return format_result(measured(check, ok, summary, details))
