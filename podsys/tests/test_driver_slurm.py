"""The slurm driver against a real Slurm: a controller, slurmdbd in MariaDB and two slurmd nodes
on this machine (tests/slurm_cluster.py), with tenants' jobs run as their own accounts."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from podsys.drivers.base import (
    CORDONED_BY_PLATFORM,
    SERVICE_PORT_ARG,
    DataMount,
    DriverError,
    Phase,
    Resources,
    Workload,
)
from podsys.drivers.slurm import PENDING_STATES, RUNNING_STATES, SlurmDriver
from tests.slurm_cluster import SlurmCluster, posix_accounts, shared_folder

TENANT_UID = 1_990_000_001
OTHER_UID = 1_990_000_002


@pytest.fixture(scope="module")
def slurm():
    with SlurmCluster.temporary() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tenant_accounts():
    with posix_accounts(TENANT_UID, OTHER_UID) as names:
        yield names


@pytest.fixture
def shared():
    with shared_folder() as folder:
        yield folder


@pytest.fixture
def driver(slurm, tenant_accounts, shared):
    return SlurmDriver(cluster="hpc", options={
        "slurm_conf": str(slurm.conf), "shared_dir": str(shared / "cluster"), "grace_s": 10})


def _workload(workload_id: str, code: str, *, replicas: int = 1, gpus: int = 1,
              placement: tuple[str, ...] = (), **fields) -> Workload:
    return Workload(id=workload_id, command=(sys.executable, "-c", textwrap.dedent(code)),
                    resources=Resources(gpus=gpus, cpu_cores=1, memory_mib=256),
                    replicas=replicas, placement=placement, tenant="acme",
                    run_as=TENANT_UID, **fields)


def _wait(driver, handle, phases, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = driver.status([handle])[handle]
        if status.phase in phases or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def _left_the_queue(driver, handle, timeout=60.0):
    """Wait until Slurm no longer lists the job as pending or running: it stays COMPLETING a
    moment after it ended, and the driver keeps what such a job binds."""
    job_id = int(driver._load(handle)["job_id"])
    deadline = time.monotonic() + timeout
    while any(job.job_id == job_id and job.state in PENDING_STATES | RUNNING_STATES
              for job in driver.cli.jobs()):
        assert time.monotonic() < deadline, f"Slurm still lists job {job_id}"
        time.sleep(0.2)


def _slurm_jobs(slurm, name):
    # 22.05's squeue --json ignores its filters: every job, all states.
    return [job for job in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
            if job["name"] == name]


ALL_REDUCE = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} uid {os.getuid()} "
          f"sum {tensor.item()}", flush=True)
    dist.destroy_process_group()
"""


def test_the_connection_check_says_version_nodes_gpus_and_accounting(driver):
    report = driver.check_connection()
    assert report.ok, report.message
    assert report.message.startswith("Slurm 22.05")
    assert report.details["nodes"] == 2 and report.details["gpus"] == 4
    assert report.details["partitions"] == ["batch"]
    assert report.details["accounting"] is True


def test_nodes_come_from_sinfo_with_their_gpus(driver):
    nodes = {node.name: node for node in driver.nodes()}
    assert set(nodes) == {"n1", "n2"}
    assert nodes["n1"].gpus == 2 and nodes["n1"].gpu_model == "h100"
    assert nodes["n1"].cpu_cores == 4 and nodes["n1"].memory_mib == 4096
    assert nodes["n1"].ready and nodes["n1"].schedulable


