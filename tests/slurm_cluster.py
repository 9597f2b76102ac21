"""A real Slurm on this machine for the driver's tests and the dispatch benchmark.

Debian's Slurm 22.05 runs several `slurmd` on one host (each node its own `Port=`), so a
controller, a database daemon keeping accounting in the local MariaDB and two or more nodes
with GRES `gpu` counts (no device files) make a real cluster in a scratch folder. Everything
runs as root, with its own munge socket, ports and database, and `stop()` ends all of it: a
second cluster, or the machine's own Slurm, is never touched.

The Debian packages are installed by `make slurm` (as the browser tests' Chromium is).
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
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "munged")
MYSQL = ("mariadb", "-h", "127.0.0.1", "-P", "3306", "-u", "root")
START_TIMEOUT_S = 60.0


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if shutil.which(name) is None
            and not Path("/usr/sbin", name).exists()]


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    """`nodes` slurmd daemons named n1…nN, each with `gpus` GPUs of `gpu_type`, `cpus` CPUs
    and `memory_mib` of memory, in one partition `batch` (the default)."""

    root: Path
    nodes: int = 2
    gpus: int = 2
    gpu_type: str = "h100"
    cpus: int = 4
    memory_mib: int = 4096
    accounting: bool = True
    name: str = field(default_factory=lambda: f"ogai{uuid.uuid4().hex[:8]}")
    _daemons: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _slurmd: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def env(self) -> dict[str, str]:
        """What a client (the driver, `sbatch` by hand) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, check=check,
                              capture_output=True, text=True, timeout=60, **kwargs)

    # Start and stop --------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        missing = missing_programs()
        if missing:
            raise RuntimeError(f"Slurm is not installed here ({', '.join(missing)} missing): "
                               "`make slurm` installs Debian's packages")
        for sub in ("etc", "state", "spool", "log", "run", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._open_paths()
        self._start_munge()
        ctld_port, dbd_port, *node_ports = _free_ports(2 + self.nodes)
        self.database = f"{self.name}_acct"
        self._write_conf(ctld_port, dbd_port, node_ports)
        try:
            if self.accounting:
                self._start_dbd()
            self._daemon(_program("slurmctld"), "-D", "-f", str(self.conf), "-i")
            self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0,
                       "slurmctld to answer")
            for node in self.node_names:
                self._slurmd[node] = self._daemon(_program("slurmd"), "-D", "-f",
                                                  str(self.conf), "-N", node)
            self._wait(self._nodes_idle, "every node to be idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _open_paths(self) -> None:
        """Jobs run as tenants' accounts, and the platform's Python and code are where this
        machine keeps them: often under /root or a checkout in a private temporary folder
        (mode 0700). Their owner lets others pass through those folders (x, not r) while the
        cluster runs, as a node's system Python would be reachable."""
        self._opened: dict[Path, int] = {}
        places = (Path(sys.executable), Path(sys.executable).resolve(),
                  Path(__file__).resolve())
        for folder in dict.fromkeys(parent for place in places for parent in place.parents):
            mode = folder.stat().st_mode & 0o7777
            if not mode & 0o001 and folder.stat().st_uid == os.getuid():
                self._opened[folder] = mode
                os.chmod(folder, mode | 0o001)

    def stop(self) -> None:
        for process in reversed(self._daemons):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self._daemons):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._daemons.clear()
        # Job steps that outlived their slurmd (slurmstepd and what it ran).
        self._kill_processes()
        for folder, mode in getattr(self, "_opened", {}).items():
            with contextlib.suppress(OSError):
                os.chmod(folder, mode)
        self._opened = {}
        if self.accounting:
            subprocess.run([*MYSQL, "-e", f"DROP DATABASE IF EXISTS `{self.database}`"],
                           check=False, capture_output=True)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, **fields) -> Iterator[SlurmCluster]:
        """A cluster in a new scratch folder, deleted with it. Not under pytest's own
        temporary folders: slurmd runs a job's script from its spool as the job's account,
        which must be able to pass through every folder above it."""
        root = Path(tempfile.mkdtemp(prefix="ogai-slurm-"))
        root.chmod(0o755)
        cluster = cls(root=root, **fields)
        try:
            with cluster:
                yield cluster
        finally:
            if not os.environ.get("OGAI_KEEP_SLURM"):
                shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def lose_node(self, node: str, reason: str = "lost") -> None:
        """The node's machine is gone: its slurmd dies and Slurm marks it DOWN."""
        process = self._slurmd[node]
        process.kill()
        process.wait()
        self.run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")
        # Then what ran there: had it gone first, Slurm would see the job fail, not the node.
        self._kill_processes(f"SLURM_TOPOLOGY_ADDR={node}".encode())

    def restore_node(self, node: str) -> None:
        self._slurmd[node] = self._daemon(_program("slurmd"), "-D", "-f", str(self.conf),
                                          "-N", node)
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        self._wait(self._nodes_idle, "every node to be idle")

    def reset(self) -> None:
        """Start the next test from what a fresh cluster has: no job left queued or running
        and no node drained (a previous test's health checks drain through the platform, and
        Slurm keeps the drain after that test's database is gone)."""
        jobs = json.loads(self.run("squeue", "--json").stdout)["jobs"]
        if jobs:
            self.run("scancel", *(str(job["job_id"]) for job in jobs), check=False)
        for node in json.loads(self.run("sinfo", "--json").stdout)["nodes"]:
            if node["state_flags"] or node["state"].lower() != "idle":
                self.run("scontrol", "update", f"nodename={node['name']}", "state=resume",
                         check=False)
        self._wait(self._nodes_idle, "every node to be idle")

    def _kill_processes(self, *markers: bytes) -> None:
        """Kill what this cluster started (its environment names this cluster's slurm.conf)
        and carries every marker (`NAME=value` of its environment)."""
        ours = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if ours in environ and all(marker in environ for marker in markers):
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)

    # Pieces ----------------------------------------------------------------------------------

    def _daemon(self, *args: str) -> subprocess.Popen:
        name = Path(args[0]).name
        log = (self.root / "log" / f"{name}-{len(self._daemons)}.out").open("w")
        process = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **self.env}, start_new_session=True)
        self._daemons.append(process)
        return process

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for process in [*self._daemons[:3], *self._slurmd.values()]:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited ({process.returncode}) "
                                       f"waiting for {what}: see {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}: see {self.root / 'log'}")

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._daemon("munged", "--foreground", "--force", f"--key-file={key}",
                     f"--socket={self.munge_socket}", f"--pid-file={self.root / 'munge/pid'}",
                     f"--seed-file={self.root / 'munge/seed'}",
                     f"--log-file={self.root / 'log/munged.log'}")
        self._wait(self.munge_socket.exists, "munged's socket")

    def _start_dbd(self) -> None:
        subprocess.run([*MYSQL, "-e", f"CREATE DATABASE IF NOT EXISTS `{self.database}`"],
                       check=True, capture_output=True)
        self._daemon(_program("slurmdbd"), "-D")
        self._wait(lambda: self.run("sacctmgr", "-n", "show", "cluster",
                                    check=False).returncode == 0, "slurmdbd to answer")

    def _write_conf(self, ctld_port: int, dbd_port: int, node_ports: list[int]) -> None:
        host = socket.gethostname().split(".")[0]
        auth = f"socket={self.munge_socket}"
        gres = f"gpu:{self.gpu_type}:{self.gpus}" if self.gpus else ""
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_ports[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo={auth}",
            "CredType=cred/munge",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            # Nodes are what this file says (n CPUs and GPUs on a 2-core machine without any).
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "GresTypes=gpu",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'run/slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root / 'log/slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            # Hundreds of jobs starting at once on a 2-core machine (the dispatch benchmark)
            # keep a step's launch messages waiting longer than the default 10 s.
            "MessageTimeout=30",
            "MinJobAge=300",
            "KillWait=30",
            "JobRequeue=1",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=30",
        ]
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={dbd_port}",
                # With munge, the socket the accounting connection authenticates through.
                f"AccountingStoragePass={self.munge_socket}",
                "AccountingStorageTRES=gres/gpu",
                "JobCompType=jobcomp/none",
            ]
        for node, port in zip(self.node_names, node_ports, strict=True):
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus} RealMemory={self.memory_mib} State=UNKNOWN"
                + (f" Gres={gres}" if gres else "")
            )
        nodes = ",".join(self.node_names)
        lines.append(f"PartitionName=batch Nodes={nodes} Default=YES MaxTime=INFINITE "
                     "State=UP OverSubscribe=NO")
        self.conf.write_text("\n".join(lines) + "\n")
        if self.gpus:
            # Slurm 22.05 drops a GPU without a device file, so each node gets stand-ins
            # (empty files): it hands them out and sets CUDA_VISIBLE_DEVICES by them.
            gres = ["AutoDetect=off"]
            for node in self.node_names:
                devices = self.root / "dev" / node
                devices.mkdir(parents=True, exist_ok=True)
                for index in range(self.gpus):
                    (devices / f"nvidia{index}").touch()
                gres.append(f"NodeName={node} Name=gpu Type={self.gpu_type} "
                            f"File={devices}/nvidia[0-{self.gpus - 1}]")
            (self.root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        if self.accounting:
            dbd = self.root / "etc" / "slurmdbd.conf"
            dbd.write_text("\n".join([
                "AuthType=auth/munge",
                f"AuthInfo={auth}",
                f"DbdHost={host}",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"LogFile={self.root / 'log/slurmdbd.log'}",
                f"PidFile={self.root / 'run/slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                "StoragePort=3306",
                "StorageUser=root",
                f"StorageLoc={self.database}",
            ]) + "\n")
            dbd.chmod(0o600)

    def _nodes_idle(self) -> bool:
        result = self.run("sinfo", "--json", check=False)
        if result.returncode != 0:
            return False
        with contextlib.suppress(ValueError, KeyError):
            nodes = json.loads(result.stdout)["nodes"]
            return len(nodes) == self.nodes and all(
                node["state"].lower() == "idle" and not node["state_flags"] for node in nodes)
        return False


@contextlib.contextmanager
def posix_accounts(*uids: int) -> Iterator[list[str]]:
    """Tenants' cluster accounts on the nodes (as the accounts playbook pushes them: the same
    uid and gid everywhere), here on this machine's slurmd hosts; removed afterwards."""
    import pwd

    made, names = [], []
    for uid in uids:
        try:
            names.append(pwd.getpwuid(uid).pw_name)
            continue
        except KeyError:
            pass
        name = f"ogai-t{uid}"[:32]
        subprocess.run(["groupadd", "-g", str(uid), name], check=True, capture_output=True)
        subprocess.run(["useradd", "-u", str(uid), "-g", str(uid), "-M", "-d", "/nonexistent",
                        "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
        made.append(name)
        names.append(name)
    try:
        yield names
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)
            subprocess.run(["groupdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def shared_folder() -> Iterator[Path]:
    """A folder standing for the path every node shares: tenants' accounts may pass through
    it (pytest's own temporary folders and the data directory are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="ogai-slurm-shared-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
