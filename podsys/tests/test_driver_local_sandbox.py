"""A tenant's replica on the local driver runs in a bubblewrap sandbox as the tenant's own user.

Each test attacks the sandbox from inside, as a tenant's program would, and asserts the attack
fails, while the program can still do its job: write its run and checkpoint folders and read the
folders its workload names. These tests run the real bubblewrap (`make test` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from podsys.drivers import sandbox
from podsys.drivers.base import (
    FEATURE_SANDBOX,
    DataMount,
    DriverError,
    Phase,
    Resources,
    Workload,
)
from podsys.drivers.local import LocalDriver

DEADLINE_S = 30.0
TENANT_UID = 1_000_000_042
OTHER_UID = 1_000_000_043


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@pytest.fixture
def data_dir() -> Path:
    """A scratch folder inside the platform's data directory, as the toolchain's are."""
    folder = Path(settings.DATA_DIR) / "sandbox-tests" / f"{os.getpid()}-{time.time_ns()}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_driver(root: Path) -> Iterator[Callable[..., LocalDriver]]:
    made: list[LocalDriver] = []

    def make(**options) -> LocalDriver:
        driver = LocalDriver(cluster="sandbox", options={"root": str(root), "grace_s": 2,
                                                          **options})
        made.append(driver)
        return driver

    yield make
    for folder in (root / "workloads").glob("*"):
        made[0].cancel(folder.name)


@pytest.fixture
def driver(make_driver) -> LocalDriver:
    driver = make_driver()
    assert driver.supports(FEATURE_SANDBOX), driver.sandbox_refusal
    return driver


def tenant_workload(id: str, code: str, *, tenant: str = "beta", uid: int = TENANT_UID,
                    **fields) -> Workload:
    fields.setdefault("resources", Resources())
    return Workload(id=id, command=(sys.executable, "-c", textwrap.dedent(code)),
                    tenant=tenant, run_as=uid, **fields)


def finish(driver: LocalDriver, handle: str) -> object:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        status = driver.status([handle])[handle]
        if status.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return status
        time.sleep(0.05)
    raise AssertionError(f"{handle} did not finish: {driver.logs(handle)}")


def report(driver: LocalDriver, handle: str) -> dict:
    """The attacker's findings: the last line of its log, as JSON."""
    status = finish(driver, handle)
    log = driver.logs(handle)
    assert status.phase == Phase.SUCCEEDED, log
    return json.loads(log.strip().splitlines()[-1])


ATTACKS = """
import json, os, pathlib
found = {}

def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        found[name] = f"refused: {exc.strerror}"
    else:
        found[name] = f"worked: {str(result)[:200]}"

data = os.environ["DATA_DIR"]
attempt("secret_key", lambda: pathlib.Path(data, "secret_key").read_text())
attempt("database", lambda: pathlib.Path(data, "test.sqlite3").read_bytes())
attempt("data_dir", lambda: os.listdir(data))
attempt("other_workload", lambda: pathlib.Path(os.environ["OTHER"], "workload.json").read_text())
attempt("own_state", lambda: pathlib.Path(os.environ["OWN_STATE"], "workload.json").read_text())
victim = os.environ["VICTIM_PID"]
attempt("victim_environ", lambda: pathlib.Path(f"/proc/{victim}/environ").read_bytes())
attempt("write_usr", lambda: pathlib.Path("/usr/owned").write_text("x"))
attempt("write_root", lambda: pathlib.Path("/owned").write_text("x"))
attempt("write_dataset", lambda: pathlib.Path(os.environ["DATASET"], "owned").write_text("x"))
attempt("shadow", lambda: pathlib.Path("/etc/shadow").read_text())
environs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs.append(pathlib.Path(f"/proc/{pid}/environ").read_bytes())
        except OSError:
            pass
found["tokens_seen"] = sum(b"VICTIM_TOKEN" in e for e in environs)
found["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
found["uid"] = [os.getuid(), os.geteuid(), os.getgid()]
found["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")]
checkpoint = os.environ["OGAI_CHECKPOINT_DIR"]
attempt("checkpoint", lambda: pathlib.Path(checkpoint, "ck").write_text("saved"))
attempt("run_dir", lambda: pathlib.Path("out.txt").write_text("mine"))
attempt("tmp", lambda: pathlib.Path("/tmp/scratch").write_text("scratch"))
attempt("dataset", lambda: pathlib.Path(os.environ["DATASET"], "doc.jsonl").read_text())
print(json.dumps(found))
"""

