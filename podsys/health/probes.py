"""What each health check measures, ON THE NODE, and what it makes of it.

Each probe returns a result (`result.measured`: ok, a summary for people, the figures) or raises
`ProbeError` when it cannot measure at all (no nvidia-ml-py or libnvidia-ml where GPUs are
expected, no `dcgmi`, no torch): that says nothing about the node. NVML there but its driver
not working (`DriverDown`) is the node's fault: gpu-presence fails on it. Plain Python: no
Django, no platform code but `podsys.health.result`; NVML (nvidia-ml-py) and torch are imported
only when a probe needs them. A node that expects no GPU passes every GPU probe with "no GPUs
expected".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from podsys.health.result import measured

NO_GPUS = "no GPUs expected"

# Clock event (throttle) reasons that mean the hardware slows the GPU down: a power brake
# asserted by the system, an external slowdown, or heat. The software power cap is normal under
# load and not listed.
SLOWDOWN_REASONS = {
    0x08: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}
# Host<->device copy bandwidth an x16 link should reach at least, in GB/s, per PCIe
# generation (about 70% of what a healthy link measures); narrower links scale down.
PCIE_FLOOR_GBPS_X16 = {1: 2.5, 2: 5.0, 3: 9.0, 4: 18.0, 5: 36.0, 6: 72.0}


class ProbeError(Exception):
    """The probe could not measure (the reason is for people)."""


class DriverDown(ProbeError):
    """NVML is there but the NVIDIA driver under it does not work: the node's fault, not the
    check environment's (which a missing nvidia-ml-py or libnvidia-ml is)."""


# nvmlInit errors that mean the driver or the GPUs are broken, not the check's environment.
DRIVER_ERRORS = frozenset({
    "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_IRQ_ISSUE",
})


# NVML ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """pynvml, initialised. DriverDown when NVML will not start for the driver's sake (not
    loaded, out of step with its library, a GPU lost); ProbeError when it cannot be tried (no
    nvidia-ml-py, no libnvidia-ml) or fails otherwise."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ProbeError("nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        codes = {getattr(pynvml, name, None) for name in DRIVER_ERRORS} - {None}
        error = DriverDown if getattr(exc, "value", None) in codes else ProbeError
        raise error(f"NVML did not start: {exc}") from None
    except OSError as exc:
        raise ProbeError(f"NVML did not start: {exc}") from None
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handles(nv: Any) -> tuple[list[tuple[int, Any]], list[str]]:
    """(index, handle) of every GPU NVML can talk to, and one line per GPU it cannot."""
    found, broken = [], []
    for index in range(int(nv.nvmlDeviceGetCount())):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            nv.nvmlDeviceGetName(handle)  # a GPU fallen off the bus fails here
        except nv.NVMLError as exc:
            broken.append(f"GPU {index}: {exc}")
        else:
            found.append((index, handle))
    return found, broken


# The probes ---------------------------------------------------------------------------------


def gpu_presence(*, expect_gpus: int) -> dict[str, Any]:
    """How many GPUs answer NVML, against how many the node must have."""
    check = "gpu-presence"
    try:
        with nvml() as nv:
            found, broken = _handles(nv)
            names = sorted({_text(nv.nvmlDeviceGetName(h)) for _, h in found})
            buses = [_text(nv.nvmlDeviceGetPciInfo(h).busId) for _, h in found]
    except ProbeError as exc:
        if expect_gpus <= 0:
            return measured(check, True, NO_GPUS, {"found": 0, "expected": 0})
        if not isinstance(exc, DriverDown):
            raise  # no nvidia-ml-py or libnvidia-ml here: nothing measured
        return measured(check, False, f"no GPU usable ({exc}); {expect_gpus} expected",
                        {"found": 0, "expected": expect_gpus, "nvml": str(exc)})
    details = {"found": len(found), "expected": expect_gpus, "models": names,
               "pci_bus_ids": buses, "broken": broken}
    if expect_gpus <= 0:
        extra = f"; {len(found)} found" if found else ""
        return measured(check, True, NO_GPUS + extra, details)
    if len(found) >= expect_gpus and not broken:
        return measured(check, True, f"all {expect_gpus} GPUs present ({', '.join(names)})",
                        details)
    summary = f"{len(found)} of {expect_gpus} GPUs found"
    if broken:
        summary += "; " + "; ".join(broken)
    return measured(check, False, summary, details)


