"""Redfish servers for tests and benchmarks, all on 127.0.0.1 and a free port.

* `RedfishEmulator`: sushy-tools' `sushy-emulator --fake`, many fake systems in one process
  (power changes land 1-11 s after the request; virtual-media insert really downloads the image).
* `StaticRedfish`: `sushy-static` serving the mockup in `tests/redfish/mockup/` — one GPU server
  with the sections the fake driver lacks (processors and GPUs, memory, storage, a console).
  It answers POST and PATCH with 204 and changes nothing.
* `ImageServer`: serves one small generated "ISO" over HTTP, for virtual media.
* `GarbageServer`: a "BMC" that answers 200 with HTML on every path.

Each is a context manager (`with RedfishEmulator(4) as emu: ...`) or `start()`/`stop()` by hand.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from infra_os.drivers.base import BmcAccess

MOCKUP_DIR = Path(__file__).resolve().parent / "mockup"
STATIC_SYSTEM_ID = "1"  # the one system of the mockup
STATIC_PASSWORD = "static-bmc-secret"  # sushy-static takes any


# Straight to 127.0.0.1, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on (at the moment of asking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGTERM when the test process dies, even by SIGKILL. (The kernel
    ties this to the starting *thread*: start servers from a thread that outlives them.)"""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Process:
    """A server subprocess: started, waited for, stopped and reaped."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._dir: Path | None = None  # the server's own files, removed when it stops

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        self._terminate()
        directory, self._dir = self._dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, argv: list[str], *, env: dict[str, str], log_path: Path | None) -> None:
        self._log_path = log_path
        out: Any = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            if log_path:
                out.close()

    def _log_tail(self) -> str:
        if not self._log_path or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")[-2000:]

    def _launch(
        self,
        argv_for_port: Callable[[int], list[str]],
        *,
        env: dict[str, str],
        log_path: Path | None,
        probe: str,
        headers: dict[str, str],
        timeout_s: float,
    ) -> None:
        """Start on a free port and wait until `probe` answers 200; another port if the one
        picked was taken in the meantime."""
        for attempt in range(3):
            self.port = free_port()
            self._spawn(argv_for_port(self.port), env=env, log_path=log_path)
            try:
                self._wait_ready(probe, headers, timeout_s)
                return
            except RuntimeError as exc:
                if attempt == 2 or "Address already in use" not in str(exc):
                    raise

    def _wait_ready(self, probe: str, headers: dict[str, str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                name, code = type(self).__name__, self._proc.returncode
                raise RuntimeError(f"{name} exited with {code}:\n{self._log_tail()}")
            try:
                request = urllib.request.Request(self.url + probe, headers=headers)
                with _OPENER.open(request, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self._terminate()
                raise RuntimeError(
                    f"{type(self).__name__} did not answer {probe} within {timeout_s:g} s:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.1)

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@dataclass(frozen=True)
class EmulatedSystem:
    uuid: str
    name: str
    macs: tuple[str, ...]


class RedfishEmulator(_Process):
    """`sushy-emulator --fake` with `systems` fake systems, all powered off.

    Each start gets a fresh state directory (the emulator keeps power state, boot device and
    virtual media in SQLite there). With `username`/`password` every request but the service
    root needs HTTP Basic auth (an htpasswd file with a cheap bcrypt cost, since the emulator
    checks it on every request).

    `url`, `systems`, `claim(n)` (hand out systems no other test of the module took),
    `access(system)` (a `BmcAccess` for the driver), and straight reads from the emulator for
    tests that play the server: `get(path)`, `system_json(uuid)`, `power_state(uuid)`,
    `virtual_media(uuid)`.
    """

    def __init__(
        self,
        systems: int = 4,
        *,
        username: str = "",
        password: str = "",
        name_prefix: str = "node",
        startup_timeout_s: float = 30,
    ):
        super().__init__()
        if systems < 1:
            raise ValueError("the emulator needs at least one system")
        if bool(username) != bool(password):
            raise ValueError("give both username and password, or neither")
        self.username = username
        self.password = password
        self.startup_timeout_s = startup_timeout_s
        self.systems: list[EmulatedSystem] = []
        for index in range(systems):
            system_uuid = str(uuid.uuid4())
            raw = bytes.fromhex(system_uuid.replace("-", ""))
            # Locally administered MACs, unique per system: 02:<4 bytes of the uuid>:<nic>.
            macs = tuple(
                "02:" + ":".join(f"{b:02x}" for b in raw[:4]) + f":{nic:02x}"
                for nic in range(1, 3 if index % 2 == 0 else 2)
            )
            self.systems.append(
                EmulatedSystem(uuid=system_uuid, name=f"{name_prefix}-{index:03d}", macs=macs)
            )
        self._claimed = 0
        self._claim_lock = threading.Lock()

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> RedfishEmulator:
        if self._proc is not None:
            return self
        self._dir = Path(tempfile.mkdtemp(prefix="ogai-redfish-"))
        fake_systems = [
            {
                "uuid": s.uuid,
                "name": s.name,
                "power_state": "Off",
                "external_notifier": False,
                "nics": [{"mac": mac} for mac in s.macs],
            }
            for s in self.systems
        ]
        lines = [
            "SUSHY_EMULATOR_FAKE_DRIVER = True",
            f"SUSHY_EMULATOR_STATE_DIR = {str(self._dir / 'state')!r}",
            "SUSHY_EMULATOR_FEATURE_SET = 'full'",
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake_systems!r}",
        ]
        if self.username:
            import bcrypt

            hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
            auth_file = self._dir / "htpasswd"
            auth_file.write_text(f"{self.username}:{hashed}\n")
            lines.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(auth_file)!r}")
        config = self._dir / "emulator.conf"
        config.write_text("\n".join(lines) + "\n")

        env = {
            **os.environ,
            "SUSHY_EMULATOR_CONFIG": str(config),
            "TMPDIR": str(self._dir),  # where it puts the images it downloads
        }
        argv = [sys.executable, "-m", "sushy_tools.emulator.main", "--fake"]
        argv += ["--config", str(config), "-i", "127.0.0.1", "-p"]
        try:
            self._launch(
                lambda port: [*argv, str(port)],
                env=env,
                log_path=self._dir / "emulator.log",
                probe="/redfish/v1/Systems",
                headers=self._auth_headers(),
                timeout_s=self.startup_timeout_s,
            )
        except BaseException:
            self.stop()
            raise
        return self

    # ---- for tests ----------------------------------------------------------------------------

    def claim(self, count: int = 1) -> list[EmulatedSystem]:
        """`count` systems no earlier `claim` handed out (tests sharing one emulator stay apart)."""
        with self._claim_lock:
            if self._claimed + count > len(self.systems):
                raise RuntimeError(
                    f"the emulator has {len(self.systems)} systems and {self._claimed} are "
                    f"claimed; {count} more asked for"
                )
            taken = self.systems[self._claimed : self._claimed + count]
            self._claimed += count
            return taken

    def access(self, system: EmulatedSystem | str, *, password: str | None = None) -> BmcAccess:
        """Where the driver finds `system` (an `EmulatedSystem` or a uuid) on this emulator."""
        system_id = system.uuid if isinstance(system, EmulatedSystem) else system
        return BmcAccess(
            address=self.url,
            username=self.username,
            password=self.password if password is None else password,
            system_id=system_id,
            verify_tls=False,
        )

    def _auth_headers(self) -> dict[str, str]:
        if not self.username:
            return {}
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def get(self, path: str) -> dict[str, Any]:
        """GET a Redfish path (e.g. `/redfish/v1/Systems`) straight from the emulator."""
        request = urllib.request.Request(self.url + path, headers=self._auth_headers())
        with _OPENER.open(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    def system_json(self, system_uuid: str) -> dict[str, Any]:
        return self.get(f"/redfish/v1/Systems/{system_uuid}")

    def power_state(self, system_uuid: str) -> str:
        """ "On" or "Off" as the emulator has it now (a pending change lands on this read once
        its time has come)."""
        return str(self.system_json(system_uuid)["PowerState"])

    def virtual_media(self, system_uuid: str, device: str = "Cd") -> dict[str, Any]:
        return self.get(f"/redfish/v1/Systems/{system_uuid}/VirtualMedia/{device}")


class StaticRedfish(_Process):
    """`sushy-static` serving `mockup` (default: the GPU server in tests/redfish/mockup/).

    No authentication: any credentials are accepted. Its only system has id "1". POST and PATCH
    change nothing, but `bodies()` returns the JSON bodies sent so far, oldest first, so a test
    can see what the driver asked for."""

    system_id = STATIC_SYSTEM_ID

    def __init__(self, mockup: Path = MOCKUP_DIR, *, startup_timeout_s: float = 20):
        super().__init__()
        self.mockup = Path(mockup)
        self.startup_timeout_s = startup_timeout_s

    def start(self) -> StaticRedfish:
        if self._proc is not None:
            return self
        self._dir = Path(tempfile.mkdtemp(prefix="ogai-redfish-static-"))
        argv = [sys.executable, "-m", "sushy_tools.static.main", "-i", "127.0.0.1"]
        argv += ["-m", str(self.mockup), "-p"]
        # It prints every request's headers and body; the log lives in a private temp dir
        # (mode 0700) that `stop` deletes, since the headers include Authorization.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            self._launch(
                lambda port: [*argv, str(port)],
                env=env,
                log_path=self._dir / "static.log",
                probe="/redfish/v1/",
                headers={},
                timeout_s=self.startup_timeout_s,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def access(self, *, username: str = "admin", password: str = STATIC_PASSWORD) -> BmcAccess:
        """Any credentials do; these stand in for real ones (e.g. in leak checks)."""
        return BmcAccess(address=self.url, username=username, password=password)

    def bodies(self) -> list[Any]:
        """The JSON bodies of the POST/PATCH requests so far (None for an empty POST)."""
        if self._log_path is None or not self._log_path.exists():
            return []
        found: list[Any] = []
        for line in self._log_path.read_text(errors="replace").splitlines():
            if line.startswith("Data: "):
                raw = ast.literal_eval(line[len("Data: ") :])
                found.append(json.loads(raw) if raw else None)
        return found


class _ThreadedServer:
    """An in-process HTTP server on 127.0.0.1 in a daemon thread."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Any:
        if self._server is None:
            server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
            server.daemon_threads = True
            server.owner = self  # type: ignore[attr-defined]
            self._server = server
            self.port = int(server.server_address[1])
            self._thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ImageHandler(_QuietHandler):
    def do_GET(self) -> None:
        owner: ImageServer = self.server.owner  # type: ignore[attr-defined]
        if self.path.split("?")[0] != "/" + owner.filename:
            self.send_error(404)
            return
        with owner._lock:
            owner.downloads += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(owner.content)))
        self.end_headers()
        self.wfile.write(owner.content)


class ImageServer(_ThreadedServer):
    """Serves one small generated boot image at `url`; `downloads` counts complete GETs."""

    handler = _ImageHandler

    def __init__(self, filename: str = "ogai-installer.iso", size: int = 64 * 1024):
        super().__init__()
        self.filename = filename
        self.content = (b"OGAI test boot image\n" * (size // 21 + 1))[:size]
        self.downloads = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"{self.base_url}/{self.filename}"

    def __enter__(self) -> ImageServer:
        return self.start()  # type: ignore[no-any-return]


class _GarbageHandler(_QuietHandler):
    BODY = b"<html><body><h1>Welcome</h1>This is not the BMC you are looking for.</body></html>"

    def _answer(self) -> None:
        owner: GarbageServer = self.server.owner  # type: ignore[attr-defined]
        with owner._lock:
            owner.hits += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer


class GarbageServer(_ThreadedServer):
    """A "BMC" that answers 200 with an HTML page on every path and method; `url`, and `hits`
    counts the requests it answered."""

    handler = _GarbageHandler
    body = _GarbageHandler.BODY

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.base_url

    def __enter__(self) -> GarbageServer:
        return self.start()  # type: ignore[no-any-return]
