"""Named Python environments and the shipped working folder on the local driver, against real
interpreters and processes: `python train.py` finds the job's train.py and runs in the
environment the job names, confined or not."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from podsys.drivers import local as local_module
from podsys.drivers.base import FEATURE_SANDBOX, DriverError, Phase, Resources, Workload
from podsys.drivers.local import LocalDriver
from podsys.drivers.local_environments import PLATFORM

DEADLINE_S = 30.0
TENANT_UID = 1_000_000_051
TRAIN = """\
import json, os, pathlib, sys
print(json.dumps({"prefix": sys.prefix, "cwd": os.getcwd(), "uid": os.getuid(),
                  "data": pathlib.Path("data/words.txt").read_text(),
                  "virtual_env": os.environ.get("VIRTUAL_ENV", "")}))
"""


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A second environment: a venv without pip (and so without torch)."""
    folder = tmp_path_factory.mktemp("envs") / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   timeout=120)
    folder.chmod(0o755)
    return folder


@pytest.fixture
def make_driver(tmp_path: Path) -> Iterator[Callable[..., LocalDriver]]:
    made: list[LocalDriver] = []
    root = tmp_path / "cluster"

    def make(**options) -> LocalDriver:
        driver = LocalDriver(cluster="here", options={"root": str(root), "grace_s": 1,
                                                       **options})
        made.append(driver)
        return driver

    yield make
    for folder in (root / "workloads").glob("*"):
        made[0].cancel(folder.name)


def archive(tmp_path: Path, files: dict[str, str]) -> Path:
    """A working-folder archive as the client makes one, named by nothing in particular."""
    path = tmp_path / f"{'a' * 64}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def finish(driver: LocalDriver, handle: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        status = driver.status([handle])[handle]
        if status.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return status
        time.sleep(0.05)
    raise AssertionError(f"{handle} did not finish: {driver.logs(handle)}")


def ran(driver: LocalDriver, handle: str) -> dict:
    status = finish(driver, handle)
    log = driver.logs(handle)
    assert status.phase == Phase.SUCCEEDED, log
    return json.loads(log.strip().splitlines()[-1])


def train_job(id: str, tmp_path: Path, **fields) -> Workload:
    fields.setdefault("resources", Resources())
    shipped = archive(tmp_path, {"train.py": TRAIN, "data/words.txt": "hello"})
    return Workload(id=id, command=("python", "train.py"), workdir_archive=str(shipped),
                    **fields)


def test_the_platforms_own_environment_is_found_with_its_python_and_torch(make_driver):
    [platform] = make_driver().environments()
    assert (platform.name, platform.where, platform.default) == (PLATFORM, sys.prefix, True)
    assert platform.python == ".".join(map(str, sys.version_info[:3]))
    assert platform.python.startswith("3.11.")
    assert platform.torch.startswith("2.13.0"), platform
    assert platform.problem == ""


def test_a_registered_venv_is_listed_with_its_python_and_no_torch(make_driver, bare_venv,
                                                                 tmp_path):
    missing = tmp_path / "gone"
    driver = make_driver(environments={"bare": str(bare_venv), "old": str(missing)},
                         default_environment="bare")
    found = {env.name: env for env in driver.environments()}
    assert next(env.name for env in driver.environments()) == "bare"  # the default first
    assert found["bare"].default and not found[PLATFORM].default
    assert found["bare"].python == found[PLATFORM].python  # made by this interpreter
    assert found["bare"].torch == ""
    assert (found["old"].python, found["old"].problem) == ("", f"{missing} is not a folder "
                                                               "on this machine")


@pytest.mark.parametrize(("options", "message"), [
    ({"environments": ["/opt/env"]}, "must map names"),
    ({"environments": {"torch": "relative/env"}}, "must be an absolute folder"),
    ({"environments": {"platform": "/opt/env"}}, "the platform's own environment"),
    ({"environments": {"bad name": "/opt/env"}}, "is not a name"),
    ({"default_environment": "cu12"}, "'default_environment' 'cu12' is none of"),
])
def test_bad_environment_options_are_refused_by_name(make_driver, options, message):
    with pytest.raises(DriverError, match=message):
        make_driver(**options)


def test_python_train_py_runs_the_shipped_file_in_the_named_environment(make_driver, bare_venv,
                                                                         tmp_path):
    driver = make_driver(environments={"bare": str(bare_venv)})
    found = ran(driver, driver.launch(train_job("train-1", tmp_path, environment="bare")))
    assert found["prefix"] == str(bare_venv)  # the environment's python ran it
    assert found["virtual_env"] == str(bare_venv)
    assert found["data"] == "hello"
    assert found["cwd"] == str(driver.run_dir("train-1"))
    # The default is the platform's own environment, which holds torch.
    default = ran(driver, driver.launch(train_job("train-2", tmp_path)))
    assert default["prefix"] == sys.prefix


def test_each_attempt_unpacks_the_archive_into_a_fresh_run_folder(make_driver, tmp_path):
    driver = make_driver()
    first = train_job("job-7-a1", tmp_path)
    ran(driver, driver.launch(first))
    (driver.run_dir("job-7-a1") / "data" / "words.txt").write_text("changed by attempt 1")
    retry = ran(driver, driver.launch(dataclasses.replace(first, id="job-7-a2")))
    assert retry["data"] == "hello"


