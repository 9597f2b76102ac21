"""A model server started as a replica runs it (its runner module, behind the deployment's
key), on a free port of this machine, for tests that talk to a real one."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


@contextlib.contextmanager
def replica_server(module: str, args: list[str], *, key: str, logs: Path,
                   timeout: float = 120.0):
    """`python -m module *args --host 127.0.0.1 --port PORT` with the key in its environment;
    yields its URL once /health answers, and stops it after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_path = logs / f"{module.rsplit('.', 1)[-1]}.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
             "OGAI_REPLICA_API_KEY": key},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{module} did not start:\n" + log_path.read_text())
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