def driver_version(*, expect_driver: str, expect_gpus: int) -> dict[str, Any]:
    """The NVIDIA driver NVML reports, against the one the node must run ("550" accepts any
    550.x)."""
    check = "driver-version"
    try:
        with nvml() as nv:
            version = _text(nv.nvmlSystemGetDriverVersion())
    except ProbeError as exc:
        if expect_gpus <= 0:
            return measured(check, True, NO_GPUS, {})
        if not isinstance(exc, DriverDown):
            raise
        return measured(check, False, f"no driver version: {exc}", {"expected": expect_driver})
    details = {"driver": version, "expected": expect_driver}
    if not expect_driver:
        return measured(check, True, f"driver {version} (no version expected)", details)
    if version == expect_driver or version.startswith(expect_driver + "."):
        return measured(check, True, f"driver {version}", details)
    return measured(check, False, f"driver {version}, expected {expect_driver}", details)


def remapped_rows(*, expect_gpus: int) -> dict[str, Any]:
    """Row remapping (A100 and later): a GPU with uncorrectable remapped rows, a remap
    pending (the GPU needs a reset) or a failed remap (the memory is done) is not to be used."""
    check = "remapped-rows"
    if expect_gpus <= 0:
        return measured(check, True, NO_GPUS, {})
    with nvml() as nv:
        found, _ = _handles(nv)
        gpus, problems, unsupported = [], [], 0
        for index, handle in found:
            try:
                correctable, uncorrectable, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
            except nv.NVMLError_NotSupported:
                unsupported += 1
                continue
            except nv.NVMLError as exc:
                raise ProbeError(f"GPU {index}: remapped rows unreadable: {exc}") from None
            gpus.append({"index": index, "correctable": correctable,
                         "uncorrectable": uncorrectable, "pending": bool(pending),
                         "failure": bool(failure)})
            what = []
            if uncorrectable:
                what.append(f"{uncorrectable} uncorrectable remapped rows")
            if pending:
                what.append("a remap pending (reset the GPU)")
            if failure:
                what.append("row remapping failed")
            if what:
                problems.append(f"GPU {index}: " + ", ".join(what))
    details = {"gpus": gpus, "unsupported": unsupported}
    if problems:
        return measured(check, False, "; ".join(problems), details)
    if not gpus:
        return measured(check, True, "row remapping is not supported on these GPUs", details)
    return measured(check, True, f"no uncorrectable or pending remapped rows on {len(gpus)} GPUs",
                    details)


def power_slowdown(*, expect_gpus: int) -> dict[str, Any]:
    """GPUs slowed by the hardware: a power brake, an external slowdown, overheating."""
    check = "power-slowdown"
    if expect_gpus <= 0:
        return measured(check, True, NO_GPUS, {})
    with nvml() as nv:
        found, _ = _handles(nv)
        # Renamed "event reasons" in newer drivers; the bits are the same.
        read = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        gpus, problems = [], []
        for index, handle in found:
            try:
                reasons = int(read(handle))
            except nv.NVMLError as exc:
                raise ProbeError(f"GPU {index}: clock reasons unreadable: {exc}") from None
            active = [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]
            gpus.append({"index": index, "reasons": reasons, "slowdown": active})
            if active:
                problems.append(f"GPU {index}: {', '.join(active)}")
    details = {"gpus": gpus}
    if problems:
        return measured(check, False, "; ".join(problems), details)
    return measured(check, True, f"no hardware slowdown on {len(gpus)} GPUs", details)


def pcie_floor_gbps(generation: int, width: int) -> float:
    base = PCIE_FLOOR_GBPS_X16.get(generation, PCIE_FLOOR_GBPS_X16[max(PCIE_FLOOR_GBPS_X16)])
    return base * max(1, width) / 16


def judge_pcie(gpus: list[dict[str, Any]]) -> tuple[bool, str]:
    """Each GPU's copies against the floor of its link, and its link against what it can do
    (a link trained narrower than its maximum is a seating or riser fault)."""
    problems = []
    for gpu in gpus:
        slow = min(gpu["h2d_gbps"], gpu["d2h_gbps"])
        floor = pcie_floor_gbps(gpu.get("generation") or 0, gpu.get("width") or 16)
        if slow < floor:
            problems.append(f"GPU {gpu['index']}: {slow:.1f} GB/s, below {floor:.1f} GB/s for "
                            f"PCIe gen{gpu.get('generation')} x{gpu.get('width')}")
        if gpu.get("width") and gpu.get("max_width") and gpu["width"] < gpu["max_width"]:
            problems.append(f"GPU {gpu['index']}: link x{gpu['width']} of x{gpu['max_width']}")
    if problems:
        return False, "; ".join(problems)
    slowest = min((min(g["h2d_gbps"], g["d2h_gbps"]) for g in gpus), default=0.0)
    return True, f"{len(gpus)} GPUs, slowest copy {slowest:.1f} GB/s"


