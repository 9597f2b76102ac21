"""`python -m podsys.health.run`: the probes as they run on a node, and their one result line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from podsys.health import probes, run
from podsys.health.result import RESULT_PREFIX, format_result, parse_result

REPO = Path(__file__).resolve().parents[2]


def probe(*args: str, env: dict | None = None) -> tuple[int, dict]:
    """Run the probe as a workload does, in a fresh interpreter without Django settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO")}
    done = subprocess.run([sys.executable, "-m", "podsys.health.run", *args], cwd=REPO,
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=60)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(lines) == 1, done.stdout + done.stderr
    return done.returncode, json.loads(lines[0][len(RESULT_PREFIX):])


def nvml_loads() -> bool:
    """Does NVML start here (or is it there, with its driver down)?"""
    try:
        with probes.nvml():
            return True
    except probes.DriverDown:
        return True
    except probes.ProbeError:
        return False


def test_gpu_presence_on_this_machine_when_more_gpus_are_expected_than_it_has():
    code, result = probe("gpu-presence", "--expect-gpus", "99")
    if nvml_loads():
        assert code == 0, "it measured something: a bad node is still a result"
        assert result["ok"] is False
        assert result["details"]["expected"] == 99
    else:  # no libnvidia-ml here: the check's environment, not the node, is at fault
        assert code == run.COULD_NOT_RUN
        assert result["error"].startswith("NVML did not start: NVML Shared Library Not Found")


@pytest.fixture
def nvml_stub(monkeypatch):
    """pynvml whose nvmlInit raises the NVML error given (None: starts) and that sees `gpus`
    GPUs."""
    import pynvml

    def install(error: int | None = None, gpus: int = 0):
        def init():
            if error is not None:
                raise pynvml.NVMLError(error)

        monkeypatch.setattr(pynvml, "nvmlInit", init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: gpus)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: index)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: b"NVIDIA H100")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo",
                            lambda handle: type("Pci", (), {"busId": f"0000:{handle:02x}:00.0"}))
        return pynvml

    return install


def gpu_presence(capsys, expect: int) -> tuple[int, dict]:
    code = run.main(["gpu-presence", "--expect-gpus", str(expect)])
    return code, parse_result(capsys.readouterr().out)


def test_gpu_presence_without_nvml_could_not_measure(nvml_stub, monkeypatch, capsys):
    """A check environment without nvidia-ml-py or libnvidia-ml says nothing of the node's
    GPUs: an error (counted for nothing), not a failure of a fatal check."""
    nv = nvml_stub(error=12)  # NVML_ERROR_LIBRARY_NOT_FOUND
    assert nv.NVML_ERROR_LIBRARY_NOT_FOUND == 12
    code, result = gpu_presence(capsys, 8)
    assert code == run.COULD_NOT_RUN
    assert result == {"check": "gpu-presence",
                      "error": "NVML did not start: NVML Shared Library Not Found"}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    code, result = gpu_presence(capsys, 8)
    assert code == run.COULD_NOT_RUN
    assert result["error"] == "nvidia-ml-py (pynvml) is not installed"
    # Where no GPU is expected, that is fine as it is.
    code, result = gpu_presence(capsys, 0)
    assert code == 0 and result["ok"] is True and result["summary"] == "no GPUs expected"