def test_an_unknown_environment_a_broken_one_and_a_missing_archive_are_refused(make_driver,
                                                                               tmp_path):
    driver = make_driver(environments={"old": str(tmp_path / "gone")})
    with pytest.raises(DriverError, match=r"offers no environment 'cu12'; it offers platform "
                       r"\(Python 3\.11\.\d+, torch 2\.13\.0.*\), old \(unusable: "):
        driver.launch(train_job("refused-1", tmp_path, environment="cu12"))
    with pytest.raises(DriverError, match="environment 'old' of cluster here cannot run jobs"):
        driver.launch(train_job("refused-2", tmp_path, environment="old"))
    lost = tmp_path / f"{'b' * 64}.tar.gz"
    with pytest.raises(DriverError, match=f"its working folder's archive {lost} is missing"):
        driver.launch(Workload(id="refused-3", command=("python", "train.py"),
                               resources=Resources(), workdir_archive=str(lost)))
    assert not list((driver.root / "workloads").glob("*/workload.json"))


def test_a_tenants_job_runs_the_shipped_file_in_its_sandbox_as_its_user(make_driver, bare_venv,
                                                                        tmp_path):
    driver = make_driver(environments={"bare": str(bare_venv)})
    assert driver.supports(FEATURE_SANDBOX), driver.sandbox_refusal
    job = train_job("boxed-1", tmp_path, environment="bare", tenant="beta", run_as=TENANT_UID)
    found = ran(driver, driver.launch(job))
    assert found["uid"] == TENANT_UID
    assert found["prefix"] == str(bare_venv)
    assert found["data"] == "hello"
    shipped = driver.run_dir("boxed-1") / "train.py"
    assert shipped.stat().st_uid == TENANT_UID  # the tenant's own files, to change
    # The environment is shown read-only: the job cannot change it for the next one, even a
    # file that everyone may write.
    writable = bare_venv / "anyone-may-write.txt"
    writable.write_text("")
    writable.chmod(0o666)
    tamper = train_job("boxed-2", tmp_path, environment="bare", tenant="beta",
                       run_as=TENANT_UID)
    tamper = dataclasses.replace(tamper, command=(
        "python", "-c", f"open({str(writable)!r}, 'a').write('x')"))
    assert finish(driver, driver.launch(tamper)).phase == Phase.FAILED
    assert "Read-only file system" in driver.logs("boxed-2")
    assert writable.read_text() == ""


def test_render_shows_the_environment_and_the_sandbox_and_starts_nothing(make_driver, bare_venv,
                                                                         tmp_path, monkeypatch):
    driver = make_driver(environments={"bare": str(bare_venv)})
    driver.environments()  # found once; rendering then runs no program at all

    def refuse(*args, **kwargs):
        raise AssertionError("render started a process")

    monkeypatch.setattr(local_module.subprocess, "Popen", refuse)
    monkeypatch.setattr(local_module.local_environments.subprocess, "run", refuse)
    job = train_job("job-3-a1", tmp_path, environment="bare", tenant="beta", run_as=TENANT_UID,
                    env={"LR": "3e-4"}, secret_env={"OGAI_TOKEN": "tok-very-secret"})
    text = driver.render(job)
    shown = yaml.safe_load(text)
    assert shown["environment"] == {"name": "bare", "prefix": str(bare_venv),
                                    "python": ".".join(map(str, sys.version_info[:3])),
                                    "torch": "not installed"}
    assert shown["command"] == ["python", "train.py"]
    assert shown["working_folder"]["sha256"] == "a" * 64
    assert shown["env"]["LR"] == "3e-4" and shown["env"]["VIRTUAL_ENV"] == str(bare_venv)
    assert shown["env"]["PATH"].startswith(f"{bare_venv}/bin:")
    assert "tok-very-secret" not in text and "OGAI_TOKEN" in text
    assert shown["sandbox"]["uid"] == TENANT_UID
    assert str(bare_venv) in shown["sandbox"]["read_only"]
    assert shown["sandbox"]["read_write"] == [shown["run_folder"]]
    assert not (driver.root / "workloads" / "job-3-a1").exists()
    assert driver.status(["job-3-a1"])["job-3-a1"].phase == Phase.MISSING
    with pytest.raises(DriverError, match="offers no environment 'cu12'"):
        driver.render(train_job("job-3-a2", tmp_path, environment="cu12"))


def test_the_probe_is_cached_until_the_environment_changes(make_driver, bare_venv, monkeypatch):
    driver = make_driver(environments={"bare": str(bare_venv)})
    driver.environments()
    calls = []
    real = local_module.local_environments._run_probe
    monkeypatch.setattr(local_module.local_environments, "_run_probe",
                        lambda python: calls.append(python) or real(python))
    driver.environments()
    assert calls == []
    (bare_venv / "bin" / "new-tool").write_text("")  # as installing a package would
    try:
        driver.environments()
    finally:
        (bare_venv / "bin" / "new-tool").unlink()
    assert calls == [bare_venv / "bin" / "python"]

