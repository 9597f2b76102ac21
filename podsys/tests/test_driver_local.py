"""The local driver against real processes: small Python scripts run by this interpreter."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from podsys.drivers.base import (
    FEATURE_IMAGES,
    FEATURE_MULTI_NODE,
    FEATURE_SERVICES,
    DriverError,
    Phase,
    Resources,
    Workload,
    WorkloadStatus,
)
from podsys.drivers.local import LocalDriver, read_gpus, read_tail

DEADLINE_S = 15.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@pytest.fixture
def make_driver(root: Path) -> Iterator[Callable[..., LocalDriver]]:
    made: list[LocalDriver] = []

    def make(**options) -> LocalDriver:
        driver = LocalDriver(cluster="test", options={"root": str(root), "grace_s": 0.5, **options})
        made.append(driver)
        return driver

    yield make
    # Leave no process behind, whatever a test did.
    for folder in (root / "workloads").glob("*"):
        made[0].cancel(folder.name)


@pytest.fixture
def driver(make_driver) -> LocalDriver:
    return make_driver()


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / f"script-{abs(hash(body))}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def workload(id: str, path: str, *args: str, **fields) -> Workload:
    fields.setdefault("resources", Resources())
    return Workload(id=id, command=(sys.executable, path, *args), **fields)


def wait_until(check: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def wait_done(driver: LocalDriver, handle: str) -> WorkloadStatus:
    result: dict[str, WorkloadStatus] = {}

    def done() -> bool:
        result["s"] = driver.status([handle])[handle]
        return result["s"].phase not in (Phase.RUNNING, Phase.PENDING)

    wait_until(done)
    return result["s"]


def wait_for_log(driver: LocalDriver, handle: str, text: str, replica: int = 0) -> str:
    wait_until(lambda: text in driver.logs(handle, replica=replica))
    return driver.logs(handle, replica=replica)


def live_processes(root: Path, handle: str, extra_pids: tuple[int, ...] = ()) -> list[int]:
    """Processes of the workload still alive (zombies do not count): the supervisors, anything
    in their process groups or sessions, and `extra_pids`."""
    state = json.loads((root / "workloads" / handle / "workload.json").read_text())
    leaders = {r["pid"] for r in state["replicas"] if r["pid"]}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        state_code, pgrp, session = fields[0], int(fields[2]), int(fields[3])
        pid = int(entry)
        ours = pid in leaders or pid in extra_pids or {pgrp, session} & leaders
        if ours and state_code != "Z":
            found.append(pid)
    return found


def test_script_runs_to_success_and_its_output_is_in_the_logs(driver, tmp_path):
    path = script(tmp_path, "print('hello from the job')\n")
    assert driver.launch(workload("ok-1", path)) == "ok-1"
    result = wait_done(driver, "ok-1")
    assert result.phase == Phase.SUCCEEDED
    assert result.exit_code == 0
    assert result.replicas[0].node == driver.node_name
    assert "hello from the job" in driver.logs("ok-1")
    # The processes work in a folder of their own, beside (not among) the state and logs.
    assert driver.run_dir("ok-1") == driver.root / "workloads" / "ok-1" / "run"


def test_replicas_get_ranks_rendezvous_gpus_and_checkpoint_dir(make_driver, tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    driver = make_driver(gpus=2)
    path = script(tmp_path, "import json, os; print(json.dumps(dict(os.environ)))\n")
    checkpoints = tmp_path / "ckpt" / "job-7"
    job = workload(
        "env-1",
        path,
        replicas=2,
        resources=Resources(gpus=1),
        env={"MY_SETTING": "x", "RANK": "overridden by the driver"},
        checkpoint_dir=str(checkpoints),
    )
    driver.launch(job)
    assert wait_done(driver, "env-1").phase == Phase.SUCCEEDED
    envs = [json.loads(driver.logs("env-1", replica=i).strip()) for i in range(2)]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.1"}
    ports = {env["MASTER_PORT"] for env in envs}
    assert len(ports) == 1 and int(ports.pop()) > 0
    assert sorted(env["CUDA_VISIBLE_DEVICES"] for env in envs) == ["0", "1"]
    assert {env["LOCAL_RANK"] for env in envs} == {"0"}  # each replica sees only its GPUs
    assert {env["OGAI_WORKLOAD_ID"] for env in envs} == {"env-1"}
    assert {env["OGAI_CHECKPOINT_DIR"] for env in envs} == {str(checkpoints)}
    assert checkpoints.is_dir()
    assert {env["MY_SETTING"] for env in envs} == {"x"}
    assert all("SECRET_KEY" not in env for env in envs)
    assert "PATH" in envs[0]


def test_a_replica_without_gpu_sees_none(driver, tmp_path):
    path = script(tmp_path, "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))\n")
    driver.launch(workload("nogpu-1", path))
    assert wait_done(driver, "nogpu-1").phase == Phase.SUCCEEDED
    assert driver.logs("nogpu-1").strip() == "''"


def test_failing_script_reports_its_exit_code(driver, tmp_path):
    path = script(tmp_path, "import sys; print('oops'); sys.exit(3)\n")
    driver.launch(workload("fail-1", path))
    result = wait_done(driver, "fail-1")
    assert result.phase == Phase.FAILED
    assert result.exit_code == 3
    assert result.reason == "exit code 3"
    assert result.replicas[0].reason == "exit code 3"


def test_script_killed_by_a_signal_reports_the_signal(driver, tmp_path):
    path = script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    driver.launch(workload("sig-1", path))
    result = wait_done(driver, "sig-1")
    assert result.phase == Phase.FAILED
    assert result.exit_code == -9
    assert result.reason == "killed by signal SIGKILL"


def test_first_replica_to_fail_speaks_for_the_workload(driver, tmp_path):
    path = script(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(7)
        time.sleep(0.5)
        sys.exit(1)
        """,
    )
    driver.launch(workload("first-1", path, replicas=2))
    wait_until(lambda: driver.status(["first-1"])["first-1"].replicas[0].phase == Phase.FAILED)
    result = driver.status(["first-1"])["first-1"]
    assert result.phase == Phase.FAILED
    assert result.exit_code == 7