def test_a_two_replica_torch_job_all_reduces_across_both_nodes_as_the_tenant(driver, slurm):
    workload = _workload("job-1-a1", ALL_REDUCE, replicas=2, placement=("n1", "n2"),
                         time_limit_s=120)
    handle = driver.launch(workload)
    assert driver.launch(workload) == handle  # idempotent: the same job, not a second one
    status = _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED})
    assert status.phase == Phase.SUCCEEDED, (status, driver.logs(handle, replica=0),
                                             driver.logs(handle, replica=1))
    assert [r.node for r in status.replicas] == ["n1", "n2"]
    for rank in (0, 1):
        assert f"rank {rank} of 2 uid {TENANT_UID} sum 3.0" in driver.logs(handle, replica=rank)
    assert len(_slurm_jobs(slurm, handle)) == 1
    usage = driver.usage(handle)  # sacct's: one GPU on each of two nodes
    assert usage is not None and usage.gpus == 2 and usage.cpu_cores == 2
    assert usage.ended_at >= usage.started_at > 0
    assert driver.usage("job-404-a1") is None
    job = _slurm_jobs(slurm, handle)[0]
    assert job["user_id"] == TENANT_UID and job["time_limit"] == 2
    folder = driver.root / "workloads" / handle
    assert folder.stat().st_uid == TENANT_UID and folder.stat().st_mode & 0o777 == 0o700
    launch = folder / "launch.json"
    assert launch.stat().st_mode & 0o777 == 0o600
    state = driver.root / "state" / f"{handle}.json"
    assert state.stat().st_uid == os.getuid() and state.stat().st_mode & 0o777 == 0o600


def test_secrets_reach_the_job_through_its_own_file_never_the_command_line(driver, slurm):
    workload = _workload("job-2-a1", """
        import os; print("token", os.environ["OGAI_TOKEN"] == "s3cret")
    """, secret_env={"OGAI_TOKEN": "s3cret"})
    handle = driver.launch(workload)
    assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    assert "token True" in driver.logs(handle)
    assert "s3cret" not in json.dumps(_slurm_jobs(slurm, handle))
    assert "s3cret" not in (driver.root / "workloads" / handle / "batch.sh").read_text()


def test_a_failing_rank_fails_the_workload_with_its_exit_code(driver):
    handle = driver.launch(_workload("job-3-a1", "import sys; sys.exit(3)", gpus=0))
    status = _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED})
    assert status.phase == Phase.FAILED and status.exit_code == 3
    assert status.reason == "exit code 3"


def test_cancel_lets_the_job_write_its_checkpoint(driver, shared):
    checkpoints = shared / "ckpt"
    handle = driver.launch(_workload("job-4-a1", f"""
        import signal, sys, time, pathlib
        def save(signum, frame):
            pathlib.Path({str(checkpoints)!r}, "step.txt").write_text("42")
            sys.exit(0)
        signal.signal(signal.SIGTERM, save)
        print("training", flush=True)
        time.sleep(600)
    """, checkpoint_dir=str(checkpoints)))
    deadline = time.monotonic() + 60
    while "training" not in driver.logs(handle) and time.monotonic() < deadline:
        time.sleep(0.3)
    driver.cancel(handle)
    assert (checkpoints / "step.txt").read_text() == "42"
    assert checkpoints.stat().st_uid == TENANT_UID
    status = _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED})
    assert status.phase != Phase.RUNNING
    driver.cancel(handle)  # cancelling what has ended does nothing
    driver.cancel("job-404-a1")


def test_a_node_lost_mid_job_fails_the_job_and_names_the_node(driver, slurm):
    handle = driver.launch(_workload("job-5-a1", "import time; print('up', flush=True); "
                                     "time.sleep(600)", placement=("n2",)))
    assert _wait(driver, handle, {Phase.RUNNING}).phase == Phase.RUNNING
    n2 = _node_when(driver, "n2", lambda node: node.gpus_allocated == 1)
    assert n2.gpus_allocated == 1 and n2.gpus_foreign == 0  # ours, not someone else's
    slurm.lose_node("n2", reason="power supply")
    try:
        status = _wait(driver, handle, {Phase.FAILED, Phase.SUCCEEDED})
        assert status.phase == Phase.FAILED
        assert status.node_lost == "n2"
        assert status.reason == "a node of its allocation failed"
        n2 = next(node for node in driver.nodes() if node.name == "n2")
        assert not n2.ready and not n2.schedulable and n2.reason == "power supply"
    finally:
        slurm.restore_node("n2")


SERVICE = """
    import http.server, os, sys
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"uid {os.getuid()} port {os.environ['OGAI_SERVICE_PORT']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Answer).serve_forever()
"""


