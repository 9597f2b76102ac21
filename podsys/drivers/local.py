"""The `local` driver: every replica is a real process on this machine.

Nothing lives in memory that matters: each workload has a folder `<root>/workloads/<id>/` with
`workload.json` (spec, pids, GPUs, master port), `replica-<i>.log` and `replica-<i>.exit`, so a
fresh driver instance (a restarted Celery worker) sees, reads and cancels what another launched.
Each replica runs under `local_supervisor`, the leader of its own process group, which records
the exit code even when the launching process is gone.

A tenant's replica runs in a bubblewrap sandbox as the tenant's own unprivileged user
(`podsys.drivers.sandbox`): it sees its run folder, its checkpoint folder and the folders of
the data directory its workload names, never the workload folders (state, logs, exit codes:
root's, mode 0700) or anything else of the platform's. Where no sandbox can be made here, the
driver says so in `unsupported` and refuses tenants' work, unless the platform serves a single
tenant (`OGAI_SINGLE_TENANT`). The platform's own work (health checks) runs as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from django.conf import settings

from podsys.drivers import local_environments, local_ray, processes, sandbox
from podsys.drivers.base import (
    FEATURE_IMAGES,
    FEATURE_MULTI_NODE,
    FEATURE_NETWORKS,
    FEATURE_RAY,
    FEATURE_RDMA,
    FEATURE_SANDBOX,
    MAX_LOG_CHUNK_BYTES,
    ClusterDriver,
    DriverError,
    EnvironmentInfo,
    LogChunk,
    NodeInfo,
    Phase,
    ReplicaStatus,
    Workload,
    WorkloadStatus,
)
from podsys.drivers.common import (
    check_workload_id,
    check_workload_shape,
    finished_replica,
    is_valid_workload_id,
    missing,
    network_summary,
    summarize,
    tail_lines,
)
from podsys.drivers.local_environments import LocalEnvironment
from podsys.drivers.local_supervisor import write_exit_code
from podsys.drivers.workdir_unpack import workdir_unpack
from podsys.exporter import NodeCollector

SUPERVISOR = "podsys.drivers.local_supervisor"
STATE_FILE = "workload.json"
CANCELLED_FILE = "cancelled"
HOLDERS_FILE = "gpus.json"
LOCK_FILE = "gpus.lock"
VANISHED = "the process vanished without an exit code"
# How long cancel waits for processes to go after SIGKILL before it gives up.
KILL_WAIT_S = 5.0
POLL_S = 0.05
INVENTORY_TTL_S = 30.0
# Where the kernel lists the host's RDMA devices (InfiniBand and RoCE HCAs).
RDMA_DEVICE_DIR = "/sys/class/infiniband"
# Workloads whose result the platform records as they end (health checks, by this label): their
# folders are deleted this long after they finished; a job's stay, its logs with them.
EPHEMERAL_LABEL = "ogai.io/health-check"
EPHEMERAL_RETENTION_S = 86400.0

# What a replica inherits from the driver's environment: enough to find programs, libraries and
# caches, and none of the platform's own secrets (DATABASE_URL, SECRET_KEY, tokens).
# fmt: off
BASE_ENV_NAMES = frozenset((
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH",
    "CUDA_HOME", "CUDA_PATH", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
))
# fmt: on
BASE_ENV_PREFIXES = ("LC_",)


# Inside a sandbox these name the sandbox's own user, home and /tmp, not the platform's.
SANDBOX_OWN_ENV = frozenset((
    "HOME", "USER", "LOGNAME", "TMPDIR", "TEMP", "TMP", "XDG_CACHE_HOME", "HF_HOME",
))


# What a rendered workload shows for a secret's value.
SECRET_SHOWN_AS = "(secret: set at launch)"
# What the driver sets for each replica when it starts (see `_replica_env`).
LAUNCH_ENV_NAMES = frozenset((
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "OGAI_WORKLOAD_ID", "OGAI_RUN_DIR", "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED", "PYTHONPATH", "HOME", "USER", "TMPDIR",
))


class GpuInventory(NamedTuple):
    devices: int
    model: str = ""
    memory_mib: int = 0
    # Each GPU's device minor number (`/dev/nvidia<minor>`), by NVML index.
    minors: tuple[int, ...] = ()


def read_gpus() -> GpuInventory:
    """The GPUs NVML sees; none when nvidia-ml-py is not installed or NVML fails (no driver,
    no device, no permission): a machine without GPUs is a normal machine here."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return GpuInventory(0)
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return GpuInventory(0)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            return GpuInventory(0)
        first = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(first)
        memory = pynvml.nvmlDeviceGetMemoryInfo(first).total
        minors = tuple(
            int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(count)
        )
    except (pynvml.NVMLError, OSError):
        return GpuInventory(0)
    finally:
        with contextlib.suppress(pynvml.NVMLError, OSError):
            pynvml.nvmlShutdown()
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return GpuInventory(count, str(name), int(memory) // (1024 * 1024), minors)


def memory_mib() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_json(path: Path, data: Any) -> None:
    """Write then rename, so a reader never sees half a file; readable by its owner only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


@functools.cache
def _sandbox_refusal(bwrap: str) -> str | None:
    # Once per process: whether this machine can sandbox does not change while it runs.
    return sandbox.probe(bwrap)


def _sandbox_user(tenant: str) -> str:
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in tenant.lower())
    return f"ogai-{name}"[:32]


def _own(path: Path, uid: int) -> None:
    """Hand a folder the tenant writes to its user: the folder itself, and what is in it when
    it was someone else's until now (files written before its work was sandboxed). Links are
    changed, never followed."""
    if path.lstat().st_uid == uid:
        return
    os.chown(path, uid, uid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_tail(path: Path, tail: int | None, block: int = 65536) -> str:
    """The last `tail` lines of a file (all when None), reading backwards from its end so a
    huge log costs only what is shown."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return ""
    with handle:
        data = handle.read() if tail is None else _read_back(handle, tail, block)
    return tail_lines(data.decode("utf-8", errors="replace"), tail)


def read_log_file(path: Path, offset: int, final: bool,
                  limit: int = MAX_LOG_CHUNK_BYTES) -> LogChunk:
    """New complete lines of a log file from byte `offset` on (the last, unfinished line too
    when `final`); a line longer than `limit` comes in pieces rather than never."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return LogChunk(offset=offset)
    with handle:
        handle.seek(offset)
        data = handle.read(limit + 1)
    more = len(data) > limit
    data = data[:limit]
    end = data.rfind(b"\n") + 1
    if (more and end == 0) or (final and not more):
        end = len(data)
    if end == 0:
        return LogChunk(offset=offset)
    text = data[:end].decode("utf-8", errors="replace")
    lines = tuple(line.rstrip("\r") for line in text.split("\n"))
    if text.endswith("\n"):
        lines = lines[:-1]
    return LogChunk(lines=lines, offset=offset + end, more=more)


def _read_back(handle: Any, tail: int, block: int) -> bytes:
    position = handle.seek(0, os.SEEK_END)
    chunks: list[bytes] = []
    newlines = 0
    # One newline more than lines wanted: the first line read may be cut.
    while position > 0 and newlines <= tail:
        size = min(block, position)
        position -= size
        handle.seek(position)
        chunk = handle.read(size)
        chunks.append(chunk)
        newlines += chunk.count(b"\n")
    return b"".join(reversed(chunks))


def _platform_pythonpath() -> str:
    """The folder holding the platform's packages, so `python -m podsys.drivers.local_supervisor`
    and the platform's runners (`python -m ylink.runners.…`) import from any working folder;
    empty when the platform is installed in site-packages, where Python finds it anyway."""
    source_root = Path(__file__).resolve().parents[2]
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return "" if source_root in installed else str(source_root)


def _join_paths(*parts: str) -> str:
    return os.pathsep.join(part for part in parts if part)


class LocalDriver(ClusterDriver):
    """Options: `root` (state folder; default DATA_DIR/clusters/<cluster>), `grace_s` (cancel's
    wait between SIGTERM and SIGKILL, default 10), `node_name` (default the host name), `gpus`
    (GPU count to hand out instead of what NVML reports; `gpu_model` names them then),
    `env_passthrough` (more variable names replicas inherit from the driver's environment),
    `bwrap` (the bubblewrap program, default `bwrap`), `readonly_paths` (more folders tenants'
    sandboxes see read-only), `gpu_device_dir` (where the GPUs' device files are, default
    /dev), `environments` (named Python environments jobs may ask for: {name: venv or conda
    prefix}; `platform`, the platform's own, is always there) and `default_environment` (the
    one a job that names none runs in; default `platform`), `rdma_device_dir` (where the
    host's RDMA devices are listed, default /sys/class/infiniband: jobs may ask for RDMA only
    where it lists some) and `rdma_char_dir` (their device files, default /dev/infiniband, bound
    into the sandbox of a job that asks for RDMA)."""

    unsupported = {
        FEATURE_MULTI_NODE: "the local driver runs every replica on this machine",
        FEATURE_IMAGES: "the local driver runs commands in the local environment; "
        "images are ignored",
        FEATURE_NETWORKS: "the local driver runs jobs on this machine's own network; it "
        "attaches no extra networks",
    }

    def __init__(self, *, cluster: str, options: dict | None = None) -> None:
        super().__init__(cluster=cluster, options=options)
        default_root = Path(settings.DATA_DIR) / "clusters" / cluster
        self.root = Path(self.options.get("root") or default_root)
        self.grace_s = float(self.options.get("grace_s", 10))
        self.node_name = str(self.options.get("node_name") or socket.gethostname())
        # Popen objects of the supervisors this instance started, kept only to reap them (a
        # finished child stays a zombie until its parent waits for it); never needed to know
        # a status, which always comes from disk and /proc.
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._inventory: tuple[float, GpuInventory] | None = None
        # OGAI's node exporter, in process: it keeps what its rates need between two reads.
        self._metrics = NodeCollector(hostname=self.node_name)
        self.bwrap = str(self.options.get("bwrap") or "bwrap")
        self.sandbox_refusal = _sandbox_refusal(self.bwrap)
        if self.sandbox_refusal:
            self.unsupported = {**self.unsupported, FEATURE_SANDBOX: self.sandbox_refusal}
        self.rdma_device_dir = Path(str(self.options.get("rdma_device_dir")
                                        or RDMA_DEVICE_DIR))
        if not self._rdma_devices():
            self.unsupported = {**self.unsupported, FEATURE_RDMA: (
                f"this machine has no RDMA devices (none in {self.rdma_device_dir})")}
        ray_missing = local_ray.ray_missing()
        if ray_missing:
            self.unsupported = {**self.unsupported, FEATURE_RAY: ray_missing}
        # A bad option is said now, by name, not at the first launch.
        local_environments.configured(self.options)

    # Paths and state ------------------------------------------------------------------------

    def run_dir(self, handle: str) -> Path:
        """The working folder of the workload's processes: the workload's `run_dir` when it
        named one, else its folder under the driver's root."""
        state = self._load(handle)
        if state is not None and state.get("cwd"):
            return Path(state["cwd"])
        return self._folder(handle)

    def _folder(self, handle: str) -> Path:
        check_workload_id(handle)
        return self.root / "workloads" / handle

    def _load(self, handle: str) -> dict[str, Any] | None:
        if not is_valid_workload_id(handle):
            return None
        state = read_json(self.root / "workloads" / handle / STATE_FILE)
        return state if isinstance(state, dict) else None

    @contextlib.contextmanager
    def _locked(self, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
        """One launch at a time on this root, across processes: GPU allocation and the check
        that a workload does not exist yet must not interleave, and no one may see a workload
        half started. Holders of the shared mode only wait for launches in progress."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, mode)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # Nodes ----------------------------------------------------------------------------------

    def _gpus(self) -> GpuInventory:
        now = time.monotonic()
        if self._inventory is None or now - self._inventory[0] > INVENTORY_TTL_S:
            self._inventory = (now, read_gpus())
        found = self._inventory[1]
        if "gpus" in self.options:
            model = found.model or str(self.options.get("gpu_model", ""))
            return GpuInventory(int(self.options["gpus"]), model, found.memory_mib, found.minors)
        return found

    def _rdma_devices(self) -> list[str]:
        """The host's RDMA devices (HCAs such as mlx5_0), as the kernel lists them."""
        try:
            return sorted(entry.name for entry in self.rdma_device_dir.iterdir())
        except OSError:
            return []

    def nodes(self) -> list[NodeInfo]:
        gpus = self._gpus()
        return [
            NodeInfo(
                name=self.node_name,
                gpus=gpus.devices,
                gpu_model=gpus.model,
                gpu_memory_mib=gpus.memory_mib,
                cpu_cores=float(os.cpu_count() or 1),
                memory_mib=memory_mib(),
                rdma=len(self._rdma_devices()),
            )
        ]

    # Launch ---------------------------------------------------------------------------------

    def environments(self) -> list[EnvironmentInfo]:
        return list(local_environments.environments(self.options))

    def _environment(self, workload: Workload) -> LocalEnvironment:
        return local_environments.choose(self.options, workload.environment,
                                         cluster=self.cluster)

    def launch(self, workload: Workload) -> str:
        check_workload_id(workload.id)
        self._validate(workload)
        with self._locked():
            folder = self._folder(workload.id)
            if (folder / STATE_FILE).exists():
                return workload.id
            environment = self._environment(workload)
            self._reap()
            gpus = self._allocate(workload)
            state = self._prepare(workload, folder, gpus, environment)
            self._add_holder(workload.id, gpus)
            try:
                for index in range(workload.replicas):
                    self._start_replica(workload, folder, state, index)
            except OSError as exc:
                with contextlib.suppress(DriverError):
                    # A gang runs whole or not at all: stop the replicas that did start.
                    self._stop(folder, state, grace_s=0)
                raise DriverError(f"could not start workload {workload.id}: {exc}") from exc
        return workload.id

    def _validate(self, workload: Workload) -> None:
        check_workload_shape(workload)
        elsewhere = sorted({node for node in workload.placement if node != self.node_name})
        if elsewhere:
            raise DriverError(
                f"workload {workload.id} is placed on {', '.join(elsewhere)}, "
                f"but this local cluster is only node {self.node_name}"
            )
        if workload.workdir_archive and not Path(workload.workdir_archive).is_file():
            raise DriverError(f"workload {workload.id}: its working folder's archive "
                              f"{workload.workdir_archive} is missing")
        if workload.ray is not None and not self.supports(FEATURE_RAY):
            raise DriverError(f"workload {workload.id} is a Ray cluster: "
                              f"{self.unsupported[FEATURE_RAY]}")
        if workload.networks:
            raise DriverError(f"workload {workload.id}: cluster {self.cluster} cannot attach "
                              f"networks ({self.unsupported[FEATURE_NETWORKS]})")
        if workload.resources.rdma > 0:
            if not self.supports(FEATURE_RDMA):
                raise DriverError(f"workload {workload.id} asks for RDMA devices: "
                                  f"{self.unsupported[FEATURE_RDMA]}")
            found = len(self._rdma_devices())
            if workload.resources.rdma > found:
                raise DriverError(f"workload {workload.id} asks for {workload.resources.rdma} "
                                  f"RDMA devices per replica; this machine has {found}")

    def _allocate(self, workload: Workload) -> list[list[int]]:
        """GPU indices for each replica, from those no running workload holds."""
        per_replica = workload.resources.gpus
        if per_replica <= 0:
            return [[] for _ in range(workload.replicas)]
        total = self._gpus().devices
        held = self._held_gpus()
        free = [index for index in range(total) if index not in held]
        needed = per_replica * workload.replicas
        if needed > len(free):
            raise DriverError(
                f"workload {workload.id} needs {needed} GPUs; {len(free)} of {total} are free "
                f"on {self.node_name}"
            )
        return [free[i * per_replica : (i + 1) * per_replica] for i in range(workload.replicas)]

    def _held_gpus(self) -> set[int]:
        """GPUs of replicas still running; forgets workloads that hold none any more."""
        held: set[int] = set()
        holders = self._read_holders()
        still = []
        for workload_id in holders:
            state = self._load(workload_id)
            replicas = state["replicas"] if state else []
            folder = self.root / "workloads" / workload_id
            live = [r for r in replicas if r["gpus"] and self._replica_running(folder, r)]
            if live:
                still.append(workload_id)
                held.update(index for r in live for index in r["gpus"])
        if still != holders:
            write_json(self.root / HOLDERS_FILE, still)
        return held

    def _read_holders(self) -> list[str]:
        holders = read_json(self.root / HOLDERS_FILE)
        if isinstance(holders, list):
            return [str(h) for h in holders]
        # Lost or damaged: rebuild from the workload folders.
        found = []
        for state_file in (self.root / "workloads").glob(f"*/{STATE_FILE}"):
            state = read_json(state_file)
            if isinstance(state, dict) and any(r.get("gpus") for r in state.get("replicas", [])):
                found.append(state_file.parent.name)
        return found

    def _add_holder(self, workload_id: str, gpus: list[list[int]]) -> None:
        if not any(gpus):
            return
        holders = self._read_holders()
        if workload_id not in holders:
            holders.append(workload_id)
        write_json(self.root / HOLDERS_FILE, holders)

    def _confined(self, workload: Workload) -> bool:
        """Whether the workload runs in a sandbox: a tenant's always, where one can be made;
        elsewhere only on a platform serving a single tenant, unconfined; never silently."""
        if not workload.tenant:
            return False  # the platform's own work (health checks)
        if self.sandbox_refusal is None:
            if workload.run_as is None or workload.run_as <= 0:
                raise DriverError(f"workload {workload.id} of tenant {workload.tenant} names "
                                  "no unprivileged user to run as")
            return True
        if getattr(settings, "OGAI_SINGLE_TENANT", False):
            return False
        raise DriverError(
            f"cluster {self.cluster} runs no tenant's work: it cannot sandbox it here "
            f"({self.sandbox_refusal}); a platform that serves one tenant may set "
            "OGAI_SINGLE_TENANT=true to run it unconfined"
        )

    def _prepare(self, workload: Workload, folder: Path, gpus: list[list[int]],
                 environment: LocalEnvironment) -> dict[str, Any]:
        confined = self._confined(workload)
        cwd = self._cwd(workload, folder)
        try:
            # The workload's state, logs and exit codes are the platform's alone.
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
            cwd.mkdir(parents=True, exist_ok=True)
            if workload.checkpoint_dir:
                Path(workload.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            self._unpack(workload, cwd, uid=workload.run_as if confined else None)
            if confined:
                self._hand_over(workload, folder, cwd)
        except OSError as exc:
            raise DriverError(f"could not prepare workload {workload.id}: {exc}") from exc
        spec = dataclasses.asdict(workload)
        spec["secret_env"] = sorted(workload.secret_env)  # names only: this file is on disk
        state: dict[str, Any] = {
            "id": workload.id,
            "spec": spec,
            "node": self.node_name,
            "cwd": str(cwd),
            "master_port": free_port(),
            "started_at": time.time(),
            "sandbox": {"uid": workload.run_as, "user": _sandbox_user(workload.tenant)}
            if confined else None,
            "environment": {"name": environment.name, "where": environment.where},
            # A Ray cluster's ports (`local_ray`), picked now: its nodes share this network.
            "ray": local_ray.assign_ports(workload.replicas) if workload.ray else None,
            "replicas": [
                {"index": i, "gpus": gpus[i], "pid": None, "start_time": None}
                for i in range(workload.replicas)
            ],
        }
        # Written before any process starts: a crash from here on leaves a workload that
        # reports its replicas as vanished, never one that is silently lost.
        write_json(folder / STATE_FILE, state)
        return state

    def _cwd(self, workload: Workload, folder: Path) -> Path:
        return Path(workload.run_dir) if workload.run_dir else folder / "run"

    def _unpack(self, workload: Workload, cwd: Path, *, uid: int | None) -> None:
        """The job's working folder, unpacked into its run folder before any replica starts
        (each attempt has a run folder of its own, so a retry starts from the archive again),
        and the tenant's user's where its replicas run as that user."""
        if not workload.workdir_archive:
            return
        try:
            workdir_unpack(workload.workdir_archive, cwd)
        except Exception as exc:  # a damaged archive, a refused member, a full disk
            raise DriverError(f"workload {workload.id}: could not unpack its working folder "
                              f"{workload.workdir_archive}: {exc}") from exc
        if uid is None:
            return
        for place, dirs, files in os.walk(cwd):
            for name in (*dirs, *files):
                os.chown(os.path.join(place, name), uid, uid, follow_symlinks=False)

    def _hand_over(self, workload: Workload, folder: Path, cwd: Path) -> None:
        """The folders the tenant writes become its user's; its sandbox's /etc/passwd and
        /etc/group name that user."""
        uid = int(workload.run_as or 0)
        writable = [cwd, *([Path(workload.checkpoint_dir)] if workload.checkpoint_dir else []),
                    *(Path(m.path) for m in workload.data_mounts if not m.read_only)]
        for path in writable:
            _own(path, uid)
        user = _sandbox_user(workload.tenant)
        passwd, group = sandbox.passwd_lines(uid, user, str(cwd))
        (folder / "passwd").write_text(passwd)
        (folder / "group").write_text(group)

    def _sandbox(self, workload: Workload, folder: Path, state: dict,
                 index: int) -> sandbox.Sandbox:
        uid = int(state["sandbox"]["uid"])
        box = sandbox.Sandbox(uid=uid, cwd=state["cwd"])
        box.system = self._readonly(workload, state["environment"]["where"])
        box.files = {"/etc/passwd": str(folder / "passwd"), "/etc/group": str(folder / "group")}
        gpus = self._gpus()
        minors = [gpus.minors[i] if i < len(gpus.minors) else i
                  for i in state["replicas"][index]["gpus"]]
        box.devices = sandbox.gpu_devices(minors, str(self.options.get("gpu_device_dir", "/dev")))
        if workload.resources.rdma > 0:
            box.devices += sandbox.rdma_devices(
                str(self.options.get("rdma_char_dir", "/dev/infiniband")))
        writable = {state["cwd"], *([workload.checkpoint_dir] if workload.checkpoint_dir else [])}
        mounts = [(path, False) for path in sorted(writable)]
        mounts += [(m.path, m.read_only) for m in workload.data_mounts if m.path not in writable]
        try:
            for path, read_only in mounts:
                box.bind(path, read_only=read_only)
        except sandbox.SandboxError:
            box.close()
            raise
        return box

    def _readonly(self, workload: Workload, prefix: str) -> list[str]:
        """What the sandbox shows read-only: the system, the platform, the operator's extra
        folders and the workload's Python environment (a venv's base installation with it)."""
        home = sandbox.venv_home(prefix)
        extra = [*self.options.get("readonly_paths", ()), prefix, *([home] if home else [])]
        return sandbox.readonly_paths(workload.command,
                                      hidden=(Path(settings.DATA_DIR), self.root), extra=extra)

    def _start_replica(self, workload: Workload, folder: Path, state: dict, index: int) -> None:
        replica = state["replicas"][index]
        log = folder / f"replica-{index}.log"
        argv = [
            sys.executable, "-P", "-m", SUPERVISOR,
            "--exit-file", str(folder / f"replica-{index}.exit"),
            "--log", str(log),
        ]  # fmt: skip
        env = self._replica_env(workload, state, index)
        command = self._command(workload, state, index)
        box = None
        if state.get("sandbox"):
            try:
                box = self._sandbox(workload, folder, state, index)
            except sandbox.SandboxError as exc:
                raise OSError(str(exc)) from exc
            bwrap = shutil.which(self.bwrap) or self.bwrap
            argv += ["--sandboxed", "--fds", ",".join(map(str, box.fds)),
                     "--", *box.argv(bwrap, command)]
        else:
            argv += ["--", *command]
        try:
            with log.open("ab") as out:
                # The supervisor's own output (an import error, say) lands in the log too.
                child = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
                    argv,
                    cwd=folder if box else state["cwd"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=box.fds if box else (),
                )
        finally:
            if box is not None:
                box.close()
        self._children[child.pid] = child
        replica["pid"] = child.pid
        replica["start_time"] = processes.start_time(child.pid)
        # Saved after each start, so a crash mid-launch still leaves every started pid known.
        write_json(folder / STATE_FILE, state)

    def _command(self, workload: Workload, state: dict, index: int) -> list[str]:
        """The replica's command: the workload's own, or its Ray node's (`local_ray`)."""
        if workload.ray is None or not state.get("ray"):
            return list(workload.command)
        where = (state.get("environment") or {}).get("where") or ""
        python = Path(where) / "bin" / "python"
        return local_ray.replica_command(
            workload, state["ray"], index=index,
            python=str(python) if where and python.exists() else sys.executable,
            cwd=state["cwd"], gpus=len(state["replicas"][index]["gpus"]),
            confined=bool(state.get("sandbox")))

    def _base_env(self) -> dict[str, str]:
        names = BASE_ENV_NAMES | set(self.options.get("env_passthrough", ()))
        return {
            key: value
            for key, value in os.environ.items()
            if key in names or key.startswith(BASE_ENV_PREFIXES)
        }

    def _replica_env(self, workload: Workload, state: dict, index: int) -> dict[str, str]:
        env = self._base_env()
        confined = state.get("sandbox")
        if confined:
            env = {key: value for key, value in env.items() if key not in SANDBOX_OWN_ENV}
            env.update({"HOME": state["cwd"], "USER": confined["user"],
                        "LOGNAME": confined["user"], "TMPDIR": "/tmp"})  # noqa: S108
        chosen = state.get("environment")
        if chosen:
            env = local_environments.activate(env, LocalEnvironment(**chosen))
        env["PYTHONUNBUFFERED"] = "1"  # so logs stream while the job runs; a job may override
        env.update(workload.env)
        env.update(workload.secret_env)
        env["PYTHONPATH"] = _join_paths(env.get("PYTHONPATH", ""), _platform_pythonpath())
        gpus = state["replicas"][index]["gpus"]
        env.update(
            {
                "RANK": str(index),
                "WORLD_SIZE": str(workload.replicas),
                # Each replica sees only its own GPUs (numbered from 0), as it would in a pod of
                # its own: it is rank 0 on its "node", so `cuda.set_device(LOCAL_RANK)` works.
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "NODE_RANK": str(index),
                "GROUP_RANK": str(index),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(state["master_port"]),
                "OGAI_WORKLOAD_ID": workload.id,
                "OGAI_RUN_DIR": state["cwd"],
                # A sandbox holds only its own GPUs' device files, so CUDA numbers them from
                # 0; unconfined, every GPU of the machine is there and the indices pick them.
                "CUDA_VISIBLE_DEVICES": ",".join(
                    str(i) for i in (range(len(gpus)) if confined else gpus)),
                # NVML numbers GPUs by PCI bus; CUDA must use the same order for the indices
                # above to mean the GPUs that were allocated.
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            }
        )
        if workload.checkpoint_dir:
            env["OGAI_CHECKPOINT_DIR"] = workload.checkpoint_dir
        return env

    # Render ---------------------------------------------------------------------------------

    def render(self, workload: Workload) -> str:
        """What launching the workload would run here, as YAML a person reads: its
        environment, command, working folder, environment variables (secrets by name only),
        resources and sandbox. Starts nothing and writes nothing."""
        check_workload_id(workload.id)
        self._validate(workload)
        environment = self._environment(workload)
        folder = self._folder(workload.id)
        cwd = self._cwd(workload, folder)
        env = local_environments.activate(
            {"PATH": self._base_env().get("PATH", os.defpath)}, environment)
        env.update(workload.env)
        env.update(dict.fromkeys(workload.secret_env, SECRET_SHOWN_AS))
        gpus = self._gpus()
        text: dict[str, Any] = {
            "cluster": self.cluster,
            "workload": workload.id,
            "node": self.node_name,
            "environment": {"name": environment.name, "prefix": environment.where,
                            "python": environment.python,
                            "torch": environment.torch or "not installed"},
            "command": list(workload.command),
            "run_folder": str(cwd),
            "working_folder": _working_folder(workload, cwd),
            "replicas": workload.replicas,
            "resources": {"cpu_cores": workload.resources.cpu_cores,
                          "memory_mib": workload.resources.memory_mib,
                          "gpus": workload.resources.gpus},
            "network": {"asked": network_summary(workload),
                        "rdma_devices_here": self._rdma_devices()},
            "gpus": {"per_replica": workload.resources.gpus,
                     "node_has": gpus.devices, "model": gpus.model or None,
                     "handed_out": "at launch, from those free then, as CUDA_VISIBLE_DEVICES"},
            "env": dict(sorted(env.items())),
            "env_set_at_launch": sorted(LAUNCH_ENV_NAMES),
            "sandbox": self._render_sandbox(workload, environment, cwd),
        }
        if workload.checkpoint_dir:
            text["checkpoint_folder"] = workload.checkpoint_dir
        if workload.ray is not None:
            text["ray"] = {
                "head": "replica 0: ray start --head --block, then the command above as the "
                "entrypoint once every node is alive (RAY_ADDRESS set)",
                "workers": f"replicas 1..{workload.replicas - 1}: ray start --address=<head> "
                "--block" if workload.replicas > 1 else "none",
                "head_resources": dataclasses.asdict(workload.ray.head),
                "worker_resources": dataclasses.asdict(workload.ray.worker),
                "dashboard": workload.ray.dashboard,
                "ports": "picked at launch from those free then",
                "ray_installed": self.supports(FEATURE_RAY),
            }
        return yaml.safe_dump(text, sort_keys=False, default_flow_style=False)

    def _render_sandbox(self, workload: Workload, environment: LocalEnvironment,
                        cwd: Path) -> dict[str, Any]:
        if not self._confined(workload):  # DriverError where it would be refused
            why = "the platform's own work" if not workload.tenant else \
                "OGAI_SINGLE_TENANT: this platform serves one tenant"
            return {"confined": False, "why": why}
        try:
            readonly = self._readonly(workload, environment.where)
        except sandbox.SandboxError as exc:
            raise DriverError(f"workload {workload.id}: {exc}") from None
        writable = [str(cwd), *([workload.checkpoint_dir] if workload.checkpoint_dir else []),
                    *(m.path for m in workload.data_mounts if not m.read_only)]
        return {
            "confined": True,
            "uid": workload.run_as,
            "user": _sandbox_user(workload.tenant),
            "read_write": list(dict.fromkeys(writable)),
            "read_only": [*readonly, *(m.path for m in workload.data_mounts if m.read_only)],
        }

    # Status ---------------------------------------------------------------------------------

    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        self._reap()
        return {handle: self._status(handle) for handle in handles}

    def _status(self, handle: str) -> WorkloadStatus:
        state = self._load(handle)
        if state is not None and any(r["pid"] is None for r in state["replicas"]):
            # A launch may be starting it right now: wait for it, then look again.
            with self._locked(fcntl.LOCK_SH):
                state = self._load(handle)
        if state is None:
            return missing(handle)
        folder = self._folder(handle)
        cancelled_at = _mtime(folder / CANCELLED_FILE)
        replicas: list[ReplicaStatus] = []
        failed_at: dict[int, float] = {}
        for replica in state["replicas"]:
            status, ended = self._replica_status(folder, state["node"], replica, cancelled_at)
            replicas.append(status)
            if status.phase == Phase.FAILED and ended is not None:
                failed_at[status.index] = ended
        return summarize(handle, replicas, failed_at=failed_at)

    def _replica_status(
        self, folder: Path, node: str, replica: dict, cancelled_at: float | None
    ) -> tuple[ReplicaStatus, float | None]:
        index = replica["index"]
        exit_file = folder / f"replica-{index}.exit"
        code = _read_exit(exit_file)
        if code is None and self._replica_alive(replica):
            return ReplicaStatus(index=index, phase=Phase.RUNNING, node=node), None
        if code is None:
            # Read again: the supervisor may have written it between the two looks.
            code = _read_exit(exit_file)
        if code is None:
            lost = ReplicaStatus(index=index, phase=Phase.FAILED, node=node, reason=VANISHED)
            return lost, None
        ended = _mtime(exit_file)
        status = finished_replica(index, code, node=node)
        if code != 0 and cancelled_at is not None and ended is not None and ended >= cancelled_at:
            status = dataclasses.replace(status, reason=f"cancelled ({status.reason})")
        return status, ended

    def _replica_running(self, folder: Path, replica: dict) -> bool:
        """Still running: no exit code yet (a supervisor that wrote one is only exiting)."""
        exit_file = folder / f"replica-{replica['index']}.exit"
        return not exit_file.exists() and self._replica_alive(replica)

    def _replica_alive(self, replica: dict) -> bool:
        pid = replica.get("pid")
        return isinstance(pid, int) and processes.is_alive(pid, replica.get("start_time"))

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)

    # Cancel ---------------------------------------------------------------------------------

    def cancel(self, handle: str) -> None:
        if self._load(handle) is None:
            return
        # Under the lock, so a launch in progress has started every replica (and recorded its
        # pid) before we read the pids to signal; not during the grace wait, which may be long.
        with self._locked():
            state = self._load(handle)
            folder = self._folder(handle)
            if state is not None and not (folder / CANCELLED_FILE).exists():
                (folder / CANCELLED_FILE).write_text(f"{time.time()}\n")
        if state is not None:
            self._stop(folder, state, grace_s=self.grace_s)

    def _stop(self, folder: Path, state: dict, *, grace_s: float) -> None:
        """SIGTERM to every replica's group, SIGKILL to what is left after `grace_s`."""
        self._reap()
        leaders = {r["pid"]: r.get("start_time") for r in state["replicas"] if r.get("pid")}
        alive = self._live_groups(leaders)
        if not alive:
            return
        # The last signal each group got: the exit code of a supervisor it killed.
        sent = {leader: signal.SIGTERM for leader in alive}
        for leader, found in alive.items():
            processes.signal_group(leader, found, signal.SIGTERM)
        left = self._wait_gone(leaders, grace_s)
        for leader, found in left.items():
            processes.signal_group(leader, found, signal.SIGKILL)
            sent[leader] = signal.SIGKILL
        left = self._wait_gone(leaders, KILL_WAIT_S)
        self._record_killed(folder, state, sent)
        if left:
            pids = sorted(info.pid for found in left.values() for info in found)
            raise DriverError(f"workload {state['id']}: processes {pids} did not stop")

    def _live_groups(self, leaders: dict[int, int | None]) -> dict[int, list[processes.ProcInfo]]:
        return {leader: found for leader, found in processes.members(leaders).items() if found}

    def _wait_gone(
        self, leaders: dict[int, int | None], timeout_s: float
    ) -> dict[int, list[processes.ProcInfo]]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reap()
            alive = self._live_groups(leaders)
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(POLL_S)

    def _record_killed(self, folder: Path, state: dict, sent: dict[int, signal.Signals]) -> None:
        """A supervisor killed by our signal wrote no exit code: write one for it."""
        for replica in state["replicas"]:
            exit_file = folder / f"replica-{replica['index']}.exit"
            sig = sent.get(replica.get("pid") or 0)
            if sig is not None and _read_exit(exit_file) is None:
                write_exit_code(exit_file, -sig)

    # Logs and endpoints ---------------------------------------------------------------------

    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str:
        state = self._load(handle)
        if state is None:
            raise DriverError(f"no workload {handle!r} on cluster {self.cluster}")
        if not 0 <= replica < len(state["replicas"]):
            raise DriverError(f"workload {handle} has no replica {replica}")
        return read_tail(self._folder(handle) / f"replica-{replica}.log", tail)

    def read_log(self, handle: str, *, replica: int, offset: int,
                 final: bool = False) -> LogChunk:
        return read_log_file(self._folder(handle) / f"replica-{replica}.log", offset, final)

    def cleanup(self, now: float | None = None) -> int:
        """Delete the folders of finished health-check workloads a day after they ended."""
        now = time.time() if now is None else now
        removed = 0
        for state_file in (self.root / "workloads").glob(f"*/{STATE_FILE}"):
            state = read_json(state_file)
            if not isinstance(state, dict) or \
                    EPHEMERAL_LABEL not in (state.get("spec") or {}).get("labels", {}):
                continue
            folder = state_file.parent
            replicas = state.get("replicas", [])
            if any(self._replica_running(folder, replica) for replica in replicas):
                continue
            ended = max((path.stat().st_mtime for path in folder.glob("replica-*.exit")),
                        default=state_file.stat().st_mtime)
            if now - ended > EPHEMERAL_RETENTION_S:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        return removed

    def endpoint(self, handle: str) -> str | None:
        state = self._load(handle)
        if state is None:
            return None
        spec = state["spec"]
        if not spec.get("service") or not spec.get("ports"):
            return None
        return f"http://127.0.0.1:{spec['ports'][0]}"

    def ray_addresses(self, handle: str) -> dict[str, str] | None:
        state = self._load(handle)
        if state is None or not state.get("ray"):
            return None
        # Not before the head says every node is alive (`ray_node`): a cluster still starting
        # takes no work.
        if not (Path(state["cwd"]) / local_ray.STATE_FOLDER / "ready").exists():
            return None
        spec = state["spec"].get("ray") or {}
        return local_ray.addresses(state["ray"], dashboard=bool(spec.get("dashboard")))

    def node_metrics(self, node: str) -> str | None:
        """This machine's GPUs (NVML) and OS (/proc), read now; None for another node."""
        if node != self.node_name:
            return None
        return self._metrics.exposition()


def _working_folder(workload: Workload, cwd: Path) -> dict[str, Any] | None:
    if not workload.workdir_archive:
        return None
    archive = Path(workload.workdir_archive)
    # Archives are named by their content's sha256.
    sha256 = archive.name.removesuffix(".tar.gz")
    return {"archive": str(archive), "sha256": sha256, "unpacked_into": str(cwd)}


def _read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