VICTIM = """
import time
time.sleep(120)
"""


def test_a_tenants_program_reaches_nothing_it_was_not_given(driver, root, data_dir, tmp_path):
    # Another tenant's service, holding a token in its environment, as a notebook does.
    driver.launch(tenant_workload("victim-1", VICTIM, tenant="alpha", uid=OTHER_UID,
                                  secret_env={"VICTIM_TOKEN": "ogai_victim"}))
    victim_state = json.loads((root / "workloads" / "victim-1" / "workload.json").read_text())
    dataset = data_dir / "dataset"
    dataset.mkdir()
    (dataset / "doc.jsonl").write_text('{"text": "mine to read"}\n')
    checkpoint = data_dir / "checkpoints"
    handle = driver.launch(tenant_workload(
        "attacker-1", ATTACKS, checkpoint_dir=str(checkpoint),
        data_mounts=(DataMount(str(dataset), read_only=True),),
        env={"DATA_DIR": str(settings.DATA_DIR), "OTHER": str(root / "workloads" / "victim-1"),
             "OWN_STATE": str(root / "workloads" / "attacker-1"),
             "VICTIM_PID": str(victim_state["replicas"][0]["pid"]), "DATASET": str(dataset)}))
    found = report(driver, handle)
    for attack in ("secret_key", "database", "other_workload", "own_state", "victim_environ",
                   "write_usr", "write_root", "write_dataset", "shadow"):
        assert found[attack].startswith("refused"), (attack, found[attack])
    # The data directory's path exists only as the empty folders above the job's own mounts.
    assert found["data_dir"] == "worked: ['sandbox-tests']", found["data_dir"]
    assert found["tokens_seen"] == 0
    assert found["pids"] == [1, 2]  # bubblewrap's reaper and itself: nobody else's processes
    assert found["uid"] == [TENANT_UID, TENANT_UID, TENANT_UID]
    assert found["caps"] == ["0000000000000000"]
    # What it was given still works.
    for allowed in ("checkpoint", "run_dir", "tmp", "dataset"):
        assert found[allowed].startswith("worked"), (allowed, found[allowed])
    assert (checkpoint / "ck").read_text() == "saved"
    assert (checkpoint / "ck").stat().st_uid == TENANT_UID
    assert (driver.run_dir(handle) / "out.txt").read_text() == "mine"
    assert not Path("/tmp/scratch").exists()  # noqa: S108 - its /tmp was its own


def test_secrets_stay_out_of_every_file_and_the_state_is_the_platforms_alone(driver, root):
    handle = driver.launch(tenant_workload(
        "secret-1", "import os; print(os.environ['TOKEN'][::-1])",
        secret_env={"TOKEN": "ogai_s3cret"}))
    finish(driver, handle)
    assert driver.logs(handle).strip() == "terc3s_iago"  # it reached the process's environment
    folder = root / "workloads" / handle
    for path in folder.rglob("*"):
        if path.is_file():
            assert b"ogai_s3cret" not in path.read_bytes(), path
    assert json.loads((folder / "workload.json").read_text())["spec"]["secret_env"] == ["TOKEN"]
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert ((folder / "workload.json").stat().st_mode & 0o777) == 0o600


