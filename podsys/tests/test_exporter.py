"""OGAI's node exporter: DCGM-named GPU series from NVML, node-exporter series from /proc."""

import subprocess
import sys
import threading
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from podsys import exporter
from podsys.exporter import NodeCollector, make_server, proc_families, render
from podsys.metric_names import GPU_METRIC_NAMES, NODE_METRICS


def samples(text: str) -> dict[str, list]:
    """{sample name: [(labels, value)]}, read by prometheus_client's parser."""
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_this_machine_parses_and_has_the_node_exporter_series():
    found = samples(NodeCollector(hostname="here").exposition())
    for name in ("node_load1", "node_memory_MemTotal_bytes", "node_memory_MemAvailable_bytes",
                 "node_cpu_seconds_total", "node_network_receive_bytes_total",
                 "node_network_transmit_bytes_total"):
        assert name in found, name
    total = found["node_memory_MemTotal_bytes"][0][1]
    assert 0 < found["node_memory_MemAvailable_bytes"][0][1] <= total
    modes = {labels["mode"] for labels, _ in found["node_cpu_seconds_total"]}
    assert {"user", "system", "idle"} <= modes
    assert "lo" in {labels["device"] for labels, _ in found["node_network_receive_bytes_total"]}


def test_proc_files_become_node_exporter_values(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "loadavg").write_text("1.50 0.80 0.40 2/345 6789\n")
    (tmp_path / "meminfo").write_text("MemTotal:       2048 kB\nMemFree:  10 kB\n"
                                      "MemAvailable:   1024 kB\n")
    (tmp_path / "stat").write_text("cpu  200 0 100 1000 0 0 0 0 0 0\n"
                                   "cpu0 100 0 50 500 5 0 1 0 0 0\n"
                                   "cpu1 100 0 50 500 5 0 1 0 0 0\nintr 1 2 3\n")
    (tmp_path / "net" / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
        "  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n")
    found = samples(render(proc_families(str(tmp_path))))
    ticks = exporter.os.sysconf("SC_CLK_TCK")
    assert found["node_load1"] == [({}, 1.5)]
    assert found["node_memory_MemTotal_bytes"] == [({}, 2048 * 1024)]
    assert found["node_memory_MemAvailable_bytes"] == [({}, 1024 * 1024)]
    cpu = {(labels["cpu"], labels["mode"]): value
           for labels, value in found["node_cpu_seconds_total"]}
    assert cpu[("1", "idle")] == pytest.approx(500 / ticks)
    assert cpu[("0", "iowait")] == pytest.approx(5 / ticks)
    assert ("", "user") not in cpu  # the all-CPU line is not a CPU
    assert found["node_network_receive_bytes_total"] == [({"device": "eth0"}, 1000)]
    assert found["node_network_transmit_bytes_total"] == [({"device": "eth0"}, 2000)]


def test_a_machine_without_nvml_has_no_gpu_series(monkeypatch):
    monkeypatch.setattr(exporter, "_pynvml", lambda: None)
    found = samples(NodeCollector().exposition())
    assert not set(found) & set(GPU_METRIC_NAMES)
    assert "node_load1" in found


def test_nvml_failing_to_start_is_a_machine_without_gpus(monkeypatch):
    class NVMLError(Exception):
        pass

    def refuse():
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setattr(exporter, "_pynvml", lambda: SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=refuse, nvmlShutdown=lambda: None))
    found = samples(NodeCollector().exposition())
    assert not set(found) & set(GPU_METRIC_NAMES)
    assert "node_memory_MemTotal_bytes" in found


def fake_nvml(gpus: int = 2):
    """Enough of pynvml for the exporter: GPU 1 has no ECC (NotSupported), like a GPU with
    ECC turned off."""

    class NVMLError(Exception):
        pass

    def ecc(handle, kind, counter):
        if handle == 1:
            raise NVMLError("Not Supported")
        return 0 if kind == 0 else 2

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda h: f"GPU-uuid-{h}", nvmlDeviceGetMinorNumber=lambda h: h,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:0{h}:00.0".encode()),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=90 + h, memory=10),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=1024 * 1024 * 1024,
                                                          free=3 * 1024 * 1024 * 1024),
        nvmlDeviceGetTemperature=lambda h, sensor: 60,
        nvmlDeviceGetPowerUsage=lambda h: 350500,  # mW
        nvmlDeviceGetPowerManagementLimit=lambda h: 700000,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRemappedRows=lambda h: (4, 1, 0, 0),
        nvmlDeviceGetPcieThroughput=lambda h, counter: 1000 * (counter + 1),  # KB/s
        nvmlDeviceGetFieldValues=lambda h, ids: (_ for _ in ()).throw(NVMLError("no NVLink")),
    )


def test_gpus_appear_under_dcgm_names_and_labels(monkeypatch):
    monkeypatch.setattr(exporter, "_pynvml", lambda: fake_nvml(2))
    found = samples(NodeCollector(hostname="gpu-node-7").exposition())
    labels, value = found["DCGM_FI_DEV_GPU_UTIL"][1]
    assert value == 91
    assert labels == {"gpu": "1", "UUID": "GPU-uuid-1", "device": "nvidia1",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-7",
                      "pci_bus_id": "00000000:01:00.0"}
    assert [v for _, v in found["DCGM_FI_DEV_FB_USED"]] == [1024, 1024]  # MiB
    assert [v for _, v in found["DCGM_FI_DEV_FB_FREE"]] == [3072, 3072]
    assert found["DCGM_FI_DEV_POWER_USAGE"][0][1] == pytest.approx(350.5)  # W
    assert found["DCGM_FI_DEV_POWER_MGMT_LIMIT"][0][1] == 700
    assert found["DCGM_FI_PROF_PCIE_RX_BYTES"][0][1] == 2000 * 1024  # bytes per second
    # Counters named without _total: the parser reads them with _total added.
    assert [v for _, v in found["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS_total"]] == [1, 1]
    # GPU 1 has no ECC: only GPU 0 reports it, nothing else is lost.
    assert [labels["gpu"] for labels, _ in found["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total"]] == ["0"]
    assert found["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total"][0][1] == 2
    # No XID watcher running, no NVLink: those series are absent, not zero.
    assert "DCGM_FI_DEV_XID_ERRORS" not in found
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" not in found


def test_every_metric_is_declared_with_its_type():
    for metric in NODE_METRICS:
        assert metric.kind in {"gauge", "counter"}
        assert metric.label and metric.help
        assert metric.per_gpu == metric.name.startswith("DCGM_")


def test_the_server_answers_metrics_and_nothing_else():
    server = make_server(NodeCollector(hostname="here"), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        response = httpx.get(f"{base}/metrics", timeout=5)
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "node_load1" in samples(response.text)
        assert httpx.get(f"{base}/secrets", timeout=5).status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporter_imports_no_django():
    code = ("import sys, podsys.exporter; "
            "assert not [m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'rest_framework', 'celery', 'ogai'}], 'imports the platform'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
