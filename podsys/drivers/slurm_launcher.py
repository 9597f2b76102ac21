"""What `srun` starts for each rank of a workload on a Slurm cluster, as the tenant's account.

`python -m podsys.drivers.slurm_launcher FOLDER`: reads the workload's `launch.json` (its
command, working folder and environment: a 0600 file of the tenant's, never a command line
others can read), sets the variables `torch.distributed` reads from Slurm's own (`RANK` from
`SLURM_PROCID`, `WORLD_SIZE` from `SLURM_NTASKS`, `MASTER_ADDR` the allocation's first node,
where the batch script and so `srun` run), runs the command, passes SIGTERM on (a cancel's
grace period, for checkpoints) and records the rank's node and exit code beside its log.
A service gets a free port of its node, put into its command where it carries the workload's
port argument and recorded beside its log, where the platform reads it to reach the service
at the node's address.
A workload that reads or writes folders of the platform's data directory runs under
bubblewrap (`bwrap`, unprivileged, as the account): the node's file system as the account sees
it, with the data directory replaced by a folder of the job's own into which each folder's
home on the shared path is bound at the folder's own path (read-only where it only reads).
Standard library only: it runs on every node before anything else is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

LAUNCH_FILE = "launch.json"
# A port per job from its id, the same on every rank without talking to each other.
MASTER_PORT_BASE = 15000
MASTER_PORT_SPAN = 20000


def rank_env(base: dict[str, str], slurm: dict[str, str]) -> dict[str, str]:
    """The rank's environment: the workload's own, then what distributed training reads."""
    job_id = int(slurm.get("SLURM_JOB_ID", "0"))
    return {
        **base,
        "RANK": slurm.get("SLURM_PROCID", "0"),
        "WORLD_SIZE": slurm.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": slurm.get("SLURM_LOCALID", "0"),
        "NODE_RANK": slurm.get("SLURM_NODEID", "0"),
        "GROUP_RANK": slurm.get("SLURM_NODEID", "0"),
        "MASTER_ADDR": slurm.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1",
        "MASTER_PORT": str(MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN),
        "PYTHONUNBUFFERED": "1",
        **({"CUDA_VISIBLE_DEVICES": slurm["CUDA_VISIBLE_DEVICES"]}
           if "CUDA_VISIBLE_DEVICES" in slurm else {}),
        **{name: value for name, value in slurm.items()
           if name.startswith("SLURM_") or name == "SLURMD_NODENAME"},
    }


class LaunchError(Exception):
    """The rank cannot be started as its workload asks; the message is for people."""


def data_dir_args(data_dir: Path) -> list[str]:
    """bwrap arguments for the node's file system as the account sees it, with an empty
    folder of the job's own at `data_dir`. A folder on the way the account may not pass is
    covered whole (it could see nothing in it anyway); where the data directory's path does
    not exist on the node, the deepest folder of it that does is rebuilt entry by entry."""
    current = Path("/")
    for part in data_dir.parts[1:]:
        below = current / part
        if not os.path.lexists(below):
            return _graft(current)
        if below == data_dir or not os.access(below, os.X_OK):
            return ["--dev-bind", "/", "/", "--tmpfs", str(below)]
        current = below
    raise LaunchError(f"the data directory {data_dir} is not a folder path")


def _graft(folder: Path) -> list[str]:
    """`folder` as a folder of the job's own holding the node's entries of it."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise LaunchError(f"cannot list {folder} to make the data directory below it: "
                          f"{exc.strerror}") from exc
    args = [] if folder == Path("/") else ["--dev-bind", "/", "/", "--tmpfs", str(folder)]
    for name in names:
        path = folder / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        else:
            args += ["--dev-bind-try", str(path), str(path)]
    return args


def sandboxed(launch: dict) -> list[str]:
    """The rank's command line: bubblewrap around the command when the workload binds folders
    of the data directory, the command itself otherwise."""
    binds = launch.get("binds") or []
    if not binds:
        return list(launch["command"])
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise LaunchError("this workload reads folders of the platform's data directory, "
                          "which needs bubblewrap (bwrap) on every node; install it")
    args = [bwrap, "--die-with-parent", *data_dir_args(Path(launch["data_dir"]))]
    for bind in sorted(binds, key=lambda bind: len(Path(bind["path"]).parts)):
        args += ["--ro-bind" if bind["read_only"] else "--bind", bind["source"], bind["path"]]
    return [*args, "--chdir", launch["cwd"], "--", *launch["command"]]


def free_port() -> int:
    """A port of this node no one listens on now, on every address (the platform reaches
    services from its own host)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def with_port(launch: dict, env: dict[str, str], port: int) -> tuple[dict, dict[str, str]]:
    """The launch with `port` in its command where it carries the port argument, and the
    environment with it under the port's variable name."""
    arg = launch["service_port"]["arg"]
    command = [part.replace(arg, str(port)) for part in launch["command"]]
    return {**launch, "command": command}, {**env, launch["service_port"]["env"]: str(port)}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(folder: Path) -> int:
    launch = json.loads((folder / LAUNCH_FILE).read_text())
    rank = os.environ.get("SLURM_PROCID", "0")
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    env = rank_env(launch["env"], dict(os.environ))
    _write(folder / f"replica-{rank}.node", node)
    if launch.get("service_port"):
        port = free_port()
        launch, env = with_port(launch, env, port)
        _write(folder / f"replica-{rank}.port", str(port))
    try:
        child = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
            sandboxed(launch), cwd=launch["cwd"], env=env, start_new_session=True)
    except LaunchError as exc:
        print(f"could not start the rank on {node}: {exc}", file=sys.stderr, flush=True)
        _write(folder / f"replica-{rank}.exit", "127")
        return 127
    except OSError as exc:
        print(f"could not start {launch['command'][0]!r}: {exc}", file=sys.stderr, flush=True)
        _write(folder / f"replica-{rank}.exit", "127")
        return 127

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    code = child.wait()
    _write(folder / f"replica-{rank}.exit", str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
