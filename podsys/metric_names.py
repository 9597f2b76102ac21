"""The node metrics OGAI collects, charts and alerts on, under the names real clusters use.

GPU series carry the DCGM exporter's names and labels (`gpu`, `UUID`, `device`, `modelName`,
`Hostname`); node series carry the Prometheus node exporter's. The same names appear in OGAI's
own exporter (`podsys.exporter`), in the history it keeps without a Prometheus server, in the
Grafana dashboards and alert rules under `platform/`, and in Prometheus queries: a cluster that
already runs dcgm-exporter and node-exporter needs no mapping.

This module imports nothing from Django: the exporter, which runs on nodes, reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeMetric:
    """One series family. `key_label` is the label whose values tell its series apart in the
    history ({metric: {key: value}}): `gpu` for per-GPU metrics, `mode` for CPU time,
    `device` for network bytes, none (one series, key "") for the rest; samples that differ
    in other labels only (the CPU of a CPU-time sample) are summed."""

    name: str
    label: str
    unit: str
    per_gpu: bool
    kind: str  # "gauge" | "counter", as the exporter declares it
    help: str
    key_label: str = ""

    @property
    def key(self) -> str:
        return "gpu" if self.per_gpu else self.key_label


def _gpu(name: str, label: str, unit: str, kind: str, help: str) -> NodeMetric:
    return NodeMetric(name=name, label=label, unit=unit, per_gpu=True, kind=kind, help=help)


# fmt: off
NODE_METRICS: list[NodeMetric] = [
    _gpu("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation", "%", "gauge", "GPU utilization (in %)."),
    _gpu("DCGM_FI_DEV_FB_USED", "GPU memory used", "MiB", "gauge",
         "Framebuffer memory used (in MiB)."),
    _gpu("DCGM_FI_DEV_FB_FREE", "GPU memory free", "MiB", "gauge",
         "Framebuffer memory free (in MiB)."),
    _gpu("DCGM_FI_DEV_GPU_TEMP", "GPU temperature", "°C", "gauge", "GPU temperature (in C)."),
    _gpu("DCGM_FI_DEV_POWER_USAGE", "Power draw", "W", "gauge", "Power draw (in W)."),
    _gpu("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power limit", "W", "gauge",
         "Power management limit (in W)."),
    _gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ECC single-bit errors (volatile)", "errors",
         "counter", "Total number of single-bit volatile ECC errors."),
    _gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ECC double-bit errors (volatile)", "errors",
         "counter", "Total number of double-bit volatile ECC errors."),
    _gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Remapped rows (uncorrectable)", "rows",
         "counter", "Number of remapped rows for uncorrectable errors"),
    _gpu("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Remapped rows (correctable)", "rows",
         "counter", "Number of remapped rows for correctable errors"),
    _gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row remap failure", "", "gauge",
         "Whether remapping of rows has failed"),
    _gpu("DCGM_FI_DEV_XID_ERRORS", "Last XID error", "XID", "gauge",
         "Value of the last XID error encountered."),
    # DCGM's profiling fields: rates in bytes per second (dcp-metrics-included.csv declares
    # them gauges), not byte counters.
    _gpu("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmit", "B/s", "gauge",
         "The rate of data transmitted over the PCIe bus - including both protocol headers and "
         "data payloads - in bytes per second."),
    _gpu("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe receive", "B/s", "gauge",
         "The rate of data received over the PCIe bus - including both protocol headers and "
         "data payloads - in bytes per second."),
    _gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink transmit", "B/s", "gauge",
         "The rate of data transmitted over NVLink, not including protocol headers, in bytes "
         "per second."),
    _gpu("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink receive", "B/s", "gauge",
         "The rate of data received over NVLink, not including protocol headers, in bytes per "
         "second."),
    NodeMetric("node_load1", "Load (1 min)", "", False, "gauge", "1m load average."),
    NodeMetric("node_memory_MemTotal_bytes", "Memory total", "B", False, "gauge",
               "Memory information field MemTotal_bytes."),
    NodeMetric("node_memory_MemAvailable_bytes", "Memory available", "B", False, "gauge",
               "Memory information field MemAvailable_bytes."),
    NodeMetric("node_cpu_seconds_total", "CPU time", "s", False, "counter",
               "Seconds the CPUs spent in each mode.", key_label="mode"),
    NodeMetric("node_network_receive_bytes_total", "Network received", "B", False, "counter",
               "Network device statistic receive_bytes.", key_label="device"),
    NodeMetric("node_network_transmit_bytes_total", "Network transmitted", "B", False,
               "counter", "Network device statistic transmit_bytes.", key_label="device"),
]
# fmt: on

METRICS_BY_NAME: dict[str, NodeMetric] = {metric.name: metric for metric in NODE_METRICS}
GPU_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in NODE_METRICS if m.per_gpu)
