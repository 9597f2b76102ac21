"""What `srun` starts for each rank of a workload on a Slurm cluster, as the tenant's account.

`python -m podsys.drivers.slurm_launcher FOLDER`: reads the workload's `launch.json` (its
command, working folder and environment: a 0600 file of the tenant's, never a command line
others can read), sets the variables `torch.distributed` reads from Slurm's own (`RANK` from
`SLURM_PROCID`, `WORLD_SIZE` from `SLURM_NTASKS`, `MASTER_ADDR` the allocation's first node,
where the batch script and so `srun` run), runs the command, passes SIGTERM on (a cancel's
grace period, for checkpoints) and records the rank's node and exit code beside its log.
Standard library only: it runs on every node before anything else is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    try:
        child = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
            launch["command"], cwd=launch["cwd"], env=env, start_new_session=True)
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
