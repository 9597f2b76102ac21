"""Runs one replica of a local workload and records its exit code.

    python -m podsys.drivers.local_supervisor --exit-file F --log L [--sandboxed --fds 3,4]
        -- COMMAND...

The local driver starts this as the leader of a new process group. It starts COMMAND as its
child in the same group (so a signal to the group reaches the command), waits, and writes the
child's exit code to F atomically (negative signal number when a signal killed it), so the code
survives the death of the process that launched the workload. Standard library only: it starts
once per replica and must start fast.

With `--sandboxed`, COMMAND is a bwrap command line (`podsys.drivers.sandbox`): it gets the
descriptors in `--fds` (the folders it binds), SIGTERM and SIGINT ignored (bwrap must outlive a
cancel's SIGTERM to report how its command ended; the command gets them back inside), and its
exit code back in the supervisor's convention.

SIGTERM or SIGINT to the supervisor: when the driver cancels (it writes its `cancelled` marker
first, then signals the whole group and kills it after its grace) the command has the signal
already and the supervisor only waits to record how it ended. Sent to the supervisor alone (a
person's `kill`, a platform stopping), it is forwarded to the group, and what is still there
after `STOP_GRACE_S` is killed: the supervisor records the exit code and never outlives its
command, so nothing is left running without it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The shell's convention for a command that cannot be found or executed.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# Written by the local driver's cancel before it signals the group (`local.CANCELLED_FILE`).
CANCELLED_FILE = "cancelled"
# How long a command has to end after a forwarded signal before its group is killed (the
# local driver's default grace; a workload may ask for another in OGAI_STOP_GRACE_S).
STOP_GRACE_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing. Not SIG_IGN: an ignored signal stays ignored across exec,
    so the command would inherit it; a handler is reset to the default by exec."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m podsys.drivers.local_supervisor")
    parser.add_argument("--exit-file", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--sandboxed", action="store_true")
    parser.add_argument("--fds", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given after --")
    return args


def write_exit_code(path: Path, code: int) -> None:
    """Write then rename, so a reader sees either no file or the whole code."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        handle.write(f"{code}\n")
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def group_members() -> list[int]:
    """The other live processes of this process's group (the command and what it started,
    inside a sandbox too: a pid namespace keeps the group), from /proc."""
    own, found = os.getpgrp(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == own:
            found.append(int(entry.name))
    return found


class Stopper:
    """What a stop signal does to the supervisor: nothing during a cancel (the driver signals
    the group), else forward it to the group and set a deadline after which it is killed."""

    def __init__(self, cancelled_marker: Path, grace_s: float = STOP_GRACE_S) -> None:
        self.cancelled_marker = cancelled_marker
        self.grace_s = grace_s
        self.child: subprocess.Popen[bytes] | None = None
        self.kill_at: float | None = None
        self._echoes: dict[int, int] = {}  # our own forwarded signals coming back to us

    def __call__(self, signum: int, frame: object) -> None:
        if self._echoes.get(signum):
            self._echoes[signum] -= 1
            return
        if self.child is None or self.cancelled_marker.exists():
            return
        if os.getpgrp() == os.getpid():
            self._echoes[signum] = self._echoes.get(signum, 0) + 1
            with contextlib.suppress(OSError):
                os.killpg(os.getpgrp(), signum)
        else:
            with contextlib.suppress(OSError):
                os.kill(self.child.pid, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s

    def wait(self, child: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                return child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                for pid in [child.pid, *group_members()]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                self.kill_at = None  # once; the command is going


def run_command(command: list[str], log: Path, fds: tuple[int, ...] = (),
                stopper: Stopper | None = None, on_started=None) -> int:
    with log.open("ab") as out:
        try:
            child = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=fds
            )
        except OSError as exc:
            out.write(f"ogai: cannot run {command[0]!r}: {exc.strerror}\n".encode())
            missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
            return EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE
        if on_started is not None:
            on_started()
        if stopper is None:
            return child.wait()
        stopper.child = child
        return stopper.wait(child)


def stop_stragglers() -> None:
    """The command has exited: ask what it left behind in the group (data-loader workers,
    daemons) to stop too, so they do not hold GPUs that the driver now hands out again."""
    if os.getpgrp() != os.getpid():
        return  # not started as a group leader: the group is not ours to signal
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # The group gets SIGTERM on cancel: the command should see it, this process must live on
    # to record how the command ended.
    try:
        grace_s = float(os.environ.get("OGAI_STOP_GRACE_S", STOP_GRACE_S))
    except ValueError:
        grace_s = STOP_GRACE_S
    stopper = Stopper(args.exit_file.parent / CANCELLED_FILE, grace_s)
    for signum in STOP_SIGNALS:
        # Sandboxed, bwrap inherits them ignored (its command resets them): bwrap itself must
        # not die of them. Once it runs, the supervisor's own handler takes over.
        signal.signal(signum, signal.SIG_IGN if args.sandboxed else _ignore)

    def handle_stops() -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, stopper)

    fds = tuple(int(fd) for fd in args.fds.split(",") if fd)
    code = run_command(args.command, args.log, fds, stopper, on_started=handle_stops)
    if args.sandboxed and 128 < code <= 128 + 64:
        code = 128 - code  # bwrap says 128 + N for a command killed by signal N
    write_exit_code(args.exit_file, code)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _ignore)  # the stragglers' SIGTERM reaches this process too
    stop_stragglers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
