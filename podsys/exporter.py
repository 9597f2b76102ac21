"""OGAI's node exporter: this machine's GPUs and OS as Prometheus metrics.

    python -m podsys.exporter --port 9400 [--host 0.0.0.0] [--hostname NAME]

serves `/metrics` in the Prometheus text format: GPUs read through NVML under the DCGM
exporter's names and labels (`gpu`, `UUID`, `device`, `modelName`, `Hostname`, `pci_bus_id`),
and `/proc` (load, memory, CPU time, network bytes) under the node exporter's names. A machine
without a GPU, an NVIDIA driver or `nvidia-ml-py` simply has no DCGM series. The `local`
cluster driver runs the same collector in process (`NodeCollector.exposition`).

It runs on nodes, so it imports no Django and nothing of the platform but the metric names
(an import-linter contract in pyproject.toml holds it to that).

The text is written here rather than by prometheus_client, whose writer would declare DCGM's
counters (named without `_total`) as `<name>_total`; prometheus_client's parser reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from podsys.metric_names import METRICS_BY_NAME

logger = logging.getLogger("podsys.exporter")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# NVML field ids (nvml.h): the NVLink link count, and per-link cumulative KiB of data sent and
# received, from which the exporter derives DCGM's NVLink rates between two reads.
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139


@dataclass
class Family:
    """One metric family: its samples as (labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    @classmethod
    def of(cls, name: str) -> Family:
        """An empty family of a name from `podsys.metric_names`, typed and described there."""
        metric = METRICS_BY_NAME[name]
        return cls(name=name, kind=metric.kind, help=metric.help)

    def add(self, value: float | None, **labels: str) -> None:
        if value is not None:
            self.samples.append((labels, float(value)))


# The text format ---------------------------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def render(families: Iterable[Family]) -> str:
    """The Prometheus text exposition (version 0.0.4) of `families`; empty ones are left out."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            body = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in labels.items())
            lines.append(f"{family.name}{{{body}}} {_number(value)}" if body
                         else f"{family.name} {_number(value)}")
    return "\n".join(lines) + "\n" if lines else ""


# /proc, under the node exporter's names ----------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def proc_families(proc: str = "/proc") -> list[Family]:
    """Load, memory, CPU time per CPU and mode, and bytes per network device. What cannot be
    read (no /proc: not Linux) is left out."""
    families = []
    loadavg = _read(f"{proc}/loadavg")
    if loadavg:
        load = Family.of("node_load1")
        with contextlib.suppress(ValueError, IndexError):
            load.add(float(loadavg.split()[0]))
        families.append(load)
    families.extend(_memory(_read(f"{proc}/meminfo") or ""))
    families.append(_cpu(_read(f"{proc}/stat") or ""))
    families.extend(_network(_read(f"{proc}/net/dev") or ""))
    return families


def _memory(meminfo: str) -> list[Family]:
    wanted = {"MemTotal": Family.of("node_memory_MemTotal_bytes"),
              "MemAvailable": Family.of("node_memory_MemAvailable_bytes")}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            parts = rest.split()
            with contextlib.suppress(ValueError, IndexError):
                # /proc/meminfo says "kB" and means KiB.
                factor = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
                wanted[key].add(int(parts[0]) * factor)
    return list(wanted.values())


def _cpu(stat: str) -> Family:
    family = Family.of("node_cpu_seconds_total")
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        for mode, value in zip(CPU_MODES, rest.split(), strict=False):
            with contextlib.suppress(ValueError):
                family.add(int(value) / ticks, cpu=name[3:], mode=mode)
    return family


def _network(netdev: str) -> list[Family]:
    received = Family.of("node_network_receive_bytes_total")
    sent = Family.of("node_network_transmit_bytes_total")
    for line in netdev.splitlines()[2:]:  # two header lines
        device, _, rest = line.partition(":")
        columns = rest.split()
        if len(columns) < 9:
            continue
        with contextlib.suppress(ValueError):
            received.add(int(columns[0]), device=device.strip())
            sent.add(int(columns[8]), device=device.strip())
    return [received, sent]


# NVML, under DCGM's names ------------------------------------------------------------------


def _pynvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NodeCollector:
    """Reads this machine's metrics. Keeps what a rate needs between two reads (NVLink byte
    counters) and, when `watch_xids()` runs, the last XID error of each GPU."""

    def __init__(self, hostname: str | None = None, proc: str = "/proc") -> None:
        self.hostname = hostname or socket.gethostname()
        self.proc = proc
        self._lock = threading.Lock()
        self._nvlink: dict[str, tuple[float, float, float]] = {}  # UUID: (time, tx KiB, rx KiB)
        self._xids: dict[int, int] | None = None  # None: nobody watches XID events

    def collect(self) -> list[Family]:
        with self._lock:
            return self._gpu_families() + proc_families(self.proc)

    def exposition(self) -> str:
        return render(self.collect())

    # GPUs ----------------------------------------------------------------------------------

    def _gpu_families(self) -> list[Family]:
        nvml = _pynvml()
        if nvml is None:
            return []
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError):
            return []  # no driver, no device, no permission: a machine without GPUs
        try:
            count = int(nvml.nvmlDeviceGetCount())
            families = {name: Family.of(name) for name in METRICS_BY_NAME
                        if METRICS_BY_NAME[name].per_gpu}
            for index in range(count):
                self._read_gpu(nvml, index, families)
            return list(families.values())
        except (nvml.NVMLError, OSError) as exc:
            logger.warning("NVML failed: %s", exc)
            return []
        finally:
            with contextlib.suppress(nvml.NVMLError, OSError):
                nvml.nvmlShutdown()

    def _read_gpu(self, nvml: Any, index: int, families: dict[str, Family]) -> None:
        def get(fn: Callable[..., Any], *args: Any) -> Any:
            # One unsupported reading (ECC off, no row remapper before Ampere) skips only
            # that series.
            try:
                return fn(*args)
            except (nvml.NVMLError, OSError):
                return None

        handle = get(nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return  # fallen off the bus: its series go missing, which is what alerts see
        uuid = _text(get(nvml.nvmlDeviceGetUUID, handle) or "")
        minor = get(nvml.nvmlDeviceGetMinorNumber, handle)
        pci = get(nvml.nvmlDeviceGetPciInfo, handle)
        labels = {
            "gpu": str(index),
            "UUID": uuid,
            "device": f"nvidia{minor if minor is not None else index}",
            "modelName": _text(get(nvml.nvmlDeviceGetName, handle) or ""),
            "Hostname": self.hostname,
        }
        if pci is not None:
            labels["pci_bus_id"] = _text(pci.busId)

        def put(name: str, value: float | None) -> None:
            families[name].add(value, **labels)

        utilization = get(nvml.nvmlDeviceGetUtilizationRates, handle)
        put("DCGM_FI_DEV_GPU_UTIL", utilization.gpu if utilization is not None else None)
        memory = get(nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            put("DCGM_FI_DEV_FB_USED", memory.used // (1024 * 1024))
            put("DCGM_FI_DEV_FB_FREE", memory.free // (1024 * 1024))
        put("DCGM_FI_DEV_GPU_TEMP",
            get(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU))
        power = get(nvml.nvmlDeviceGetPowerUsage, handle)  # mW
        put("DCGM_FI_DEV_POWER_USAGE", power / 1000 if power is not None else None)
        limit = get(nvml.nvmlDeviceGetPowerManagementLimit, handle)  # mW
        put("DCGM_FI_DEV_POWER_MGMT_LIMIT", limit / 1000 if limit is not None else None)
        for name, kind in (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                           ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            put(name, get(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC))
        rows = get(nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            correctable, uncorrectable, _pending, failure = rows
            put("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", correctable)
            put("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", uncorrectable)
            put("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1 if failure else 0)
        if self._xids is not None:
            put("DCGM_FI_DEV_XID_ERRORS", self._xids.get(index, 0))
        for name, counter in (("DCGM_FI_PROF_PCIE_TX_BYTES", nvml.NVML_PCIE_UTIL_TX_BYTES),
                              ("DCGM_FI_PROF_PCIE_RX_BYTES", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            kb_per_s = get(nvml.nvmlDeviceGetPcieThroughput, handle, counter)
            put(name, kb_per_s * 1024 if kb_per_s is not None else None)
        rates = self._nvlink_rates(nvml, handle, uuid or str(index))
        if rates is not None:
            put("DCGM_FI_PROF_NVLINK_TX_BYTES", rates[0])
            put("DCGM_FI_PROF_NVLINK_RX_BYTES", rates[1])

    def _nvlink_rates(self, nvml: Any, handle: Any, key: str) -> tuple[float, float] | None:
        """Bytes per second sent and received over all NVLinks since the previous read; None
        on the first read and where the GPU has no NVLink."""
        try:
            (links_value,) = nvml.nvmlDeviceGetFieldValues(handle, [NVML_FI_DEV_NVLINK_LINK_COUNT])
            links = _field_value(links_value) if links_value.nvmlReturn == 0 else 0
            if not links:
                return None
            ids = [(field_id, link) for link in range(int(links))
                   for field_id in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
            values = nvml.nvmlDeviceGetFieldValues(handle, ids)
        except (nvml.NVMLError, OSError, AttributeError):
            return None
        totals = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0.0,
                  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 0.0}
        for value in values:
            if value.nvmlReturn == 0:
                totals[value.fieldId] += _field_value(value)
        now = time.monotonic()
        tx, rx = totals[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX], \
            totals[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        previous = self._nvlink.get(key)
        self._nvlink[key] = (now, tx, rx)
        if previous is None or now <= previous[0] or tx < previous[1] or rx < previous[2]:
            return None
        elapsed = now - previous[0]
        return ((tx - previous[1]) * 1024 / elapsed, (rx - previous[2]) * 1024 / elapsed)

    # XID errors ----------------------------------------------------------------------------

    def watch_xids(self, stop: threading.Event) -> None:
        """Wait for XID critical-error events until `stop` is set, keeping each GPU's last XID
        (DCGM reports the last one seen, 0 for none). Returns at once without NVML."""
        nvml = _pynvml()
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError):
            return
        try:
            events = nvml.nvmlEventSetCreate()
            for index in range(int(nvml.nvmlDeviceGetCount())):
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(index),
                                                  nvml.nvmlEventTypeXidCriticalError, events)
            self._xids = {}
            while not stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(events, 1000)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    raise
                if data.eventType == nvml.nvmlEventTypeXidCriticalError:
                    gpu = int(nvml.nvmlDeviceGetIndex(data.device))
                    self._xids[gpu] = int(data.eventData)
                    logger.warning("GPU %s: XID %s", gpu, data.eventData)
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(events)
        except (nvml.NVMLError, OSError) as exc:
            logger.warning("XID events unavailable: %s", exc)
            self._xids = None
        finally:
            with contextlib.suppress(nvml.NVMLError, OSError):
                nvml.nvmlShutdown()


def _field_value(value: Any) -> float:
    kind = value.valueType
    union = value.value
    return float({0: union.dVal, 1: union.uiVal, 2: union.ulVal, 3: union.ullVal,
                  4: union.sllVal, 5: union.siVal, 6: union.usVal}.get(kind, 0))


# The server --------------------------------------------------------------------------------


def make_server(collector: NodeCollector, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                body = collector.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
            elif self.path == "/":
                body = b'<html><body><a href="/metrics">Metrics</a></body></html>\n'
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
            else:
                body = b"Not found\n"
                self.send_response(404)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m podsys.exporter",
        description="Serve this machine's GPU (DCGM names) and OS (node exporter names) "
        "metrics for Prometheus at /metrics.")
    parser.add_argument("--port", type=int, default=9400)
    # Exporters listen on every interface so Prometheus (or OGAI) can scrape them.
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104
    parser.add_argument("--hostname", default=None,
                        help="the Hostname label of GPU series (default: this host's name)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    collector = NodeCollector(args.hostname)
    stop = threading.Event()
    threading.Thread(target=collector.watch_xids, args=(stop,), daemon=True,
                     name="xid-events").start()
    server = make_server(collector, args.host, args.port)
    logger.info("serving metrics on http://%s:%s/metrics", args.host, args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()


if __name__ == "__main__":
    main()
