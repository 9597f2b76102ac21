"""Slurm's own command-line interfaces, with their JSON output (22.05: `sinfo`, `squeue` and
`sacct` take `--json`; `sbatch --parsable` prints the job id alone). Nothing here parses a
table meant for people; `scontrol` is only used for updates, whose output is not read."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from podsys.drivers.base import DriverError

TIMEOUT_S = 60.0
_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # the base state, lower-case: idle, mixed, allocated, down, …
    flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, …
    cpus: int
    memory_mib: int
    gpus: int
    gpu_type: str
    gpus_used: int
    address: str
    reason: str


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    user_id: int
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, TIMEOUT, …
    nodes: str
    exit_code: int | None
    reason: str
    # GPUs it holds on each node of its allocation, in `nodes` order (squeue's gres_detail).
    gpus_per_node: tuple[int, ...] = ()
    comment: str = ""


def gres_gpus(text: str) -> tuple[int, str]:
    """('gpu:h100:2(S:0-1),gpu:a100:1' ->) the GPUs a GRES string counts and the first type."""
    count, first_type = 0, ""
    for item in (text or "").split(","):
        match = _GRES.match(item.strip())
        if match:
            count += int(match["count"])
            first_type = first_type or (match["type"] or "")
    return count, first_type


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list ('n[1-3,7],gpu01') as names, without asking the controller."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text or ""):
        match = re.fullmatch(r"(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]*)\](?P<suffix>.*)", part)
        if not match:
            names.append(part)
            continue
        for item in match["ranges"].split(","):
            low, _, high = item.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{match['prefix']}{number:0{width}d}{match['suffix']}")
    return names


class SlurmCli:
    """Runs Slurm's clients with the cluster's `slurm.conf` (`SLURM_CONF`) and `bin_dir`."""

    def __init__(self, *, slurm_conf: str = "", bin_dir: str = "") -> None:
        self.env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self.bin_dir = bin_dir

    def run(self, program: str, *args: str, check: bool = True,
            timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        path = os.path.join(self.bin_dir, program) if self.bin_dir else program
        try:
            result = subprocess.run(  # noqa: S603 - an argument list, never a shell
                [path, *args], env=self.env, capture_output=True,
                                    text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise DriverError(f"Slurm's {program} is not installed here (looked for {path})")\
                from None
        except subprocess.TimeoutExpired:
            raise DriverError(f"Slurm's {program} did not answer in {timeout:.0f} s") from None
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise DriverError(f"{program} failed: {message[-1] if message else result.returncode}")
        return result

    def json(self, program: str, *args: str) -> dict[str, Any]:
        result = self.run(program, "--json", *args)
        try:
            data = json.loads(result.stdout)
        except ValueError:
            raise DriverError(f"{program} --json printed no JSON") from None
        errors = [e.get("error") or str(e) for e in data.get("errors") or []
                  if isinstance(e, dict)]
        if errors:
            raise DriverError(f"{program}: {'; '.join(errors)}")
        return data

    # Reads ----------------------------------------------------------------------------------

    def version(self) -> str:
        meta = self.json("sinfo").get("meta", {})
        return str(meta.get("Slurm", {}).get("release", ""))

    def nodes(self, partition: str = "") -> list[SlurmNode]:
        data = self.json("sinfo", *(["--partition", partition] if partition else []))
        found = []
        for node in data.get("nodes", []):
            gpus, gpu_type = gres_gpus(node.get("gres", ""))
            used, _ = gres_gpus(node.get("gres_used", ""))
            found.append(SlurmNode(
                name=node["name"], state=str(node.get("state", "")).lower(),
                flags=tuple(str(f).upper() for f in node.get("state_flags") or []),
                cpus=int(node.get("cpus") or 0), memory_mib=int(node.get("real_memory") or 0),
                gpus=gpus, gpu_type=gpu_type, gpus_used=used,
                address=str(node.get("address") or ""), reason=str(node.get("reason") or ""),
            ))
        return found

    def partitions(self) -> list[str]:
        return sorted({p for node in self.json("sinfo").get("nodes", [])
                       for p in node.get("partitions") or []})

    def jobs(self, names: list[str] | None = None) -> list[SlurmJob]:
        """Jobs the controller still holds (finished ones for `MinJobAge`), all users', or
        those named `names`. 22.05's `squeue --json` ignores every filter and answers with
        all jobs in all states, so the names are picked here."""
        if names is not None and not names:
            return []
        wanted = set(names) if names is not None else None
        found = []
        for job in self.json("squeue").get("jobs", []):
            if wanted is not None and job.get("name") not in wanted:
                continue
            exit_code = job.get("exit_code")
            found.append(SlurmJob(
                job_id=int(job["job_id"]), name=str(job.get("name", "")),
                user_id=int(job.get("user_id", -1)), state=str(job.get("job_state", "")),
                nodes=str(job.get("nodes") or ""),
                exit_code=int(exit_code) if isinstance(exit_code, int) else None,
                reason=str(job.get("state_reason") or ""),
                gpus_per_node=tuple(gres_gpus(detail)[0]
                                    for detail in job.get("gres_detail") or []),
                comment=str(job.get("comment") or ""),
            ))
        return found

    def accounting(self) -> bool:
        result = self.run("sacct", "--json", "-n", "-j", "1", check=False)
        return result.returncode == 0

    def accounted(self, job_ids: list[int]) -> list[dict[str, Any]]:
        """`sacct`'s records of these jobs (state, elapsed, allocated TRES, exit code)."""
        if not job_ids:
            return []
        data = self.json("sacct", "--jobs", ",".join(map(str, job_ids)),
                         "--starttime", "1970-01-01T00:00:00")
        return list(data.get("jobs", []))

    # Writes ---------------------------------------------------------------------------------

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        return self.run("scontrol", "show", "hostnames", nodelist).stdout.split()