def _answer(url: str, timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_service_answers_at_its_nodes_address_on_the_port_the_node_gave_it(
        driver, slurm, shared):
    workload = Workload(id="svc-1-a1", command=(sys.executable, "-c", textwrap.dedent(SERVICE),
                                                SERVICE_PORT_ARG),
                        resources=Resources(cpu_cores=1, memory_mib=256), service=True,
                        ports=(0,), tenant="acme", run_as=TENANT_UID)
    handle = driver.launch(workload)
    assert _wait(driver, handle, {Phase.RUNNING, Phase.FAILED}).phase == Phase.RUNNING
    deadline = time.monotonic() + 30
    while (endpoint := driver.endpoint(handle)) is None:
        assert time.monotonic() < deadline, driver.logs(handle)
        time.sleep(0.2)
    [job] = _slurm_jobs(slurm, handle)
    address = {node["name"]: node["address"]
               for node in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]}
    assert endpoint.startswith(f"http://{address[job['nodes']]}:")
    port = int(endpoint.rsplit(":", 1)[1])
    assert _answer(endpoint).text == f"uid {TENANT_UID} port {port}"

    # The job's folder is the tenant's: what it writes there cannot point the platform
    # elsewhere. The node is Slurm's word; a port file holding anything but a port is no port.
    folder = shared / "cluster" / "workloads" / handle
    (folder / "replica-0.node").write_text("attacker.example")
    assert driver.endpoint(handle) == endpoint
    for forged in ("22", "10.0.0.1:8000", "http://attacker.example:80", "99999"):
        (folder / "replica-0.port").write_text(forged)
        assert driver.endpoint(handle) is None, forged
    (folder / "replica-0.port").write_text(str(port))
    driver.cancel(handle)
    assert driver.endpoint(handle) is None


def test_drain_and_resume_are_slurms_own(driver, slurm):
    driver.set_schedulable("n1", False, "health check gpu-burn failed")
    n1 = next(node for node in driver.nodes() if node.name == "n1")
    assert not n1.schedulable and n1.reason == "health check gpu-burn failed"
    assert n1.labels[CORDONED_BY_PLATFORM] == "true"
    raw = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]
               if n["name"] == "n1")
    assert "DRAIN" in raw["state_flags"]
    assert raw["reason"] == "ogai: health check gpu-burn failed"
    driver.set_schedulable("n1", True)
    # Slurm pings a resumed node before it takes work again.
    assert _node_when(driver, "n1", lambda node: node.schedulable).schedulable


def _node_when(driver, name, condition, timeout=45.0):
    deadline = time.monotonic() + timeout
    while True:
        node = next(node for node in driver.nodes() if node.name == name)
        if condition(node) or time.monotonic() > deadline:
            return node
        time.sleep(0.5)


def test_jobs_submitted_by_hand_count_in_the_inventory_and_are_never_taken_for_ours(
        driver, slurm, tenant_accounts):
    # A user's own job on n1, holding both its GPUs, named like a workload of ours.
    out = slurm.run("sbatch", "--parsable", f"--uid={OTHER_UID}", f"--gid={OTHER_UID}",
                    "--job-name=job-6-a1", "--nodelist=n1", "--gres=gpu:2", "--mem=100M",
                    "--output=/dev/null", "--chdir=/tmp", "--wrap", "sleep 600").stdout
    foreign = out.strip().split(";")[0]
    try:
        # Slurm may show the node's GPUs allocated a moment before it lists the job running.
        n1 = _node_when(driver, "n1",
                        lambda node: node.gpus_allocated == 2 and node.gpus_foreign == 2)
        assert n1.gpus_allocated == 2 and n1.gpus_foreign == 2
        assert driver.status(["job-6-a1"])["job-6-a1"].phase == Phase.MISSING
        driver.cancel("job-6-a1")  # not ours: nothing happens to it
        assert _slurm_jobs(slurm, "job-6-a1")[0]["job_state"] == "RUNNING"
    finally:
        slurm.run("scancel", foreign, check=False)


def test_a_tenants_work_without_an_account_is_refused(driver):
    workload = _workload("job-7-a1", "print(1)")
    with pytest.raises(DriverError, match="names no cluster account"):
        driver.launch(Workload(**{**workload.__dict__, "run_as": None}))