def _link(index: int) -> dict[str, int]:
    with contextlib.suppress(ProbeError), nvml() as nv:
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            return {"generation": int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                    "width": int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle)),
                    "max_width": int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle))}
        except nv.NVMLError:
            pass
    return {}


def _copy_gbps(torch: Any, device: Any, target: Any, source: Any, repeats: int) -> float:
    target.copy_(source, non_blocking=True)  # warm up, and train the link to its full speed
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source, non_blocking=True)
    torch.cuda.synchronize(device)
    return source.numel() * repeats / (time.perf_counter() - start) / 1e9


def pcie_bandwidth(*, expect_gpus: int, size_mib: int = 256, repeats: int = 5
                   ) -> dict[str, Any]:
    """Host<->device copy bandwidth of each GPU (pinned memory, torch CUDA), against a floor
    for its PCIe link. Needs the node's GPUs to itself."""
    check = "pcie-bandwidth"
    if expect_gpus <= 0:
        return measured(check, True, NO_GPUS, {})
    # CUDA then numbers GPUs as NVML does, so a GPU's link is read from the right device.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import torch
    except ImportError:
        raise ProbeError("torch is not installed in the check's environment") from None
    if not torch.cuda.is_available():
        raise ProbeError("torch sees no CUDA device")
    size = size_mib * 1024 * 1024
    gpus = []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        on_gpu = torch.empty(size, dtype=torch.uint8, device=device)
        rates = {"h2d_gbps": _copy_gbps(torch, device, on_gpu, host, repeats),
                 "d2h_gbps": _copy_gbps(torch, device, host, on_gpu, repeats)}
        # Read while the link is still trained up: idle links drop to a lower generation.
        gpus.append({"index": index, **{k: round(v, 2) for k, v in rates.items()},
                     **_link(index)})
        del host, on_gpu
    ok, summary = judge_pcie(gpus)
    return measured(check, ok, summary, {"gpus": gpus, "size_mib": size_mib})


def dcgm_outcomes(report: Any) -> list[dict[str, str]]:
    """Every test outcome in `dcgmi diag -j` output ({"DCGM GPU Diagnostic" or "DCGM
    Diagnostic": {"test_categories": [{"tests": [{"name", "results": [{"status", ...}]}]}]}}),
    walked loosely since the layout moves between DCGM versions."""
    outcomes: list[dict[str, str]] = []

    def messages(result: dict) -> str:
        found = []
        for key in ("info", "warnings", "errors", "error", "warning", "msg"):
            value = result.get(key)
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict):
                    item = item.get("warning") or item.get("msg") or item.get("error") or ""
                if item:
                    found.append(str(item))
        return "; ".join(found)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("results"), list) and "name" in node:
                for result in node["results"]:
                    if isinstance(result, dict) and "status" in result:
                        outcomes.append({"test": str(node["name"]),
                                         "status": str(result["status"]).lower(),
                                         "message": messages(result)})
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(report)
    return outcomes


def judge_dcgm(outcomes: list[dict[str, str]], level: int) -> tuple[bool, str]:
    failed = [o for o in outcomes if o["status"] == "fail"]
    if failed:
        what = "; ".join(f"{o['test']}" + (f" ({o['message']})" if o["message"] else "")
                         for o in failed)
        return False, f"DCGM diagnostic level {level} failed: {what}"
    passed = sum(1 for o in outcomes if o["status"] == "pass")
    return True, f"DCGM diagnostic level {level}: {passed} tests passed"