def test_a_replica_sees_only_the_gpus_it_was_given(make_driver, tmp_path):
    # Stand-ins for the device files of a 4-GPU machine (this one has none).
    devices = tmp_path / "dev"
    devices.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (devices / name).write_text(name)
    driver = make_driver(gpus=4, gpu_device_dir=str(devices))
    holder = driver.launch(tenant_workload("gpu-holder", VICTIM, resources=Resources(gpus=2)))
    code = f"""
    import json, os
    seen = sorted(n for n in os.listdir({str(devices)!r}) )
    tried = {{}}
    for index in range(4):
        try:
            open(os.path.join({str(devices)!r}, f"nvidia{{index}}")).read()
            tried[index] = "opened"
        except OSError as exc:
            tried[index] = exc.strerror
    print(json.dumps({{"seen": seen, "tried": tried,
                      "visible": os.environ["CUDA_VISIBLE_DEVICES"]}}))
    """
    found = report(driver, driver.launch(tenant_workload("gpu-1", code,
                                                         resources=Resources(gpus=1))))
    # GPUs 0 and 1 are the holder's: this replica got GPU 2 and its device file only.
    assert found["seen"] == ["nvidia-uvm", "nvidia2", "nvidiactl"]
    assert found["tried"] == {"0": "No such file or directory", "1": "No such file or directory",
                              "2": "opened", "3": "No such file or directory"}
    assert found["visible"] == "0"  # CUDA numbers what it can see from 0
    driver.cancel(holder)


def test_a_link_planted_in_a_folder_the_tenant_wrote_never_opens_another_folder(driver,
                                                                               data_dir):
    """A fine-tune reads its base model from a folder an earlier run of the tenant wrote: if
    that run left a link there, the sandbox must not follow it (bwrap would bind the target)."""
    output = data_dir / "run-7"
    output.mkdir()
    (output / "model").symlink_to(settings.DATA_DIR)
    with pytest.raises(DriverError, match="without following links"):
        driver.launch(tenant_workload(
            "linked-1", "print('bound')",
            data_mounts=(DataMount(str(output / "model"), read_only=True),)))


def test_a_cancelled_sandboxed_job_gets_sigterm_and_its_grace_to_save(driver, data_dir):
    checkpoint = data_dir / "ck"
    code = """
    import os, pathlib, signal, sys, time
    def save(signum, frame):
        pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"], "saved").write_text("on sigterm")
        sys.exit(0)
    signal.signal(signal.SIGTERM, save)
    print("ready", flush=True)
    time.sleep(120)
    """
    handle = driver.launch(tenant_workload("term-1", code, checkpoint_dir=str(checkpoint)))
    deadline = time.monotonic() + DEADLINE_S
    while "ready" not in driver.logs(handle):
        assert time.monotonic() < deadline, driver.logs(handle)
        time.sleep(0.05)
    driver.cancel(handle)
    assert (checkpoint / "saved").read_text() == "on sigterm"


