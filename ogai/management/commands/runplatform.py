"""Run the whole platform in the foreground: web server, Celery worker and Celery beat.

Each child runs in its own session so a terminal's Ctrl-C reaches only this supervisor, which
then stops the children in order (SIGTERM, SIGKILL after a grace period) and waits for them. If
any child dies, the others are stopped too and the command exits non-zero: nothing is left behind.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ogai.celery import QUEUES

GRACE_SECONDS = 15


class Command(BaseCommand):
    help = "Start the web server, a Celery worker and Celery beat; Ctrl-C stops all three."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("OGAI_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("OGAI_PORT", "8000")))
        parser.add_argument(
            "--concurrency", type=int, default=int(os.environ.get("OGAI_WORKER_CONCURRENCY", "2"))
        )

    def handle(self, *args, host, port, concurrency, **options):
        python = sys.executable
        data_dir = settings.DATA_DIR
        children = {
            "web": [
                python, "-m", "uvicorn", "ogai.asgi:application", "--host", host,
                "--port", str(port), "--no-access-log", "--timeout-graceful-shutdown", "5",
            ],
            "worker": [
                python, "-m", "celery", "-A", "ogai", "worker", "--loglevel", "INFO",
                "--queues", ",".join(QUEUES), "--concurrency", str(concurrency),
                "--hostname", f"ogai@{os.uname().nodename}",
            ],
            "beat": [
                python, "-m", "celery", "-A", "ogai", "beat", "--loglevel", "INFO",
                "--schedule", str(data_dir / "celerybeat-schedule"),
                "--pidfile", "",
            ],
        }
        stopping = False

        def request_stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)

        processes: dict[str, subprocess.Popen] = {}
        for name, command in children.items():
            processes[name] = subprocess.Popen(command, start_new_session=True)  # noqa: S603
        self.stdout.write(
            f"OGAI is starting at http://{host}:{port}/ (data in {data_dir}); Ctrl-C stops it."
        )

        failed = None
        while not stopping:
            for name, process in processes.items():
                if process.poll() is not None:
                    failed = f"{name} exited with status {process.returncode}"
                    stopping = True
                    break
            time.sleep(0.2)

        self.stdout.write("Stopping OGAI…")
        self._stop(processes)
        if failed:
            raise CommandError(f"OGAI stopped because the {failed}.")
        self.stdout.write("OGAI stopped.")

    def _stop(self, processes: dict[str, subprocess.Popen]) -> None:
        # The leaders shut down their own children (a worker drains its pool); the group is
        # killed only if something is still there after the grace period.
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + GRACE_SECONDS
        for process in processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in processes.values():
            # The group may hold children that outlived their parent (a worker's pool).
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            process.wait()