def dcgm_diag(*, expect_gpus: int, level: int = 1, timeout_s: float = 540) -> dict[str, Any]:
    """`dcgmi diag -r <level>`, judged by its test results (its exit code is non-zero for a
    failed test and for a failure to run alike)."""
    check = "dcgm-diag"
    if expect_gpus <= 0:
        return measured(check, True, NO_GPUS, {})
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        raise ProbeError("dcgmi is not installed (deploy a stack profile with DCGM)")
    try:
        done = subprocess.run(  # noqa: S603 - a fixed argument list
            [dcgmi, "diag", "-r", str(level), "-j"], capture_output=True, text=True,
            timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"dcgmi diag -r {level} ran past {timeout_s:g} s") from None
    try:
        outcomes = dcgm_outcomes(json.loads(done.stdout))
    except ValueError:
        outcomes = []
    if not outcomes:
        tail = (done.stdout + done.stderr).strip()[-500:]
        raise ProbeError(f"dcgmi diag gave no test results (exit {done.returncode}): {tail}")
    ok, summary = judge_dcgm(outcomes, level)
    return measured(check, ok, summary, {"level": level, "tests": outcomes})


def nccl_allreduce(*, size_mib: int = 64, iterations: int = 10, min_busbw_gbps: float = 0.0,
                   timeout_s: float = 300) -> dict[str, Any]:
    """All-reduce across the workload's replicas (one per node; torch.distributed from the
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT the driver sets): NCCL on GPUs, gloo where there
    are none. Every replica reports the gang's bus bandwidth (its slowest replica's)."""
    check = "nccl-allreduce"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise ProbeError("an all-reduce test needs at least 2 nodes")
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise ProbeError("torch is not installed in the check's environment") from None
    from datetime import timedelta

    gpu = torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if gpu \
        else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # the rendezvous failing says nothing yet about bandwidth
        raise ProbeError(f"could not join the other nodes ({backend}): {exc}") from None
    try:
        data = torch.ones(size_mib * 1024 * 1024 // 4, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(data)
        if gpu:
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(data)
        if gpu:
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / iterations
        # nccl-tests' bus bandwidth: what each link carried, comparable across node counts.
        busbw = data.numel() * 4 / seconds / 1e9 * 2 * (world - 1) / world
        slowest = torch.tensor([busbw], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MIN)
        busbw = float(slowest.item())
    finally:
        dist.destroy_process_group()
    details = {"backend": backend, "nodes": world, "size_mib": size_mib,
               "busbw_gbps": round(busbw, 3), "min_busbw_gbps": min_busbw_gbps}
    summary = f"all-reduce bus bandwidth {busbw:.2f} GB/s across {world} nodes ({backend})"
    if min_busbw_gbps and busbw < min_busbw_gbps:
        return measured(check, False, f"{summary}, below {min_busbw_gbps:g} GB/s", details)
    return measured(check, True, summary, details)


def split_target(target: str) -> tuple[str, int]:
    """"host:port" or "[v6 address]:port"."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ProbeError(f"target {target!r} is not host:port")
    return host.strip("[]"), int(port)


def _connect(target: str, timeout_s: float) -> dict[str, Any]:
    host, port = split_target(target)
    start = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        return {"target": target, "error": str(exc) or type(exc).__name__}
    return {"target": target, "ms": round((time.perf_counter() - start) * 1000, 1)}


def network(*, targets: list[str], platform: str = "", timeout_s: float = 3.0
            ) -> dict[str, Any]:
    """A TCP connection to each peer (`targets`: other nodes) and to the platform.

    The node fails only when it reaches fewer than half of the peers it tried (at least one):
    one dead peer, or a few, says more about them than about this node. The platform
    unreachable is reported (summary and details) but never fails the node by itself: a
    platform outage must not cordon the fleet. A node cut off fails on its peers."""
    check = "network"
    tried = [_connect(target, timeout_s) for target in targets]
    reached = [t for t in tried if "error" not in t]
    failed = [t for t in tried if "error" in t]
    home = _connect(platform, timeout_s) if platform else None
    details: dict[str, Any] = {"reached": reached, "failed": failed}
    notes = []
    if home is not None:
        details["platform"] = home
        if "error" in home:
            notes.append(f"cannot reach the platform at {platform} ({home['error']})")
    if failed:
        what = ", ".join(f"{f['target']} ({f['error']})" for f in failed)
        notes.insert(0, f"cannot reach {what}")
    if tried and len(reached) * 2 < len(tried):
        return measured(check, False, f"reached {len(reached)} of {len(tried)} peers: "
                        + "; ".join(notes), details)
    count = len(tried) + (home is not None)
    if not notes:
        return measured(check, True, f"reached all {count} addresses" if count
                        else "nothing to reach", details)
    peers = f"reached {len(reached)} of {len(tried)} peers" if tried else "no peers to try"
    return measured(check, True, f"{peers}; " + "; ".join(notes), details)