def test_a_shared_path_the_tenant_cannot_reach_is_refused_in_plain_words(
        slurm, tenant_accounts, shared):
    private = shared / "private"
    private.mkdir(mode=0o700)
    driver = SlurmDriver(cluster="hpc", options={"slurm_conf": str(slurm.conf),
                                                 "shared_dir": str(private / "cluster")})
    with pytest.raises(DriverError, match=f"{private} is mode 0700"):
        driver.launch(_workload("job-9-a1", "print(1)"))
    assert _slurm_jobs(slurm, "job-9-a1") == []


def test_what_a_launch_would_run_is_shown_without_submitting(driver, slurm):
    text = driver.render(_workload("job-8-a1", "print(1)", replicas=2, placement=("n1", "n2"),
                                   time_limit_s=3600))
    assert "--nodelist=n1,n2" in text and "--ntasks-per-node=1" in text
    assert "--gres=gpu:1" in text and "--time=60" in text and f"--uid={TENANT_UID}" in text
    assert _slurm_jobs(slurm, "job-8-a1") == []
    assert not Path(driver.root / "workloads" / "job-8-a1").exists()


def test_a_launch_cut_short_after_sbatch_is_adopted_not_submitted_twice(
        driver, slurm, monkeypatch):
    class Stopped(Exception):
        pass

    def stop(self, handle, state):
        raise Stopped  # the platform's worker died before it recorded the job id

    workload = _workload("job-10-a1", "print('once', flush=True)")
    with monkeypatch.context() as patched:
        patched.setattr(SlurmDriver, "_record", stop)
        with pytest.raises(Stopped):
            driver.launch(workload)
    assert len(_slurm_jobs(slurm, "job-10-a1")) == 1
    assert driver.status(["job-10-a1"])["job-10-a1"].phase == Phase.MISSING

    # The reconcile launches it again: the running job is found, nothing is resubmitted.
    assert driver.launch(workload) == "job-10-a1"
    assert _wait(driver, "job-10-a1", {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    assert len(_slurm_jobs(slurm, "job-10-a1")) == 1
    assert driver.logs("job-10-a1").strip() == "once"


def test_a_job_forged_with_a_cut_short_launchs_name_and_comment_is_not_adopted(
        driver, slurm, monkeypatch):
    def stop(self, handle, state):
        raise RuntimeError("stopped")

    workload = _workload("job-11-a1", "import time; time.sleep(3); print('ours', flush=True)")
    with monkeypatch.context() as patched:
        patched.setattr(SlurmDriver, "_record", stop)
        with pytest.raises(RuntimeError):
            driver.launch(workload)
    ours = _slurm_jobs(slurm, "job-11-a1")[0]
    # Another account copies what squeue shows of it (its name and comment) into its own job,
    # submitted before the platform comes back.
    forged = slurm.run("sbatch", "--parsable", f"--uid={OTHER_UID}", f"--gid={OTHER_UID}",
                       "--job-name=job-11-a1", f"--comment={ours['comment']}", "--mem=100M",
                       "--output=/dev/null", "--chdir=/tmp", "--wrap", "sleep 600").stdout
    try:
        driver.launch(workload)
        assert driver._load("job-11-a1")["job_id"] == ours["job_id"]
        assert _wait(driver, "job-11-a1", {Phase.SUCCEEDED, Phase.FAILED}).phase == \
            Phase.SUCCEEDED
        assert driver.logs("job-11-a1").strip() == "ours"
        assert len(_slurm_jobs(slurm, "job-11-a1")) == 2  # ours, once, and the forgery
    finally:
        slurm.run("scancel", forged.strip().split(";")[0], check=False)


@pytest.fixture
def data_dir(settings, tmp_path):
    """The platform's data directory, its own (0700) as in production."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    settings.DATA_DIR = data
    return data


def _dataset(data_dir: Path, text: str) -> Path:
    version = data_dir / "datasets" / "acme" / "1-docs" / "v1-0a1b2c3d4e5f"
    version.mkdir(parents=True, exist_ok=True)
    (version / "docs.jsonl").write_text(text)
    return version


READS_AND_WRITES = """
    import os, pathlib, sys
    dataset, run, data = (pathlib.Path(p) for p in sys.argv[1:4])
    print("read", (dataset / "docs.jsonl").read_text().strip(), flush=True)
    print("spec", (run / "spec.json").read_text(), flush=True)
    (run / "output").mkdir()
    (run / "output" / "result.txt").write_text(f"written by {os.getuid()}")
    try:
        (dataset / "planted.txt").write_text("x")
    except OSError as exc:
        print("dataset", exc.strerror, flush=True)
    print("data holds", sorted(p.name for p in data.iterdir()), flush=True)
"""


def _reads_and_writes(workload_id, dataset, run, data_dir, **fields):
    workload = _workload(workload_id, READS_AND_WRITES, gpus=0, data_mounts=(
        DataMount(str(dataset), read_only=True), DataMount(str(run), read_only=False)),
        **fields)
    return Workload(**{**workload.__dict__, "command": (
        *workload.command, str(dataset), str(run), str(data_dir))})


def test_a_job_sees_its_datasets_and_run_folder_at_their_paths_and_nothing_else(
        driver, data_dir):
    dataset = _dataset(data_dir, '{"text": "hello"}')
    (data_dir / "ogai.sqlite3").write_text("every tenant's rows")
    run = data_dir / "ylink" / "training-runs" / "5-20261204T000000"
    run.mkdir(parents=True)
    (run / "spec.json").write_text('{"steps": 3}')

    handle = driver.launch(_reads_and_writes("job-12-a1", dataset, run, data_dir))
    status = _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED})
    log = driver.logs(handle)
    assert status.phase == Phase.SUCCEEDED, log
    assert 'read {"text": "hello"}' in log and 'spec {"steps": 3}' in log
    assert "dataset Read-only file system" in log
    assert "data holds ['datasets', 'ylink']" in log  # not the database, nor anything else
    # What the job wrote is where the platform reads it, at the run folder's own path.
    assert (run / "output" / "result.txt").read_text() == f"written by {TENANT_UID}"
    assert run.is_symlink()
    home = Path(os.readlink(run))
    assert home == driver.root / "data" / run.relative_to(data_dir)
    assert home.stat().st_uid == TENANT_UID and home.stat().st_mode & 0o777 == 0o700
    # The dataset was staged for the tenant's account: root's, closed to every other one.
    assert not (dataset / "planted.txt").exists()
    top = driver.root / "staged" / str(TENANT_UID)
    assert (top.stat().st_uid, top.stat().st_gid, top.stat().st_mode & 0o777) == \
        (0, TENANT_UID, 0o750)
    [staged] = (top / "datasets" / "acme" / "1-docs").iterdir()
    assert staged.name.startswith("v1-0a1b2c3d4e5f@")
    assert (staged / "docs.jsonl").stat().st_uid == 0


def test_a_staged_dataset_is_reused_until_it_changes_and_a_later_run_finds_its_home(
        driver, data_dir):
    dataset = _dataset(data_dir, '{"text": "first"}')
    runs = data_dir / "ylink" / "training-runs"
    for number in (13, 14, 15):
        (runs / str(number)).mkdir(parents=True)
        (runs / str(number) / "spec.json").write_text(str(number))
    for number in (13, 14):
        handle = driver.launch(_reads_and_writes(f"job-{number}-a1", dataset,
                                                 runs / str(number), data_dir))
        assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == \
            Phase.SUCCEEDED, driver.logs(handle)
    staged = driver.root / "staged" / str(TENANT_UID) / "datasets" / "acme" / "1-docs"
    assert len(list(staged.iterdir())) == 1  # the same copy for both

    (dataset / "docs.jsonl").write_text('{"text": "second"}')
    handle = driver.launch(_reads_and_writes("job-15-a1", dataset, runs / "15", data_dir))
    assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    assert 'read {"text": "second"}' in driver.logs(handle)
    assert len(list(staged.iterdir())) == 2  # a new copy; the one jobs may still read stays

    # A retry of run 13 (its folder moved to the shared path already) finds it there.
    (runs / "13" / "output" / "result.txt").unlink()
    (runs / "13" / "output").rmdir()
    handle = driver.launch(_reads_and_writes("job-13-a2", dataset, runs / "13", data_dir))
    assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    assert "spec 13" in driver.logs(handle)


def test_another_tenants_job_reaches_none_of_a_tenants_data_on_the_shared_path(
        driver, data_dir):
    dataset = _dataset(data_dir, '{"text": "acme only"}')
    run = data_dir / "ylink" / "training-runs" / "16"
    run.mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    handle = driver.launch(_reads_and_writes("job-16-a1", dataset, run, data_dir))
    assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    [staged] = (driver.root / "staged" / str(TENANT_UID) / "datasets" / "acme" / "1-docs"
                ).iterdir()
    home = driver.root / "data" / "ylink" / "training-runs" / "16"

    # The rival's own job, on the same nodes, goes for them by path and by listing.
    rival = Workload(**{**_workload("job-17-a1", f"""
        import os
        for path in ({str(staged / "docs.jsonl")!r}, {str(home / "output" / "result.txt")!r}):
            try:
                print("read", open(path).read(), flush=True)
            except OSError as exc:
                print("refused", exc.strerror, flush=True)
        for folder in ({str(driver.root / "data")!r}, {str(driver.root / "staged")!r}):
            try:
                print("listed", os.listdir(folder), flush=True)
            except OSError as exc:
                print("refused", exc.strerror, flush=True)
    """, gpus=0).__dict__, "tenant": "rival", "run_as": OTHER_UID})
    handle = driver.launch(rival)
    assert _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    log = driver.logs(handle)
    assert "read" not in log and "listed" not in log
    assert log.count("refused Permission denied") == 4

    # Handed the tenant's run folder itself (a platform bug), the rival's job cannot open it.
    stolen = Workload(**{**_workload("job-18-a1", f"print(open({str(run / 'spec.json')!r}))",
                                     gpus=0, data_mounts=(DataMount(str(run)),)).__dict__,
                         "tenant": "rival", "run_as": OTHER_UID})
    handle = driver.launch(stolen)
    status = _wait(driver, handle, {Phase.SUCCEEDED, Phase.FAILED})
    assert status.phase == Phase.FAILED
    assert "Permission denied" in driver.logs(handle)


def test_cleanup_removes_staged_copies_once_no_job_binds_them_for_a_day(driver, data_dir):
    dataset = _dataset(data_dir, '{"text": "first"}')
    reading = _workload("job-19-a1", "import time; print('up', flush=True); time.sleep(600)",
                        gpus=0, data_mounts=(DataMount(str(dataset)),))
    running = driver.launch(reading)
    assert _wait(driver, running, {Phase.RUNNING, Phase.FAILED}).phase == Phase.RUNNING
    (dataset / "docs.jsonl").write_text('{"text": "second"}')
    done = driver.launch(_workload("job-20-a1", "print('read')", gpus=0,
                                   data_mounts=(DataMount(str(dataset)),)))
    assert _wait(driver, done, {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    _left_the_queue(driver, done)
    staged = driver.root / "staged" / str(TENANT_UID) / "datasets" / "acme" / "1-docs"
    # The running job's copy is the one its state recorded (two stagings within a second
    # share a modification time, so age cannot tell them apart).
    bound = {Path(source) for source in driver._load(running)["binds"]}
    [first] = [copy for copy in staged.iterdir() if copy in bound]
    [second] = [copy for copy in staged.iterdir() if copy != first]

    assert driver.cleanup() == 0  # both used today
    day_after = time.time() + 2 * 24 * 3600
    assert driver.cleanup(now=day_after) == 1  # the finished job's; the running one keeps its
    assert [copy.name for copy in staged.iterdir()] == [first.name]
    driver.cancel(running)
    assert _wait(driver, running, {Phase.SUCCEEDED, Phase.FAILED}).phase != Phase.RUNNING
    _left_the_queue(driver, running)
    assert driver.cleanup(now=day_after) == 1
    assert list(staged.iterdir()) == []
    assert second.name != first.name
