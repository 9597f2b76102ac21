"""Plausible metrics of a simulated node, for the `fake` driver.

A GPU holding a workload looks busy (high utilisation, memory, power and temperature, PCIe and
NVLink traffic), a free one idle; counters grow with the fake clock. Tests override any value
(`FakeCluster.set_metric`) to stage what real hardware would show: ECC errors, remapped rows,
an XID, a hot GPU.
"""

from __future__ import annotations

from podsys.exporter import Family
from podsys.metric_names import METRICS_BY_NAME

ALL = "*"  # an override for every GPU of the node (or every sample of a node-wide family)
MIB = 1024 * 1024

# (idle, busy) per GPU metric; FB_USED is a share of the GPU's memory.
_GPU_VALUES: dict[str, tuple[float, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": (0, 97),
    "DCGM_FI_DEV_FB_USED": (0.0, 0.86),
    "DCGM_FI_DEV_GPU_TEMP": (33, 71),
    "DCGM_FI_DEV_POWER_USAGE": (72, 615),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": (700, 700),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (0, 0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (0, 0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (0, 0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (0, 0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (0, 0),
    "DCGM_FI_DEV_XID_ERRORS": (0, 0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (2.0e5, 3.1e9),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (4.0e5, 6.4e9),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (0, 1.2e11),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (0, 1.2e11),
}


def synthetic_families(
    *,
    hostname: str,
    gpus: int,
    busy_gpus: int,
    gpu_model: str,
    gpu_memory_mib: int,
    cpu_cores: float,
    memory_mib: int,
    now: float,
    overrides: dict[tuple[str, str], float],
) -> list[Family]:
    """The node's families; GPUs 0..busy_gpus-1 are the busy ones. `overrides` maps (metric
    name, GPU index or ALL) to a value."""
    families = []
    for name, (idle, busy) in _GPU_VALUES.items():
        family = Family.of(name)
        for index in range(gpus):
            value = busy if index < busy_gpus else idle
            if name == "DCGM_FI_DEV_FB_USED":
                value = round(value * gpu_memory_mib)
            value = overrides.get((name, str(index)), overrides.get((name, ALL), value))
            family.add(value, gpu=str(index), UUID=f"GPU-{hostname}-{index}",
                       device=f"nvidia{index}", modelName=gpu_model, Hostname=hostname)
        families.append(family)
    # Free memory follows from what is used, overridden or not.
    used = next(family for family in families if family.name == "DCGM_FI_DEV_FB_USED")
    free = Family.of("DCGM_FI_DEV_FB_FREE")
    for labels, value in used.samples:
        left = max(0.0, gpu_memory_mib - value)
        free.add(overrides.get(("DCGM_FI_DEV_FB_FREE", labels["gpu"]),
                               overrides.get(("DCGM_FI_DEV_FB_FREE", ALL), left)), **labels)
    families.insert(families.index(used) + 1, free)

    share = busy_gpus / gpus if gpus else 0.0
    total = memory_mib * MIB
    node_values: dict[str, list[tuple[dict[str, str], float]]] = {
        "node_load1": [({}, round(0.1 + busy_gpus * 1.5, 2))],
        "node_memory_MemTotal_bytes": [({}, total)],
        "node_memory_MemAvailable_bytes": [({}, max(0, total - busy_gpus * 24 * 1024 * MIB))],
        "node_cpu_seconds_total": [
            ({"cpu": "0", "mode": "user"}, round(now * cpu_cores * share * 0.9, 3)),
            ({"cpu": "0", "mode": "system"}, round(now * cpu_cores * share * 0.1, 3)),
            ({"cpu": "0", "mode": "idle"}, round(now * cpu_cores * (1 - share), 3)),
        ],
        "node_network_receive_bytes_total": [
            ({"device": "eth0"}, round(now * (1e5 + busy_gpus * 5e7)))],
        "node_network_transmit_bytes_total": [
            ({"device": "eth0"}, round(now * (1e5 + busy_gpus * 4e7)))],
    }
    for name, samples in node_values.items():
        family = Family.of(name)
        for labels, value in samples:
            family.add(overrides.get((name, ALL), value), **labels)
        families.append(family)
    return families


def check_override(name: str, gpu: int | None, gpus: int) -> str:
    """The override key of `set_metric(name, gpu=...)`; refuses unknown names and GPUs."""
    metric = METRICS_BY_NAME.get(name)
    if metric is None:
        raise ValueError(f"unknown metric {name!r}; see podsys.metric_names.NODE_METRICS")
    if gpu is None:
        return ALL
    if not metric.per_gpu:
        raise ValueError(f"{name} is a node metric: give no gpu")
    if not 0 <= gpu < gpus:
        raise ValueError(f"the node has no GPU {gpu}")
    return str(gpu)
