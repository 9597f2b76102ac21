"""The launcher every rank of a Slurm job starts, run as an unprivileged account with the
system's own Python (it is standard library only): a workload's folders of the data directory
at their own paths under bubblewrap, nothing else of it, and no trace left on the node."""

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from podsys.drivers import slurm_launcher

ACCOUNT = 65534  # nobody
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def scratch():
    """A folder every account may pass, holding a copy of the launcher."""
    folder = Path(tempfile.mkdtemp(prefix="ogai-launcher-"))
    folder.chmod(0o755)
    shutil.copy(slurm_launcher.__file__, folder / "slurm_launcher.py")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _account_folder(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, ACCOUNT, ACCOUNT)
    path.chmod(mode)
    return path


def _rank(scratch: Path, script: str, *, data_dir: Path, binds: list[dict],
          path: str = "/usr/bin:/bin") -> tuple[int, str, str]:
    """Run one rank as the account: its exit code (recorded beside its log), stdout, stderr."""
    folder = _account_folder(scratch / "workload")
    launch = {"command": ["/bin/sh", "-c", script], "cwd": str(folder),
              "env": {"PATH": "/usr/bin:/bin"}, "data_dir": str(data_dir), "binds": binds}
    (folder / "launch.json").write_text(json.dumps(launch))
    os.chown(folder / "launch.json", ACCOUNT, ACCOUNT)
    done = subprocess.run(
        ["/usr/bin/setpriv", f"--reuid={ACCOUNT}", f"--regid={ACCOUNT}", "--clear-groups",
         SYSTEM_PYTHON, str(scratch / "slurm_launcher.py"), str(folder)],
        capture_output=True, text=True, timeout=60, env={"PATH": path})
    recorded = int((folder / "replica-0.exit").read_text())
    assert recorded == done.returncode
    return recorded, done.stdout, done.stderr


def test_a_rank_sees_its_folders_at_their_own_paths_and_nothing_else_of_the_data_directory(
        scratch):
    data = scratch / "data"
    data.mkdir(mode=0o700)
    (data / "secret.txt").write_text("another tenant's")
    dataset = data / "datasets" / "acme" / "v1"
    run = data / "ylink" / "runs" / "7"
    staged = scratch / "staged" / "v1"
    staged.mkdir(parents=True)
    (staged / "docs.jsonl").write_text('{"text": "hello"}\n')
    home = _account_folder(scratch / "homes" / "7")
    (home / "spec.json").write_text("{}")
    binds = [{"source": str(staged), "path": str(dataset), "read_only": True},
             {"source": str(home), "path": str(run), "read_only": False}]

    code, out, err = _rank(scratch, f"""
        cat {dataset}/docs.jsonl
        ls {run}
        echo trained > {run}/result.txt && echo wrote the run
        echo x > {dataset}/planted 2>/dev/null || echo dataset read-only
        ls -A {data}
        cat {data}/secret.txt 2>/dev/null || echo no secret
        id -u
    """, data_dir=data, binds=binds)

    assert code == 0, err
    lines = out.split()
    assert '{"text": "hello"}' in out and "spec.json" in lines
    assert "wrote the run" in out and "dataset read-only" in out and "no secret" in out
    assert (home / "result.txt").read_text() == "trained\n"  # where the platform reads it
    assert not (staged / "planted").exists()
    assert "secret.txt" not in lines and "datasets" in lines and "ylink" in lines
    assert lines[-1] == str(ACCOUNT)


@pytest.mark.parametrize("where", ["top", "nested", "unpassable"])
def test_the_data_directorys_path_need_not_exist_on_the_node_nor_be_passable(scratch, where):
    top = Path(f"/ogai-absent-{secrets.token_hex(4)}")
    data = {"top": top / "data", "nested": scratch / "absent" / "data",
            "unpassable": scratch / "private" / "deeper" / "data"}[where]
    if where == "unpassable":
        (scratch / "private").mkdir(mode=0o700)
    source = scratch / "model"
    source.mkdir()
    (source / "config.json").write_text('{"layers": 2}')

    code, out, err = _rank(scratch, f"cat {data}/models/m/config.json; ls /usr | head -1",
                           data_dir=data, binds=[{"source": str(source),
                                                  "path": str(data / "models" / "m"),
                                                  "read_only": True}])

    assert code == 0, err
    assert '{"layers": 2}' in out and "bin" in out  # the node's own files are still there
    assert not top.exists() and not (scratch / "absent").exists()
    assert not (scratch / "private" / "deeper").exists()


def test_a_node_without_bubblewrap_fails_the_rank_in_one_line(scratch):
    data = scratch / "data"
    source = scratch / "model"
    source.mkdir()
    code, _out, err = _rank(scratch, "true", data_dir=data, path=str(scratch),
                            binds=[{"source": str(source), "path": str(data / "m"),
                                    "read_only": True}])
    assert code == 127
    assert err.strip().splitlines() == [
        "could not start the rank on " + os.uname().nodename + ": this workload reads folders "
        "of the platform's data directory, which needs bubblewrap (bwrap) on every node; "
        "install it"]


def test_a_workload_without_data_folders_runs_its_command_as_is():
    launch = {"command": ["python", "-c", "print(1)"], "cwd": "/srv/run", "data_dir": "/srv/data",
              "binds": []}
    assert slurm_launcher.sandboxed(launch) == ["python", "-c", "print(1)"]
