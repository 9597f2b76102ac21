"""A kubelet for the fake API server that runs what pods ask for: each container of a pod the
fake scheduler bound starts as a process of this machine (its command and args, its
environment as the kubelet resolves it, its working folder; the image is not pulled: the
command runs in this machine's environment, as a node's image would hold it). Its output
becomes the pod's log as it goes, its exit code the pod's end, and a pod deleted through the
API has its processes killed. So the driver contract suite sees real ranks, logs, exit codes
and cancels on Kubernetes too."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.fakekube.server import FakeKube

POLL_S = 0.1


@dataclass
class _Container:
    process: subprocess.Popen
    output: Path


class Kubelet:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self._running: dict[str, _Container] = {}
        self._stop = threading.Event()
        self._folder = Path(tempfile.mkdtemp(prefix="ogai-kubelet-"))
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for container in self._running.values():
            _kill(container.process)
        self._running.clear()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            for name in self.kube.start_pods():
                self._start(name)
            for name, container in list(self._running.items()):
                self._follow(name, container)

    def _start(self, name: str) -> None:
        pod = self.kube.get("Pod", name)
        spec = pod["spec"]["containers"][0]
        output = self._folder / f"{name}.log"
        with output.open("wb") as sink:
            try:
                process = subprocess.Popen(
                    [*spec.get("command", []), *spec.get("args", [])],
                    env={"PATH": os.environ["PATH"], **self.kube.container_env(name)},
                    cwd=spec.get("workingDir") or None, stdout=sink,
                    stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self.kube.set_logs(name, f"exec failed: {exc}\n")
                self.kube.finish_pod(name, 128, "StartError")
                return
        self._running[name] = _Container(process, output)

    def _follow(self, name: str, container: _Container) -> None:
        if self.kube.get("Pod", name) is None:  # deleted: the kubelet stops its containers
            _kill(container.process)
            del self._running[name]
            return
        code = container.process.poll()
        self.kube.set_logs(name, container.output.read_text(errors="replace"))
        if code is not None:
            del self._running[name]
            self.kube.finish_pod(name, code if code >= 0 else 128 - code)


def _kill(process: subprocess.Popen, grace_s: float = 2.0) -> None:
    """As the kubelet stops a container: SIGTERM, then SIGKILL once the grace period is up."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
