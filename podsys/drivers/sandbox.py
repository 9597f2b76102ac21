"""The sandbox a tenant's replica runs in on the `local` driver.

Each replica runs under bubblewrap (`bwrap`, Debian's `bubblewrap`) started by the platform as
root: its own PID, IPC, UTS and cgroup namespaces and its own mount namespace, in which the
system, the Python environment and the platform's own packages are read-only, the folders the
workload names (its run folder, its checkpoint folder, the datasets and models it reads) are
bound in, `/tmp` and `/dev/shm` are private, and `/dev` holds only the GPUs it was given. The
network is the host's: jobs reach the platform's API, and the replicas of a gang reach each
other. Inside, `setpriv` drops to the tenant's own unprivileged uid with no capabilities and
no way to gain any, and `env --default-signal` gives the command the default SIGTERM the
supervisor had to ignore (so that bwrap outlives a cancel's SIGTERM and reports how the
command ended).

Folders of the data directory are opened here one component at a time without following
symbolic links and handed to bwrap as file descriptors: a tenant who planted a link in a
folder it once wrote (a training run's output, read by the next fine-tune) cannot turn a bind
into a view of someone else's files.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SETPRIV = "/usr/bin/setpriv"
ENV = "/usr/bin/env"
# The system, read-only (/sys too: NCCL and NVML read the PCI topology there). Merged-/usr
# systems have /bin, /lib… as links into /usr.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# What programs need of /etc (names, TLS roots, the dynamic linker's cache, time zones), and
# nothing else of it: a host's /etc may hold credentials that are readable by everyone.
ETC_ENTRIES = (
    "hosts", "host.conf", "resolv.conf", "nsswitch.conf", "gai.conf", "services", "protocols",
    "ssl", "ca-certificates", "ca-certificates.conf", "pki", "crypto-policies", "localtime",
    "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "os-release",
    "mime.types", "fonts", "nvidia", "OpenCL", "vulkan", "machine-id",
)
# The platform's own packages: its runners (`python -m ylink.runners.train`) import them.
PLATFORM_PACKAGES = (
    "ogai", "infra_os", "podsys", "aistation", "ylink", "mmodel", "frontend", "ogai_client",
)
# Device files every process using a GPU needs besides its GPUs' own `/dev/nvidia<minor>`.
GPU_CONTROL_DEVICES = (
    "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps",
)
PROBE_TIMEOUT_S = 10.0


class SandboxError(Exception):
    """The sandbox cannot be made for this workload; the message is for people."""


@dataclass
class Sandbox:
    """Everything one replica's bwrap command line needs. `fds` are the open folders it binds
    (to be passed to the process that runs bwrap), closed by `close()`."""

    uid: int
    cwd: str
    system: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # destination -> host file, read-only
    binds: list[tuple[int, str, bool]] = field(default_factory=list)  # fd, path, read-only

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _path, _ro in self.binds)

    def bind(self, path: str, *, read_only: bool) -> None:
        self.binds.append((open_folder(path), path, read_only))

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                continue
        self.binds.clear()

    def argv(self, bwrap: str, command: Iterable[str]) -> list[str]:
        # The sandbox's own /tmp and /dev/shm: fresh, empty, private.
        private = ["/tmp", "/dev/shm"]  # noqa: S108
        args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--proc", "/proc", "--dev", "/dev"]
        for path in private:
            args += ["--perms", "1777", "--tmpfs", path]
        for folder in self._parents():
            # bwrap makes missing parents root's alone (0700): the tenant could not pass them.
            args += ["--perms", "0755", "--dir", folder]
        for path in self.system:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            else:
                args += ["--ro-bind", path, path]
        for dest, source in sorted(self.files.items()):
            args += ["--ro-bind", source, dest]
        for fd, path, read_only in self.binds:
            args += ["--ro-bind-fd" if read_only else "--bind-fd", str(fd), path]
        for device in self.devices:
            args += ["--dev-bind", device, device]
        args += ["--chdir", self.cwd, "--",
                 SETPRIV, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                 ENV, "--default-signal=TERM,INT", "--", *command]
        return args


    def _parents(self) -> list[str]:
        """The folders above every mount point that no mount provides."""
        targets = [*self.system, *self.files, *(path for _fd, path, _ro in self.binds),
                   *self.devices]
        mounted = {*self.system, "/proc", "/dev"}
        parents: set[str] = set()
        for target in targets:
            for parent in Path(target).parents:
                text = str(parent)
                if text == "/" or any(text == m or text.startswith(m + "/") for m in mounted):
                    continue
                parents.add(text)
        return sorted(parents, key=lambda path: (path.count("/"), path))


def open_folder(path: str) -> int:
    """An O_PATH descriptor of the folder `path`, reached from / one component at a time
    without following any symbolic link; SandboxError when it is missing or not plain."""
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise SandboxError(f"{path!r} is not an absolute, normalised path")
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        for part in Path(path).parts[1:]:
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                raise SandboxError(f"cannot open {path} without following links: "
                                   f"{exc.strerror} at {part!r}") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def environment_root(executable: str) -> str | None:
    """The Python environment (a venv or a conda prefix) that holds `executable`, or None.
    Only an environment: the command is the tenant's to choose, and naming a program must never
    show the folder around it (someone's ~/.ssh)."""
    if not os.path.isabs(executable):
        return None
    folder = Path(os.path.normpath(executable)).parent
    for candidate in (folder, folder.parent):
        if (candidate / "pyvenv.cfg").is_file() or (candidate / "conda-meta").is_dir():
            return str(candidate)
    return None


def venv_home(root: str) -> str | None:
    """The base installation a venv's interpreter links to (`home` in its pyvenv.cfg)."""
    try:
        lines = (Path(root) / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return str(Path(value.strip()).resolve().parent)
    return None


@functools.cache
def platform_paths() -> tuple[str, ...]:
    """The platform's interpreter and environment, and its packages' folders (for an editable
    install, the source tree has much else beside them: only the packages are shown)."""
    paths = {str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())}
    for name in PLATFORM_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            paths.add(str(Path(location).resolve()))
    return tuple(sorted(paths))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def readonly_paths(command: tuple[str, ...], *, hidden: Iterable[Path],
                   extra: Iterable[str] = ()) -> list[str]:
    """What the sandbox shows read-only: the system, the platform's environment, the Python
    environment of the command's program when it names one by path (unless it lies in a hidden
    folder: then the workload's own mounts show it, or nothing does), and the operator's
    `extra`. SandboxError when one of them and a hidden folder (the data directory) overlap."""
    hidden = [Path(folder).resolve() for folder in hidden]
    paths = [path for path in SYSTEM_PATHS if os.path.lexists(path)]
    paths += [f"/etc/{entry}" for entry in ETC_ENTRIES if os.path.exists(f"/etc/{entry}")]
    paths += platform_paths()
    root = environment_root(command[0]) if command else None
    for found in (root, venv_home(root) if root else None):
        if found and not any(_inside(Path(found).resolve(), folder) for folder in hidden):
            paths.append(found)
    paths += [str(Path(path).resolve()) for path in extra]
    for path in paths:
        if os.path.islink(path):
            continue
        for folder in hidden:
            if _inside(folder, Path(path)) or _inside(Path(path), folder):
                raise SandboxError(f"{path} and the platform's folder {folder} overlap: the "
                                   "sandbox cannot show one without the other; move one")
    return list(dict.fromkeys(paths))


def gpu_devices(minors: Iterable[int], device_dir: str = "/dev") -> list[str]:
    """The device files of the GPUs with these minor numbers, and the control devices, that
    exist on this machine."""
    wanted = [f"nvidia{minor}" for minor in minors]
    if not wanted:
        return []
    names = [*wanted, *GPU_CONTROL_DEVICES]
    return [str(Path(device_dir) / name) for name in names
            if os.path.exists(Path(device_dir) / name)]


def rdma_devices(device_dir: str = "/dev/infiniband") -> list[str]:
    """The RDMA device files (uverbs*, rdma_cm, umad*, issm*) a job holding RDMA devices needs:
    the verbs API opens them. A local job shares the host's HCAs; the scheduler counts them."""
    folder = Path(device_dir)
    try:
        return sorted(str(entry) for entry in folder.iterdir() if not entry.is_dir())
    except OSError:
        return []


def passwd_lines(uid: int, user: str, home: str) -> tuple[str, str]:
    """/etc/passwd and /etc/group for the sandbox: root, nobody and the tenant's user, so
    programs that look their user up (getpass, torch's caches, ssh) find one."""
    passwd = (f"root:x:0:0:root:/root:/bin/sh\n"
              f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
              f"{user}:x:{uid}:{uid}:{user}:{home}:/bin/sh\n")
    group = f"root:x:0:\nnogroup:x:65534:\n{user}:x:{uid}:\n"
    return passwd, group


def probe(bwrap: str) -> str | None:
    """Why tenants' work cannot be sandboxed here, or None when it can: the platform must run
    as root (to run each tenant as its own user) and bwrap and setpriv must work."""
    if os.geteuid() != 0:
        return ("the platform does not run as root, so it cannot run each tenant's processes "
                "as that tenant's own user")
    found = shutil.which(bwrap)
    if found is None:
        return f"bubblewrap ({bwrap}) is not installed: apt-get install bubblewrap"
    for tool in (SETPRIV, ENV):
        if not os.access(tool, os.X_OK):
            return f"{tool} is missing (util-linux, coreutils)"
    sandbox = Sandbox(uid=65534, cwd="/", system=[p for p in SYSTEM_PATHS if os.path.lexists(p)])
    try:
        done = subprocess.run(  # noqa: S603 - an argument list, never a shell
            sandbox.argv(found, ["true"]), capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"bubblewrap could not make a sandbox here: {said}"
    return None