def test_a_command_killed_by_a_signal_says_so(driver):
    status = finish(driver, driver.launch(tenant_workload(
        "killed-1", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")))
    assert status.exit_code == -signal.SIGKILL
    assert status.reason == "killed by signal SIGKILL"


def test_without_a_sandbox_tenants_work_is_refused_and_the_platforms_own_runs(make_driver,
                                                                               settings):
    driver = make_driver(bwrap="/nonexistent/bwrap")
    assert not driver.supports(FEATURE_SANDBOX)
    assert "bubblewrap" in driver.unsupported[FEATURE_SANDBOX]
    with pytest.raises(DriverError, match="runs no tenant's work: it cannot sandbox it"):
        driver.launch(tenant_workload("refused-1", "print('escaped')"))
    assert not (driver.root / "workloads" / "refused-1" / "replica-0.log").exists()
    # A health check is the platform's own work: it runs as before.
    own = Workload(id="check-1", command=(sys.executable, "-c", "print('checked')"),
                   resources=Resources())
    assert finish(driver, driver.launch(own)).phase == Phase.SUCCEEDED
    # A platform serving one tenant may run that tenant's work unconfined.
    settings.OGAI_SINGLE_TENANT = True
    alone = driver.launch(tenant_workload("alone-1", "import os; print(os.getuid())"))
    assert finish(driver, alone).phase == Phase.SUCCEEDED
    assert driver.logs(alone).strip() == str(os.getuid())


def test_the_command_shows_only_a_python_environment_never_the_folder_around_it(tmp_path):
    """The command is the tenant's to write: naming a program must not bind its folder (an
    operator's ~/.ssh, another workload's folder); a venv or conda environment it names is
    shown read-only, unless it lies in the data directory, which is never shown."""
    secrets = tmp_path / "home" / ".ssh"
    secrets.mkdir(parents=True)
    assert not any(str(secrets) in path for path in
                   sandbox.readonly_paths((str(secrets / "id_rsa"),), hidden=[tmp_path / "d"]))
    venv = tmp_path / "envs" / "vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.base_prefix) / 'bin'}\n")
    shown = sandbox.readonly_paths((str(venv / "bin" / "vllm"),), hidden=[tmp_path / "d"])
    assert str(venv) in shown and str(Path(sys.base_prefix).resolve()) in shown
    inside = tmp_path / "d" / "jobs" / "env"
    (inside / "bin").mkdir(parents=True)
    (inside / "pyvenv.cfg").write_text("home = /usr/bin\n")
    shown = sandbox.readonly_paths((str(inside / "bin" / "python"),), hidden=[tmp_path / "d"])
    assert not any(path.startswith(str(tmp_path / "d")) for path in shown)
    with pytest.raises(sandbox.SandboxError, match="overlap"):
        sandbox.readonly_paths(("python",), hidden=[tmp_path / "d"], extra=[str(tmp_path)])


def test_sigterm_to_a_sandboxed_supervisor_alone_reaches_its_command(driver, data_dir):
    """A person's `kill` of the supervisor: forwarded into the sandbox, the command saves and
    ends, its exit code is recorded, nothing is left."""
    checkpoint = data_dir / "ck"
    code = """
    import os, pathlib, signal, sys, time
    def save(signum, frame):
        pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"], "saved").write_text("on sigterm")
        sys.exit(3)
    signal.signal(signal.SIGTERM, save)
    print("ready", flush=True)
    time.sleep(120)
    """
    handle = driver.launch(tenant_workload("alone-1", code, checkpoint_dir=str(checkpoint)))
    deadline = time.monotonic() + DEADLINE_S
    while "ready" not in driver.logs(handle):
        assert time.monotonic() < deadline, driver.logs(handle)
        time.sleep(0.05)
    state = json.loads((driver.root / "workloads" / handle / "workload.json").read_text())
    supervisor = state["replicas"][0]["pid"]
    os.kill(supervisor, signal.SIGTERM)
    status = finish(driver, handle)
    assert status.exit_code == 3
    assert (checkpoint / "saved").read_text() == "on sigterm"
    while os.path.exists(f"/proc/{supervisor}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{supervisor}") or \
        Path(f"/proc/{supervisor}/stat").read_text().split()[2] == "Z"


def test_only_a_job_holding_rdma_devices_sees_their_device_files(make_driver, tmp_path):
    # Stand-ins for a host with one HCA (this one has none): its sysfs entry and device files.
    listed, devices = tmp_path / "infiniband-class", tmp_path / "infiniband"
    (listed / "mlx5_0").mkdir(parents=True)
    devices.mkdir()
    for name in ("uverbs0", "rdma_cm"):
        (devices / name).write_text(name)
    driver = make_driver(rdma_device_dir=str(listed), rdma_char_dir=str(devices))
    code = f"""
    import json, os
    print(json.dumps(sorted(os.listdir({str(devices)!r}))
                     if os.path.isdir({str(devices)!r}) else None))
    """
    held = report(driver, driver.launch(tenant_workload("rdma-1", code,
                                                        resources=Resources(rdma=1))))
    plain = report(driver, driver.launch(tenant_workload("rdma-0", code)))
    assert held == ["rdma_cm", "uverbs0"]
    assert plain is None
