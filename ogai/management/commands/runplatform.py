"""Run the whole platform in the foreground: web server, Celery worker and Celery beat.

Each child runs in its own session so a terminal's Ctrl-C reaches only this supervisor, which
then stops the children in order (SIGTERM, SIGKILL after a grace period; a second Ctrl-C cuts
the grace short) and waits for them. Then the work the platform runs on this machine stops too:
each app with a `platform_stop(stdout=)` method on its AppConfig stops its own (aistation stops
the jobs on the local clusters and queues them again). If any child dies, the others are stopped
too and the command exits non-zero: nothing is left behind.

Nor when this process is killed outright (SIGKILL, a closed terminal): a guard process, in a
session of its own, holds the read end of a pipe only this process writes to. When the pipe
closes without this process having said it stopped everything, the guard does it instead.
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ogai.celery import QUEUES

GRACE_SECONDS = 15
# What this process writes to the guard's pipe once everything is stopped.
ALL_STOPPED = b"stopped\n"


class Command(BaseCommand):
    help = "Start the web server, a Celery worker and Celery beat; Ctrl-C stops all three."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("OGAI_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("OGAI_PORT", "8000")))
        parser.add_argument(
            "--concurrency", type=int, default=int(os.environ.get("OGAI_WORKER_CONCURRENCY", "2"))
        )
        # Internal: this command started as the guard of another (the pipe's fd, its children).
        parser.add_argument("--guard-fd", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--guard-children", default="", help=argparse.SUPPRESS)

    def handle(self, *args, host, port, concurrency, guard_fd=None, guard_children="",
               **options):
        if guard_fd is not None:
            self._guard(guard_fd, [int(pid) for pid in guard_children.split(",") if pid])
            return
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
        signals = 0

        def request_stop(signum, frame):
            nonlocal signals
            signals += 1
            if signals == 2:
                self._say("Stopping now: the parts of OGAI still stopping are killed.")

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, request_stop)

        processes: dict[str, subprocess.Popen] = {}
        for name, command in children.items():
            processes[name] = subprocess.Popen(command, start_new_session=True)  # noqa: S603
        guard, guard_pipe = self._start_guard([process.pid for process in processes.values()])
        self._say(
            f"OGAI is starting at http://{host}:{port}/ (data in {data_dir}); Ctrl-C stops it."
        )

        failed = None
        while not signals:
            for name, process in processes.items():
                if process.poll() is not None:
                    failed = f"{name} exited with status {process.returncode}"
                    signals = 1
                    break
            time.sleep(0.2)

        self._say("Stopping OGAI…")
        self._stop(processes, hurry=lambda: signals > 1)
        self._stop_work()
        os.write(guard_pipe, ALL_STOPPED)
        os.close(guard_pipe)
        guard.wait()
        if failed:
            raise CommandError(f"OGAI stopped because the {failed}.")
        self._say("OGAI stopped.")

    def _start_guard(self, children: list[int]) -> tuple[subprocess.Popen, int]:
        read_end, write_end = os.pipe()
        guard = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
            [*_this_command(), "runplatform", "--guard-fd", str(read_end),
             "--guard-children", ",".join(map(str, children))],
            pass_fds=(read_end,), start_new_session=True, stdin=subprocess.DEVNULL,
        )
        os.close(read_end)
        return guard, write_end

    def _guard(self, fd: int, children: list[int]) -> None:
        """Wait for the pipe to close; stop everything unless told it is stopped already."""
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # only the pipe says when
        said = b""
        while chunk := os.read(fd, 64):
            said += chunk
        if said == ALL_STOPPED:
            return
        self._say("OGAI's runplatform ended without stopping; its guard stops OGAI.")
        _stop_groups(children)
        self._stop_work()
        self._say("OGAI stopped.")

    def _say(self, text: str, *, error: bool = False) -> None:
        """Write a line, if the terminal is still there: after it closed (SIGHUP) writes fail
        (EIO), and stopping must go on all the same."""
        with contextlib.suppress(OSError):
            (self.stderr if error else self.stdout).write(text)

    def _stop_work(self) -> None:
        for config in apps.get_app_configs():
            stop = getattr(config, "platform_stop", None)
            if callable(stop):
                try:
                    stop(stdout=self.stdout)
                except Exception as exc:  # the next app's work must stop all the same
                    self._say(f"{config.label}: could not stop its work: {exc}", error=True)

    def _stop(self, processes: dict[str, subprocess.Popen], hurry) -> None:
        # The leaders shut down their own children (a worker drains its pool); the group is
        # killed only if something is still there after the grace period.
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + GRACE_SECONDS
        for process in processes.values():
            while process.poll() is None and time.monotonic() < deadline and not hurry():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.2)
        for process in processes.values():
            # The group may hold children that outlived their parent (a worker's pool).
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            process.wait()


def _this_command() -> list[str]:
    """How this process was started: `python manage.py`, or `python -m django` with settings
    from the environment."""
    if sys.argv and sys.argv[0].endswith(".py") and os.path.isfile(sys.argv[0]):
        return [sys.executable, os.path.abspath(sys.argv[0])]
    return [sys.executable, "-m", "django"]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_groups(leaders: list[int]) -> None:
    """SIGTERM to each process group (web, worker, beat), SIGKILL to what is left after the
    grace. Each leader started a session of its own, so its pid names its group."""
    alive = [pgid for pgid in leaders if _group_alive(pgid)]
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while any(_group_alive(pgid) for pgid in alive) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