def test_a_missing_program_fails_with_127_and_says_why(driver):
    driver.launch(Workload(id="nf-1", command=("no-such-program-ogai",), resources=Resources()))
    result = wait_done(driver, "nf-1")
    assert result.exit_code == 127
    assert "cannot run 'no-such-program-ogai'" in driver.logs("nf-1")


def test_launch_twice_starts_one_process_set(driver, tmp_path):
    marker = tmp_path / "starts.txt"
    path = script(tmp_path, f"open({str(marker)!r}, 'a').write('started\\n')\n")
    job = workload("twice-1", path, replicas=2)
    assert driver.launch(job) == "twice-1"
    state_before = (driver.root / "workloads" / "twice-1" / "workload.json").read_text()
    assert driver.launch(job) == "twice-1"
    assert wait_done(driver, "twice-1").phase == Phase.SUCCEEDED
    assert driver.launch(job) == "twice-1"
    assert marker.read_text() == "started\n" * 2  # one per replica, once
    state_after = (driver.root / "workloads" / "twice-1" / "workload.json").read_text()
    assert state_before == state_after


def test_concurrent_launches_start_once_and_share_gpus(make_driver, tmp_path):
    marker = tmp_path / "starts.txt"
    path = script(tmp_path, f"import time; open({str(marker)!r}, 'a').write('x'); time.sleep(60)")
    drivers = [make_driver(gpus=1) for _ in range(4)]  # one per worker, one root
    one_gpu = Resources(gpus=1)
    same = workload("race-1", path, resources=one_gpu)
    with ThreadPoolExecutor(max_workers=4) as pool:
        handles = list(pool.map(lambda driver: driver.launch(same), drivers))
    assert handles == ["race-1"] * 4
    wait_until(lambda: marker.exists())
    assert len(live_processes(drivers[0].root, "race-1")) == 2  # one supervisor, one script
    others = [workload(f"race-{i}", path, resources=one_gpu) for i in range(2, 6)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        started = list(pool.map(_try_launch, drivers, others))
    assert started == [False] * 4  # the only GPU is race-1's
    assert marker.read_text() == "x"


def _try_launch(driver: LocalDriver, job: Workload) -> bool:
    try:
        driver.launch(job)
    except DriverError:
        return False
    return True


def test_cancel_stops_a_script_that_traps_sigterm(driver, tmp_path):
    path = script(
        tmp_path,
        """
        import signal, sys, time
        def stop(signum, frame):
            print("saving and stopping", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(60)
        """,
    )
    driver.launch(workload("trap-1", path, replicas=2))
    wait_for_log(driver, "trap-1", "ready")
    wait_for_log(driver, "trap-1", "ready", replica=1)
    driver.cancel("trap-1")
    assert live_processes(driver.root, "trap-1") == []
    assert "saving and stopping" in driver.logs("trap-1")
    result = driver.status(["trap-1"])["trap-1"]
    assert result.phase == Phase.FAILED
    assert result.exit_code == 143
    assert result.reason == "cancelled (exit code 143)"


def test_cancel_kills_a_script_that_ignores_sigterm_and_its_children(driver, tmp_path):
    path = script(
        tmp_path,
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(f"child {child.pid}", flush=True)
        time.sleep(60)
        """,
    )
    driver.launch(workload("stubborn-1", path))
    log = wait_for_log(driver, "stubborn-1", "child ")
    grandchild = int(log.split("child ")[1].split()[0])
    started = time.monotonic()
    driver.cancel("stubborn-1")
    assert time.monotonic() - started < DEADLINE_S
    assert live_processes(driver.root, "stubborn-1", (grandchild,)) == []
    result = driver.status(["stubborn-1"])["stubborn-1"]
    assert result.exit_code == -9
    assert result.reason == "cancelled (killed by signal SIGKILL)"
    driver.cancel("stubborn-1")  # idempotent
    driver.cancel("never-launched")
    driver.cancel("../not-an-id")


def test_a_new_driver_instance_recovers_what_another_launched(make_driver, tmp_path):
    first = make_driver()
    path = script(tmp_path, "import time; print('working', flush=True); time.sleep(60)\n")
    job = workload("recover-1", path)
    first.launch(job)
    wait_for_log(first, "recover-1", "working")

    restarted = make_driver()  # a Celery worker restarted: nothing shared in memory
    assert restarted.status(["recover-1"])["recover-1"].phase == Phase.RUNNING
    assert "working" in restarted.logs("recover-1")
    assert restarted.launch(job) == "recover-1"
    assert len(live_processes(restarted.root, "recover-1")) == 2  # supervisor and script
    restarted.cancel("recover-1")
    assert live_processes(restarted.root, "recover-1") == []
    assert first.status(["recover-1"])["recover-1"].phase == Phase.FAILED


def test_a_supervisor_that_vanished_is_reported_and_its_command_still_cancelled(driver, tmp_path):
    path = script(tmp_path, "import time; print('working', flush=True); time.sleep(60)\n")
    driver.launch(workload("orphan-1", path))
    wait_for_log(driver, "orphan-1", "working")
    state = json.loads((driver.root / "workloads" / "orphan-1" / "workload.json").read_text())
    os.kill(state["replicas"][0]["pid"], signal.SIGKILL)  # the supervisor only
    result = wait_done(driver, "orphan-1")
    assert result.phase == Phase.FAILED
    assert result.reason == "the process vanished without an exit code"
    assert len(live_processes(driver.root, "orphan-1")) == 1  # the script lives on
    driver.cancel("orphan-1")
    assert live_processes(driver.root, "orphan-1") == []


def test_logs_tail(driver, tmp_path):
    path = script(tmp_path, "for i in range(5000): print(f'line {i}')\n")
    driver.launch(workload("tail-1", path))
    wait_done(driver, "tail-1")
    assert driver.logs("tail-1", tail=3) == "line 4997\nline 4998\nline 4999\n"
    assert driver.logs("tail-1").count("\n") == 5000
    assert driver.logs("tail-1", tail=0) == ""
    with pytest.raises(DriverError):
        driver.logs("tail-1", replica=1)
    with pytest.raises(DriverError):
        driver.logs("never-launched")


def test_read_tail_reads_backwards_across_blocks(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i} é\n" for i in range(1000)) + "partial")
    assert read_tail(log, 2, block=7) == "line 999 é\npartial"
    assert read_tail(log, 1001, block=7) == log.read_text()
    assert read_tail(log, 5000, block=7) == log.read_text()
    assert read_tail(tmp_path / "absent.log", 5) == ""


def test_arguments_with_shell_metacharacters_are_passed_literally(driver, tmp_path):
    path = script(tmp_path, "import json, sys; print(json.dumps(sys.argv[1:]))\n")
    args = ("; rm -rf /", "$(id)", "`id`", "a b", "*", "|", "&&", "$HOME", "'\"")
    driver.launch(workload("meta-1", path, *args))
    assert wait_done(driver, "meta-1").phase == Phase.SUCCEEDED
    assert tuple(json.loads(driver.logs("meta-1"))) == args


def test_status_of_unknown_handles_is_missing(driver):
    statuses = driver.status(["never-launched", "../../etc", "UPPER"])
    assert {s.phase for s in statuses.values()} == {Phase.MISSING}


def test_launch_refuses_another_node_and_too_many_gpus(make_driver, tmp_path):
    driver = make_driver(gpus=1, node_name="this-node")
    path = script(tmp_path, "import time; time.sleep(60)\n")
    with pytest.raises(DriverError, match="other-node"):
        driver.launch(workload("elsewhere-1", path, placement=("other-node",)))
    with pytest.raises(DriverError, match="needs 2 GPUs; 1 of 1"):
        driver.launch(workload("big-1", path, resources=Resources(gpus=2)))
    with pytest.raises(DriverError, match="DNS-1123"):
        driver.launch(workload("Bad_Id", path))
    assert not (driver.root / "workloads" / "big-1").exists()


def test_gpus_are_held_while_running_and_freed_after(make_driver, tmp_path):
    driver = make_driver(gpus=1, node_name="this-node")
    path = script(tmp_path, "import time; time.sleep(60)\n")
    one_gpu = Resources(gpus=1)
    driver.launch(workload("hold-1", path, resources=one_gpu, placement=("this-node",)))
    with pytest.raises(DriverError, match="0 of 1"):
        driver.launch(workload("hold-2", path, resources=one_gpu))
    driver.cancel("hold-1")
    driver.launch(workload("hold-2", path, resources=one_gpu))
    state = json.loads((driver.root / "workloads" / "hold-2" / "workload.json").read_text())
    assert state["replicas"][0]["gpus"] == [0]


def test_images_are_ignored_and_services_have_an_endpoint(driver, tmp_path):
    path = script(tmp_path, "print('served')\n")
    service = workload("svc-1", path, image="vllm/vllm-openai:latest", service=True, ports=(8123,))
    driver.launch(service)
    assert wait_done(driver, "svc-1").phase == Phase.SUCCEEDED
    assert driver.endpoint("svc-1") == "http://127.0.0.1:8123"
    assert driver.endpoint("never-launched") is None
    assert not driver.supports(FEATURE_MULTI_NODE)
    assert not driver.supports(FEATURE_IMAGES)
    assert driver.supports(FEATURE_SERVICES)


def test_run_dir_is_the_workloads_own_when_given(driver, tmp_path):
    path = script(tmp_path, "import os; print(os.getcwd())\n")
    run_dir = tmp_path / "runs" / "job-3"
    driver.launch(workload("cwd-1", path, run_dir=str(run_dir)))
    wait_done(driver, "cwd-1")
    assert driver.logs("cwd-1").strip() == str(run_dir)
    assert driver.run_dir("cwd-1") == run_dir


def test_nodes_without_nvml_report_no_gpu(driver, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    [node] = driver.nodes()
    assert node.name == driver.node_name
    assert node.gpus == 0
    assert node.cpu_cores == os.cpu_count()
    assert node.memory_mib > 0


class _NVMLError(Exception):
    pass


def _fake_nvml(*, fail_init: bool = False) -> types.SimpleNamespace:
    def init() -> None:
        if fail_init:
            raise _NVMLError("Driver Not Loaded")

    memory = types.SimpleNamespace(total=143771 * 1024 * 1024)
    return types.SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda handle: memory,
        # Device files are numbered by minor number, which need not follow NVML's order.
        nvmlDeviceGetMinorNumber=lambda handle: 7 - handle,
    )


def test_nodes_read_gpus_through_nvml(make_driver, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    [node] = make_driver().nodes()
    assert (node.gpus, node.gpu_model, node.gpu_memory_mib) == (8, "NVIDIA H200", 143771)
    assert read_gpus().minors == (7, 6, 5, 4, 3, 2, 1, 0)


def test_nodes_survive_an_nvml_error(make_driver, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail_init=True))
    [node] = make_driver().nodes()
    assert node.gpus == 0


def test_cleanup_deletes_finished_health_checks_a_day_later_and_keeps_jobs(driver, tmp_path,
                                                                          root):
    path = script(tmp_path, "print('measured')")
    check = workload("hc-1", path, labels={"ogai.io/health-check": "gpu-presence"})
    job = workload("job-1-a1", path)
    for spec in (check, job):
        wait_done(driver, driver.launch(spec))
    assert driver.cleanup() == 0, "both ended just now"
    assert driver.cleanup(now=time.time() + 2 * 86400) == 1
    assert not (root / "workloads" / "hc-1").exists()
    assert "measured" in driver.logs("job-1-a1")


def _supervisor_pid(driver: LocalDriver, handle: str) -> int:
    state = json.loads((driver.root / "workloads" / handle / "workload.json").read_text())
    return state["replicas"][0]["pid"]


COUNT_SIGTERMS = """
    import signal, sys, time
    got = []
    def stop(signum, frame):
        got.append(signum)
        print(f"sigterm {len(got)}", flush=True)
        if len(got) == 1:
            time.sleep(0.2)  # a second SIGTERM would land while it saves
            sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    time.sleep(60)
    """


def test_cancel_delivers_sigterm_once(driver, tmp_path):
    driver.launch(workload("once-1", script(tmp_path, COUNT_SIGTERMS)))
    wait_for_log(driver, "once-1", "ready")
    driver.cancel("once-1")
    log = driver.logs("once-1")
    assert "sigterm 1" in log and "sigterm 2" not in log
    assert driver.status(["once-1"])["once-1"].exit_code == 143


def test_sigterm_to_the_supervisor_alone_stops_its_command_and_records_how(driver, tmp_path):
    driver.launch(workload("alone-1", script(tmp_path, COUNT_SIGTERMS)))
    wait_for_log(driver, "alone-1", "ready")
    os.kill(_supervisor_pid(driver, "alone-1"), signal.SIGTERM)  # a person's `kill`
    result = wait_done(driver, "alone-1")
    assert result.exit_code == 143
    log = driver.logs("alone-1")
    assert "sigterm 1" in log and "sigterm 2" not in log
    wait_until(lambda: live_processes(driver.root, "alone-1") == [])


def test_sigint_to_the_supervisor_alone_kills_a_command_that_ignores_it(driver, tmp_path):
    path = script(
        tmp_path,
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(f"child {child.pid}", flush=True)
        time.sleep(60)
        """,
    )
    driver.launch(workload("deaf-1", path, env={"OGAI_STOP_GRACE_S": "0.5"}))
    log = wait_for_log(driver, "deaf-1", "child ")
    grandchild = int(log.split("child ")[1].split()[0])
    os.kill(_supervisor_pid(driver, "deaf-1"), signal.SIGINT)
    result = wait_done(driver, "deaf-1")
    assert result.exit_code == -9
    wait_until(lambda: live_processes(driver.root, "deaf-1", (grandchild,)) == [])