def test_gpu_presence_fails_on_a_driver_that_is_down_or_gpus_missing(nvml_stub, capsys):
    nv = nvml_stub(error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    assert nv.NVML_ERROR_DRIVER_NOT_LOADED == 9
    code, result = gpu_presence(capsys, 8)
    assert code == 0, "it measured something: a bad node is still a result"
    assert result["ok"] is False
    assert result["summary"] == "no GPU usable (NVML did not start: Driver Not Loaded); 8 expected"
    code, result = gpu_presence(capsys, 0)
    assert result["ok"] is True, "a node that expects no GPU passes as before"

    nvml_stub(gpus=7)
    code, result = gpu_presence(capsys, 8)
    assert code == 0 and result["ok"] is False
    assert result["summary"] == "7 of 8 GPUs found"
    nvml_stub(gpus=8)
    assert gpu_presence(capsys, 8)[1]["summary"] == "all 8 GPUs present (NVIDIA H100)"


def test_the_probes_import_no_django():
    code = ("import sys, podsys.health.run, podsys.health.probes; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'rest_framework', 'celery', 'ogai', 'infra_os', 'aistation'}); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


@pytest.fixture
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed once the block ends, and nothing listens


def test_network_reaches_a_listening_port_and_not_a_closed_one(listening, capsys):
    assert run.main(["network", "--target", f"127.0.0.1:{listening}"]) == 0
    result = parse_result(capsys.readouterr().out)
    assert result["ok"] is True
    assert result["summary"] == "reached all 1 addresses"

    closed = closed_port()
    assert run.main(["network", "--target", f"127.0.0.1:{closed}", "--timeout-s", "1"]) == 0
    result = parse_result(capsys.readouterr().out)
    assert result["ok"] is False
    assert result["summary"].startswith(f"reached 0 of 1 peers: cannot reach 127.0.0.1:{closed} (")
    assert result["details"]["reached"] == []


def test_one_dead_peer_does_not_fail_the_nodes_that_try_it(listening):
    """A node fails only when it reaches fewer than half of its peers."""
    up, down = f"127.0.0.1:{listening}", f"127.0.0.1:{closed_port()}"
    one_dead = probes.network(targets=[up, up, up, down], timeout_s=1)
    assert one_dead["ok"] is True
    assert one_dead["summary"].startswith(f"reached 3 of 4 peers; cannot reach {down} (")
    assert [f["target"] for f in one_dead["details"]["failed"]] == [down]
    assert probes.network(targets=[up, down], timeout_s=1)["ok"] is True, "half is enough"
    cut_off = probes.network(targets=[up, down, down], timeout_s=1)
    assert cut_off["ok"] is False
    assert cut_off["summary"].startswith("reached 1 of 3 peers: cannot reach ")


def test_the_platform_unreachable_alone_does_not_fail_the_node(listening):
    up, down = f"127.0.0.1:{listening}", f"127.0.0.1:{closed_port()}"
    outage = probes.network(targets=[up, up], platform=down, timeout_s=1)
    assert outage["ok"] is True, "a platform outage must not cordon the fleet"
    assert outage["summary"].startswith(
        f"reached 2 of 2 peers; cannot reach the platform at {down} (")
    assert "error" in outage["details"]["platform"]
    # Nothing else to tell by: still not held against the node.
    alone = probes.network(targets=[], platform=down, timeout_s=1)
    assert alone["ok"] is True and alone["summary"].startswith("no peers to try; cannot reach")
    # Cut off from its peers too: the node is the one that fails, and both are said.
    cut_off = probes.network(targets=[down], platform=down, timeout_s=1)
    assert cut_off["ok"] is False
    assert "cannot reach the platform at" in cut_off["summary"]
    healthy = probes.network(targets=[up], platform=up, timeout_s=1)
    assert healthy["ok"] is True and healthy["summary"] == "reached all 2 addresses"


def test_a_probe_that_cannot_measure_says_why_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(probes.shutil, "which", lambda name: None)
    assert run.main(["dcgm-diag", "--expect-gpus", "8"]) == run.COULD_NOT_RUN
    result = parse_result(capsys.readouterr().out)
    assert result == {"check": "dcgm-diag",
                      "error": "dcgmi is not installed (deploy a stack profile with DCGM)"}


def test_a_broken_probe_still_prints_one_line(monkeypatch, capsys):
    def boom(**kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(probes, "power_slowdown", boom)
    assert run.main(["power-slowdown", "--expect-gpus", "1"]) == run.PROBE_BROKE
    assert parse_result(capsys.readouterr().out)["error"] == (
        "the probe broke: ZeroDivisionError: division by zero")


def test_the_result_line_is_read_back_from_a_log():
    line = format_result({"check": "x", "ok": True, "summary": "two\nlines", "details": {}})
    assert "\n" not in line
    log = f"replica 0 started\nnoise\n{line}\nreplica 0 ended\n"
    assert parse_result(log)["summary"] == "two\nlines"
    assert parse_result("no result here\n") is None
    assert parse_result(RESULT_PREFIX + "{not json\n") is None


DCGM_REPORT = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Pass"}]},
        {"name": "NVML Library", "results": [{"status": "Pass"}]},
    ]},
    {"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [
            {"gpu_ids": "0", "status": "Pass"},
            {"gpu_ids": "3", "status": "Fail",
             "warnings": [{"warning": "GPU 3 has uncorrectable memory errors", "error_id": 95}]},
        ]},
    ]},
], "version": "3.3.5"}}


def test_dcgm_results_are_judged_by_their_tests():
    outcomes = probes.dcgm_outcomes(DCGM_REPORT)
    assert [o["status"] for o in outcomes] == ["pass", "pass", "pass", "fail"]
    ok, summary = probes.judge_dcgm(outcomes, 1)
    assert not ok
    assert summary == ("DCGM diagnostic level 1 failed: GPU Memory (GPU 3 has uncorrectable "
                       "memory errors)")
    healthy = probes.dcgm_outcomes({"DCGM Diagnostic": {"test_categories": [
        {"tests": [{"name": "Denylist", "results": [{"status": "Pass"}, {"status": "Skip"}]}]}]}})
    assert probes.judge_dcgm(healthy, 2) == (True, "DCGM diagnostic level 2: 1 tests passed")


def test_pcie_copies_are_judged_against_their_link():
    good = {"index": 0, "h2d_gbps": 25.1, "d2h_gbps": 26.3, "generation": 4, "width": 16,
            "max_width": 16}
    assert probes.judge_pcie([good]) == (True, "1 GPUs, slowest copy 25.1 GB/s")
    slow = {**good, "index": 1, "d2h_gbps": 6.0}
    narrow = {**good, "index": 2, "width": 8, "h2d_gbps": 12.0, "d2h_gbps": 12.0}
    ok, summary = probes.judge_pcie([good, slow, narrow])
    assert not ok
    assert summary == ("GPU 1: 6.0 GB/s, below 18.0 GB/s for PCIe gen4 x16; "
                       "GPU 2: link x8 of x16")


@pytest.mark.slow  # two interpreters importing torch: 2 s idle, more on a busy machine
def test_an_all_reduce_runs_across_two_processes_with_gloo():
    """Two "nodes" on this machine, rendezvousing as the driver's variables tell them."""
    port = closed_port()
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "CUDA_VISIBLE_DEVICES": ""}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO")}
    ranks = [subprocess.Popen(
        [sys.executable, "-m", "podsys.health.run", "nccl-allreduce", "--size-mib", "1",
         "--iterations", "2", "--timeout-s", "30"],
        cwd=REPO, env={**clean, **env, "RANK": str(rank)}, stdout=subprocess.PIPE, text=True)
        for rank in range(2)]
    results = [parse_result(rank.communicate(timeout=60)[0]) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    assert all(r["ok"] for r in results)
    assert results[0]["details"]["backend"] == "gloo"
    assert results[0]["details"]["busbw_gbps"] == results[1]["details"]["busbw_gbps"] > 0
