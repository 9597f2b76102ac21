"""The `slurm` driver: a gang is one Slurm batch job, run as the tenant's cluster account.

It talks to Slurm through its own clients (`sbatch`, `squeue --json`, `sinfo --json`,
`sacct --json`, `scancel`, `scontrol update`) with the cluster's `slurm.conf`, from a host
that is a Slurm client submitting as root (or Slurm's own user): `sbatch --uid/--gid` makes
the job the tenant's, and on Slurm that account is the tenant boundary.

Each workload has a folder on the path the cluster shares (`shared_dir`): the tenant's, mode
0700, holding `launch.json` (command, working folder, environment: never on a command line),
a log and an exit code per rank (`replica-<i>.log`, `.exit`, `.node`, written by
`slurm_launcher`, which `srun` starts once per rank). What the platform alone may change (the
Slurm job id, whose it is) is kept apart in `state/<id>.json`, root's, mode 0600, so a tenant
can neither point a cancel at another's job nor forge whose job it is.

The Slurm job name is the workload id: launch is idempotent, and a job with that name that
the platform did not submit (a user's own `sbatch`) is never taken for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import secrets
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from podsys.drivers.base import (
    CORDONED_BY_PLATFORM,
    FEATURE_IMAGES,
    FEATURE_RAY,
    SERVICE_PORT_ARG,
    SERVICE_PORT_ENV,
    ClusterDriver,
    ConnectionReport,
    DriverError,
    LogChunk,
    NodeInfo,
    Phase,
    ReplicaStatus,
    Workload,
    WorkloadStatus,
    WorkloadUsage,
)
from podsys.drivers.common import (
    check_workload_id,
    check_workload_shape,
    finished_replica,
    is_valid_workload_id,
    missing,
    summarize,
)
from podsys.drivers.local import (
    _platform_pythonpath,
    read_json,
    read_log_file,
    read_tail,
    write_json,
)
from podsys.drivers.slurm_cli import SlurmCli, SlurmJob, SlurmNode, expand_hostlist
from podsys.drivers.slurm_data import (
    DATA_FOLDER,
    data_binds,
    data_relative,
    passable_parents,
    staged_prune,
)
from podsys.drivers.slurm_launcher import LAUNCH_FILE

LAUNCHER = "podsys.drivers.slurm_launcher"
# Begins the comment of every job the platform submits; its submission's token follows.
COMMENT_PREFIX = "ogai:"
# Begins the reason of a drain the platform set, so it is told from an administrator's.
DRAIN_PREFIX = "ogai: "
# Slurm's states, as the platform's phases.
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
                            "SUSPENDED", "STOPPED", "SIGNALING", "REQUEUE_FED"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT"})
FAILED_REASONS = {
    "FAILED": "",
    "CANCELLED": "cancelled in Slurm",
    "TIMEOUT": "Slurm ended it at its time limit",
    "OUT_OF_MEMORY": "out of memory",
    "NODE_FAIL": "a node of its allocation failed",
    "BOOT_FAIL": "a node of its allocation failed to boot",
    "DEADLINE": "Slurm ended it at its deadline",
    "PREEMPTED": "preempted in Slurm",
    "REVOKED": "revoked by Slurm",
}
# How often, and how far apart, `usage` asks sacct for a job's end before it gives up.
ACCOUNTING_TRIES = 5
ACCOUNTING_WAIT_S = 0.4
# How long a staged copy no job binds is kept for the next job that reads the same folder.
STAGED_RETENTION_S = 24 * 3600
# Node states and flags that take a node out of service.
DOWN_STATES = frozenset({"down", "unknown", "future", "error"})
UNSCHEDULABLE_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING",
                                 "MAINTENANCE", "REBOOT_REQUESTED", "POWERED_DOWN",
                                 "POWER_DOWN", "NOT_RESPONDING", "RESERVED"})
# Read from the environment a job inherits where the platform runs it (PATH and the like).
BASE_ENV_NAMES = ("PATH", "LANG", "TZ", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                  "TRANSFORMERS_OFFLINE")


class SlurmDriver(ClusterDriver):
    """Options: `slurm_conf` (the cluster's slurm.conf on this host; default Slurm's own),
    `bin_dir` (where its clients are; default on PATH), `shared_dir` (a folder every node sees
    at the same path; default DATA_DIR/clusters/<cluster>, which must then be shared),
    `partition`, `python` (the Python on the nodes that runs the launcher and the platform's
    runners; default this one), `grace_s` (between a cancel's SIGTERM and its kill, default
    30), `account` (the Slurm account jobs are charged to, where associations are enforced)."""

    unsupported = {
        FEATURE_IMAGES: "the slurm driver runs commands in the nodes' own environment",
        FEATURE_RAY: "the slurm driver does not start Ray clusters yet (run `ray start` in "
        "an sbatch script of your own)",
    }
    assigns_ports = True

    OPTIONS = frozenset({"slurm_conf", "bin_dir", "shared_dir", "partition", "python",
                         "grace_s", "account"})

    @classmethod
    def check_options(cls, options: dict) -> None:
        """ValueError, in words for the operator, for options this driver cannot use."""
        unknown = sorted(set(options) - cls.OPTIONS)
        if unknown:
            raise ValueError(f"Unknown slurm option {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(cls.OPTIONS))}.")
        for name in ("slurm_conf", "bin_dir", "shared_dir", "python"):
            value = options.get(name, "")
            if not isinstance(value, str) or (value and not os.path.isabs(value)):
                raise ValueError(f"{name} must be an absolute path.")
        if options.get("slurm_conf") and not os.path.isfile(options["slurm_conf"]):
            raise ValueError(f"slurm_conf {options['slurm_conf']} is not a file here: the "
                             "platform runs Slurm's clients with it.")
        grace = options.get("grace_s", 30)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            raise ValueError("grace_s must be a number of seconds, 0 or more.")

    def __init__(self, *, cluster: str, options: dict | None = None) -> None:
        super().__init__(cluster=cluster, options=options)
        self.cli = SlurmCli(slurm_conf=str(self.options.get("slurm_conf") or ""),
                            bin_dir=str(self.options.get("bin_dir") or ""))
        default_root = Path(settings.DATA_DIR) / "clusters" / cluster
        self.root = Path(self.options.get("shared_dir") or default_root)
        self.partition = str(self.options.get("partition") or "")
        self.python = str(self.options.get("python") or sys.executable)
        self.grace_s = float(self.options.get("grace_s", 30))
        self.account = str(self.options.get("account") or "")

    # Paths and state ------------------------------------------------------------------------

    def _folder(self, handle: str) -> Path:
        check_workload_id(handle)
        return self.root / "workloads" / handle

    def _state_path(self, handle: str) -> Path:
        return self.root / "state" / f"{handle}.json"

    def _load(self, handle: str) -> dict[str, Any] | None:
        if not is_valid_workload_id(handle):
            return None
        state = read_json(self._state_path(handle))
        # A submission not recorded yet is not a workload until the next launch adopts it.
        return state if isinstance(state, dict) and "job_id" in state else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One launch at a time from this root: the check that a workload was not submitted
        yet and its submission must not interleave."""
        state_dir = self.root / "state"
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (state_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # Nodes ----------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        foreign = self._foreign_gpus()
        return [dataclasses.replace(self._node_info(node), gpus_foreign=foreign.get(node.name, 0))
                for node in self.cli.nodes(self.partition)]

    def _foreign_gpus(self) -> Counter[str]:
        """GPUs per node held by running jobs the platform did not submit."""
        ours = set()
        for path in (self.root / "state").glob("*.json"):
            state = read_json(path)
            if isinstance(state, dict) and "job_id" in state:
                ours.add(int(state["job_id"]))
        held: Counter[str] = Counter()
        for job in self.cli.jobs():
            if job.job_id in ours or job.state not in RUNNING_STATES:
                continue
            for name, gpus in zip(expand_hostlist(job.nodes), job.gpus_per_node, strict=False):
                held[name] += gpus
        return held

    @staticmethod
    def _node_info(node: SlurmNode) -> NodeInfo:
        ready = node.state not in DOWN_STATES and "NOT_RESPONDING" not in node.flags
        schedulable = ready and not UNSCHEDULABLE_FLAGS.intersection(node.flags) \
            and node.state != "drained"
        state = node.state + "".join(f"+{flag.lower()}" for flag in node.flags)
        labels = {"slurm.state": state}
        reason = node.reason if node.reason else ("" if schedulable else f"Slurm: {state}")
        if node.reason.startswith(DRAIN_PREFIX):
            labels[CORDONED_BY_PLATFORM] = "true"
            reason = node.reason.removeprefix(DRAIN_PREFIX)
        return NodeInfo(
            name=node.name, gpus=node.gpus, gpu_model=node.gpu_type, cpu_cores=float(node.cpus),
            memory_mib=node.memory_mib, ready=ready, schedulable=schedulable, reason=reason,
            gpus_allocated=node.gpus_used, address=node.address, labels=labels,
        )

    def set_schedulable(self, node: str, schedulable: bool, reason: str = "") -> None:
        """Drain the node in Slurm (running jobs finish, nothing new starts) or resume it."""
        if schedulable:
            self.cli.run("scontrol", "update", f"nodename={node}", "state=resume")
        else:
            text = " ".join((reason or "cordoned").split())
            self.cli.run("scontrol", "update", f"nodename={node}", "state=drain",
                         f"reason={DRAIN_PREFIX}{text}")

    def check_connection(self) -> ConnectionReport:
        try:
            version = self.cli.version()
            nodes = self.cli.nodes(self.partition)
            partitions = self.cli.partitions()
            accounting = self.cli.accounting()
        except DriverError as exc:
            return ConnectionReport(ok=False, message=f"Cannot reach Slurm: {exc}")
        gpus = sum(node.gpus for node in nodes)
        message = (f"Slurm {version}: {len(nodes)} nodes, {gpus} GPUs, partitions "
                   f"{', '.join(partitions) or 'none'}; accounting "
                   f"{'on' if accounting else 'off (no usage from sacct)'}.")
        return ConnectionReport(ok=True, message=message, details={
            "version": version, "nodes": len(nodes), "gpus": gpus, "partitions": partitions,
            "accounting": accounting})

    # Launch ---------------------------------------------------------------------------------

    def _on_shared_path(self, workload: Workload) -> Workload:
        """The workload with its run and checkpoint folders moved from the platform's data
        directory, which is the platform's alone (mode 0700), to the same place under the
        shared path, where the tenant's account reaches its own folders (0700). The mapping
        is fixed, so every attempt of a job finds the checkpoints of the one before. (Its
        other folders of the data directory keep their paths: `slurm_data`.)"""
        data = Path(settings.DATA_DIR)
        moved: dict[str, str] = {}

        def move(path: str) -> str:
            relative = data_relative(path, data) if path else None
            if relative is None:
                return path
            moved[path] = str(self.root / DATA_FOLDER / relative)
            return moved[path]

        run_dir, checkpoint_dir = move(workload.run_dir), move(workload.checkpoint_dir)
        env = {name: moved.get(value, value) for name, value in workload.env.items()}
        return dataclasses.replace(workload, run_dir=run_dir, checkpoint_dir=checkpoint_dir,
                                   env=env)

    def launch(self, workload: Workload) -> str:
        check_workload_id(workload.id)
        check_workload_shape(workload)
        workload = self._on_shared_path(workload)
        with self._locked():
            state = read_json(self._state_path(workload.id))
            if isinstance(state, dict) and "job_id" in state:
                return workload.id
            uid = self._account(workload)
            if isinstance(state, dict) and self._adopt(workload.id, state, uid):
                return workload.id
            try:
                binds = data_binds(workload.data_mounts, data_dir=Path(settings.DATA_DIR),
                                   root=self.root, uid=uid, workload_id=workload.id)
            except OSError as exc:
                raise DriverError(f"could not give workload {workload.id} its folders on "
                                  f"the shared path: {exc}") from exc
            folder = self._prepare(workload, uid, binds)
            if isinstance(state, dict):
                # What a submission never adopted left (a job no longer ours, or never run).
                for stale in (*folder.glob("replica-*"), folder / "batch.log"):
                    stale.unlink(missing_ok=True)
            script = self._batch_script(workload, folder)
            # Written before `sbatch`: had the platform stopped between the submission and
            # its record, the next launch finds the job by this token instead of submitting
            # it twice.
            token = secrets.token_hex(16)
            state = {"id": workload.id, "uid": uid, "replicas": workload.replicas,
                     "token": token, "script": script, "service": _asks_port(workload),
                     "binds": [bind["source"] for bind in binds]}
            write_json(self._state_path(workload.id), state)
            args = self._sbatch_args(workload, folder, uid, token)
            result = self.cli.run("sbatch", *args, check=False, timeout=120)
            if result.returncode != 0:
                self._state_path(workload.id).unlink(missing_ok=True)
                lines = (result.stderr or result.stdout).strip().splitlines()
                raise DriverError(f"Slurm refused workload {workload.id}: "
                                  f"{lines[-1] if lines else result.returncode}")
            self._record(workload.id, {**state, "job_id": int(result.stdout.strip()
                                                               .split(";")[0])})
        return workload.id

    def _record(self, handle: str, state: dict) -> None:
        write_json(self._state_path(handle), {**state, "submitted_at": time.time()})

    def _adopt(self, handle: str, state: dict, uid: int) -> bool:
        """A submission whose record was never written: the job named after the workload,
        run by its account and carrying its token (which only root's state knows), is it."""
        comment = f"{COMMENT_PREFIX}{state.get('token', '')}"
        for job in self.cli.jobs([handle]):
            if job.comment == comment and job.user_id == uid:
                self._record(handle, {**state, "job_id": job.job_id})
                return True
        return False

    def _account(self, workload: Workload) -> int:
        """The uid the job runs as: the tenant's cluster account; root only for the
        platform's own work (health checks)."""
        if not workload.tenant:
            return os.getuid()
        if workload.run_as is None or workload.run_as <= 0:
            raise DriverError(f"workload {workload.id} of tenant {workload.tenant} names no "
                              "cluster account to run as")
        return workload.run_as

    def _prepare(self, workload: Workload, uid: int, binds: list[dict]) -> Path:
        folder = self._folder(workload.id)
        cwd = Path(workload.run_dir) if workload.run_dir else folder / "run"
        try:
            for path in (folder, cwd, *([Path(workload.checkpoint_dir)]
                                        if workload.checkpoint_dir else [])):
                passable_parents(path)
                path.mkdir(exist_ok=True, mode=0o700)
                path.chmod(0o700)
                os.chown(path, uid, uid)
            if workload.workdir_archive:
                from podsys.drivers.workdir_unpack import workdir_unpack

                workdir_unpack(workload.workdir_archive, cwd)
                for place, dirs, files in os.walk(cwd):
                    for name in (*dirs, *files):
                        os.chown(os.path.join(place, name), uid, uid, follow_symlinks=False)
            env = {name: os.environ[name] for name in BASE_ENV_NAMES if name in os.environ}
            # `python` in a command is the platform's, as in its images on Kubernetes.
            env["PATH"] = os.pathsep.join((os.path.dirname(self.python),
                                           env.get("PATH", "/usr/bin:/bin")))
            pythonpath = _platform_pythonpath()
            env.update({"OGAI_WORKLOAD_ID": workload.id, "OGAI_RUN_DIR": str(cwd),
                        "PYTHONPATH": os.pathsep.join(
                            p for p in (str(cwd), pythonpath,
                                        workload.env.get("PYTHONPATH", "")) if p)})
            env.update({k: v for k, v in workload.env.items() if k != "PYTHONPATH"})
            env.update(workload.secret_env)
            launch = folder / LAUNCH_FILE
            fd = os.open(launch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump({"command": list(workload.command), "cwd": str(cwd), "env": env,
                           "data_dir": str(settings.DATA_DIR), "binds": binds,
                           "service_port": {"arg": SERVICE_PORT_ARG, "env": SERVICE_PORT_ENV}
                           if _asks_port(workload) else None}, handle)
            os.chown(launch, uid, uid)
        except OSError as exc:
            raise DriverError(f"could not prepare workload {workload.id}: {exc}") from exc
        for path in (folder, cwd, *([Path(workload.checkpoint_dir)]
                                    if workload.checkpoint_dir else []),
                     *(Path(bind["source"]) for bind in binds)):
            _check_reachable(path, uid, workload.id)
        return folder

    def _layout(self, workload: Workload) -> tuple[list[str], Counter[str]]:
        nodes = list(dict.fromkeys(workload.placement))
        return nodes, Counter(workload.placement)

    def _sbatch_args(self, workload: Workload, folder: Path, uid: int,
                     token: str = "") -> list[str]:
        res = workload.resources
        cpus = max(1, math.ceil(res.cpu_cores))
        args = ["--parsable", f"--job-name={workload.id}", f"--uid={uid}", f"--gid={uid}",
                f"--comment={COMMENT_PREFIX}{token}",
                f"--chdir={folder}", f"--output={folder}/batch.log", "--export=NONE",
                "--no-requeue", f"--ntasks={workload.replicas}", f"--cpus-per-task={cpus}"]
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.account:
            args.append(f"--account={self.account}")
        nodes, per_node = self._layout(workload)
        uniform = len(set(per_node.values())) <= 1
        if nodes:
            args += [f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}"]
        if not nodes or uniform:
            tasks = next(iter(per_node.values()), 1)
            if nodes:
                args.append(f"--ntasks-per-node={tasks}")
            if res.gpus:
                args.append(f"--gres=gpu:{res.gpus * tasks}")
            args.append(f"--mem={max(1, res.memory_mib) * tasks}M")
        else:
            # Unequal ranks per node: Slurm hands GPUs and memory per task instead.
            if res.gpus:
                args.append(f"--gpus-per-task={res.gpus}")
            args.append(f"--mem-per-cpu={math.ceil(max(1, res.memory_mib) / cpus)}M")
            args.append("--distribution=arbitrary")
        if workload.time_limit_s:
            args.append(f"--time={max(1, math.ceil(workload.time_limit_s / 60))}")
        args.append(str(folder / "batch.sh"))
        return args

    def _batch_script(self, workload: Workload, folder: Path) -> str:
        nodes, per_node = self._layout(workload)
        srun = ["srun", "--export=ALL", "--kill-on-bad-exit=1", "--unbuffered",
                f"--output={folder}/replica-%t.log"]
        if nodes and len(set(per_node.values())) > 1:
            srun.append(f"--nodelist={','.join(workload.placement)}")
        srun += [self.python, "-m", LAUNCHER, str(folder)]
        env_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        script = "\n".join([
            "#!/bin/bash",
            f"# OGAI workload {workload.id}",
            f"export PATH={shlex.quote(env_path)}",
            f"export PYTHONPATH={shlex.quote(_platform_pythonpath())}",
            # The batch shell passes a cancel's SIGTERM on to the ranks and waits for them.
            "trap 'kill -TERM $child 2>/dev/null' TERM",
            f"{shlex.join(srun)} &",
            "child=$!",
            "wait $child; code=$?",
            "while kill -0 $child 2>/dev/null; do wait $child; code=$?; done",
            "exit $code",
            "",
        ])
        path = folder / "batch.sh"
        path.write_text(script)
        path.chmod(0o755)
        return script

    # Status ---------------------------------------------------------------------------------

    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        states = {handle: self._load(handle) for handle in handles}
        known = {handle: state for handle, state in states.items() if state is not None}
        jobs = self._jobs(known)
        accounted = self._accounted([state["job_id"] for handle, state in known.items()
                                     if handle not in jobs])
        result = {}
        for handle in handles:
            state = known.get(handle)
            if state is None:
                result[handle] = missing(handle)
                continue
            job = jobs.get(handle)
            if job is None and state["job_id"] in accounted:
                job = accounted[state["job_id"]]
            result[handle] = self._status(handle, state, job)
        return result

    def _jobs(self, known: dict[str, dict]) -> dict[str, SlurmJob]:
        """The controller's job of each workload: by name, and only the one it submitted."""
        if not known:
            return {}
        found = {}
        for job in self.cli.jobs(sorted(known)):
            state = known.get(job.name)
            if state is not None and job.job_id == state["job_id"]:
                found[job.name] = job
        return found

    def _accounted(self, job_ids: list[int]) -> dict[int, SlurmJob]:
        """Jobs the controller has forgotten (past `MinJobAge`), from accounting if it is on."""
        if not job_ids:
            return {}
        try:
            records = self.cli.accounted(job_ids)
        except DriverError:
            return {}
        found = {}
        for record in records:
            exit_code = record.get("exit_code") or {}
            found[int(record["job_id"])] = SlurmJob(
                job_id=int(record["job_id"]), name=str(record.get("name", "")),
                user_id=-1, state=str((record.get("state") or {}).get("current", "")),
                nodes=str(record.get("nodes") or ""),
                exit_code=exit_code.get("return_code"), reason="")
        return found

    def _status(self, handle: str, state: dict, job: SlurmJob | None) -> WorkloadStatus:
        folder = self._folder(handle)
        cancelled = (self.root / "state" / f"{handle}.cancelled").exists()
        replicas: list[ReplicaStatus] = []
        failed_at: dict[int, float] = {}
        slurm_state = job.state if job is not None else ""
        finished = job is None or slurm_state not in PENDING_STATES | RUNNING_STATES
        lost = self._lost_node(job)
        for index in range(int(state["replicas"])):
            node = _read_text(folder / f"replica-{index}.node")
            exit_path = folder / f"replica-{index}.exit"
            code = _read_int(exit_path)
            if code is not None:
                reason = "cancelled" if cancelled and code != 0 else ""
                replicas.append(finished_replica(index, code, node=node, reason=reason))
                if code != 0:
                    failed_at[index] = exit_path.stat().st_mtime
            elif not finished:
                phase = Phase.RUNNING if slurm_state in RUNNING_STATES and node else \
                    Phase.PENDING
                reason = "" if phase == Phase.RUNNING else \
                    f"Slurm: {slurm_state.lower()} ({job.reason})" if job else ""
                replicas.append(ReplicaStatus(index=index, phase=phase, node=node,
                                              reason=reason))
            else:
                replicas.append(self._ended_replica(index, node, job, cancelled))
        return summarize(handle, replicas, failed_at=failed_at, node_lost=lost)

    def _ended_replica(self, index: int, node: str, job: SlurmJob | None,
                       cancelled: bool) -> ReplicaStatus:
        """A rank that left no exit code: what Slurm says of the whole job."""
        if job is None:
            return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, exit_code=None,
                                 reason="Slurm no longer knows the job and the rank left no "
                                 "exit code")
        if job.state == "COMPLETED":
            return finished_replica(index, 0, node=node)
        reason = "cancelled" if cancelled else FAILED_REASONS.get(job.state, "") or \
            f"Slurm: {job.state.lower()}"
        # squeue's exit code is Slurm's own encoding, not the rank's: the reason speaks.
        return ReplicaStatus(index=index, phase=Phase.FAILED, node=node, reason=reason)

    def _lost_node(self, job: SlurmJob | None) -> str:
        if job is None or job.state != "NODE_FAIL":
            return ""
        with contextlib.suppress(DriverError):
            down = {node.name for node in self.cli.nodes()
                    if node.state in DOWN_STATES or "NOT_RESPONDING" in node.flags}
            allocated = self.cli.hostnames(job.nodes)
            # The node that is down now; a single node's allocation names it even when the
            # node has come back already.
            lost = [name for name in allocated if name in down]
            if lost or len(allocated) == 1:
                return (lost or allocated)[0]
        return ""

    # Accounting -----------------------------------------------------------------------------

    def usage(self, handle: str) -> WorkloadUsage | None:
        """`sacct`'s record of the workload's job: its start and end and the GPUs and CPUs
        allocated (TRES), once slurmdbd has its end (it follows the job's end by moments)."""
        state = self._load(handle)
        if state is None:
            return None
        for attempt in range(ACCOUNTING_TRIES):
            try:
                records = self.cli.accounted([int(state["job_id"])])
            except DriverError:
                return None  # accounting off, or slurmdbd away: the platform's own times
            for record in records:
                usage = _usage_of(record)
                if usage is not None:
                    return usage
            if attempt + 1 < ACCOUNTING_TRIES:
                time.sleep(ACCOUNTING_WAIT_S)
        return None

    # Cancel and logs ------------------------------------------------------------------------

    def cancel(self, handle: str) -> None:
        """SIGTERM to every rank (a checkpoint's chance), then Slurm's kill after `grace_s`."""
        state = self._load(handle)
        if state is None:
            return
        marker = self.root / "state" / f"{handle}.cancelled"
        if not marker.exists():
            marker.write_text(f"{time.time()}\n")
        job_id = str(state["job_id"])
        if not self._active(handle, state):
            return
        self.cli.run("scancel", "--signal=TERM", job_id, check=False)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and self._active(handle, state):
            time.sleep(0.25)
        self.cli.run("scancel", job_id, check=False)

    def _active(self, handle: str, state: dict) -> bool:
        job = self._jobs({handle: state}).get(handle)
        return job is not None and job.state in PENDING_STATES | RUNNING_STATES

    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str:
        state = self._load(handle)
        if state is None:
            raise DriverError(f"no workload {handle!r} on cluster {self.cluster}")
        if not 0 <= replica < int(state["replicas"]):
            raise DriverError(f"workload {handle} has no replica {replica}")
        return read_tail(self._folder(handle) / f"replica-{replica}.log", tail)

    def read_log(self, handle: str, *, replica: int, offset: int,
                 final: bool = False) -> LogChunk:
        return read_log_file(self._folder(handle) / f"replica-{replica}.log", offset, final)

    def endpoint(self, handle: str) -> str | None:
        """The running service's first rank at its node's address (Slurm's NodeAddr) and the
        port the node gave it; None until it has one. The node is Slurm's word, not the
        job's: only the port comes from the job's folder, and only as a port number."""
        state = self._load(handle)
        if state is None or not state.get("service"):
            return None
        port = _read_int(self._folder(handle) / "replica-0.port")
        if port is None or not 1024 <= port <= 65535:
            return None
        job = self._jobs({handle: state}).get(handle)
        if job is None or job.state not in RUNNING_STATES or not job.nodes:
            return None
        first = expand_hostlist(job.nodes)[0]
        addresses = {node.name: node.address for node in self.cli.nodes(self.partition)}
        return f"http://{addresses.get(first) or first}:{port}"

    def cleanup(self, now: float | None = None) -> int:
        """Remove the staged copies of datasets and models that no pending or running job
        binds and that no launch used for `STAGED_RETENTION_S`; return how many."""
        now = time.time() if now is None else now
        with self._locked():
            states = [read_json(path) for path in (self.root / "state").glob("*.json")]
            ours = {int(state["job_id"]): state for state in states
                    if isinstance(state, dict) and "job_id" in state}
            live = {job.job_id for job in self.cli.jobs()
                    if job.state in PENDING_STATES | RUNNING_STATES}
            keep = {source for job_id, state in ours.items() if job_id in live
                    for source in state.get("binds", [])}
            # A submission never recorded (a launch cut short) keeps its copies too.
            keep |= {source for state in states if isinstance(state, dict)
                     and "job_id" not in state for source in state.get("binds", [])}
            return staged_prune(self.root, keep=keep, older_than=now - STAGED_RETENTION_S)

    def render(self, workload: Workload) -> str:
        check_workload_id(workload.id)
        check_workload_shape(workload)
        folder = self._folder(workload.id)
        args = self._sbatch_args(workload, folder, workload.run_as or os.getuid())
        return "sbatch " + shlex.join(args) + "\n"


def _asks_port(workload: Workload) -> bool:
    return workload.service and bool(workload.ports)


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _check_reachable(path: Path, uid: int, workload_id: str) -> None:
    """Every folder above the tenant's own must let its account pass (x), or Slurm's nodes,
    which run the job as that account, cannot open its logs and folders."""
    if uid == 0:
        return
    for parent in path.parents:
        info = parent.stat()
        if info.st_uid == uid or (info.st_gid == uid and info.st_mode & 0o010):
            continue
        if not info.st_mode & 0o001:
            raise DriverError(
                f"workload {workload_id}: {parent} is mode {info.st_mode & 0o777:04o}, so the "
                "tenant's cluster account cannot reach its folders under it; the shared path "
                "must let every account pass (mode o+x)")


def _usage_of(record: dict[str, Any]) -> WorkloadUsage | None:
    times = record.get("time") or {}
    start, end = int(times.get("start") or 0), int(times.get("end") or 0)
    if not start or not end:
        return None
    allocated = (record.get("tres") or {}).get("allocated") or []
    gpus = sum(int(t.get("count") or 0) for t in allocated
               if t.get("type") == "gres" and t.get("name") == "gpu")
    cpus = sum(int(t.get("count") or 0) for t in allocated if t.get("type") == "cpu")
    return WorkloadUsage(started_at=float(start), ended_at=float(end), gpus=gpus,
                         cpu_cores=float(cpus))
