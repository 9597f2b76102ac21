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
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

# The shell's convention for a command that cannot be found or executed.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


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


def run_command(command: list[str], log: Path, fds: tuple[int, ...] = ()) -> int:
    with log.open("ab") as out:
        try:
            child = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=fds
            )
        except OSError as exc:
            out.write(f"ogai: cannot run {command[0]!r}: {exc.strerror}\n".encode())
            missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
            return EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE
        return child.wait()


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
    if args.sandboxed:
        # Inherited by bwrap (its command resets them): bwrap itself must not die of them.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _ignore)
        signal.signal(signal.SIGINT, _ignore)
    fds = tuple(int(fd) for fd in args.fds.split(",") if fd)
    code = run_command(args.command, args.log, fds)
    if args.sandboxed and 128 < code <= 128 + 64:
        code = 128 - code  # bwrap says 128 + N for a command killed by signal N
    write_exit_code(args.exit_file, code)
    stop_stragglers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
