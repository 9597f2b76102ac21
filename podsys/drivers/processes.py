"""Looking at and signalling the processes of local workloads, through /proc where there is one.

A pid alone is not enough to recognise a process after the one that started it is gone: pids
are reused. So the driver records each supervisor's start time (field 22 of /proc/PID/stat) and
a pid only counts as the same process when its start time matches.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")


class ProcInfo(NamedTuple):
    pid: int
    state: str
    pgrp: int
    session: int
    start_time: int


def _parse_stat(pid: int, text: str) -> ProcInfo | None:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return ProcInfo(pid, fields[0], int(fields[2]), int(fields[3]), int(fields[19]))


def read_proc(pid: int) -> ProcInfo | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return _parse_stat(pid, text)


def has_proc() -> bool:
    return (PROC / "self" / "stat").exists()


def start_time(pid: int) -> int | None:
    info = read_proc(pid)
    return info.start_time if info else None


def _signal_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_alive(pid: int, started: int | None) -> bool:
    """Whether `pid` still runs and is the process that started at `started`; a zombie (exited,
    not yet reaped by its parent) does not count."""
    if not has_proc():
        return _signal_alive(pid)
    info = read_proc(pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return started is None or info.start_time == started


def _all_processes() -> list[ProcInfo]:
    found = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None and info.state not in ("Z", "X"):
                found.append(info)
    return found


def _group_is_ours(leader: int, started: int | None, by_pid: dict[int, ProcInfo]) -> bool:
    # While any process still uses `leader` as its group or session id the kernel does not hand
    # the number out again, so only a leader with another start time means "someone else's".
    info = by_pid.get(leader)
    return info is None or started is None or info.start_time == started


def members(leaders: dict[int, int | None]) -> dict[int, list[ProcInfo]]:
    """For each group leader pid (with its recorded start time), the live processes in its
    process group or session: the supervisor, the command and whatever the command started."""
    result: dict[int, list[ProcInfo]] = {leader: [] for leader in leaders}
    if not has_proc():
        for leader in leaders:
            if _group_signal_alive(leader):
                result[leader].append(ProcInfo(leader, "R", leader, leader, 0))
        return result
    processes = _all_processes()
    by_pid = {info.pid: info for info in processes}
    ours = {
        leader for leader, started in leaders.items() if _group_is_ours(leader, started, by_pid)
    }
    for info in processes:
        for key in {info.pgrp, info.session} & ours:
            result[key].append(info)
    return result


def _group_signal_alive(leader: int) -> bool:
    try:
        os.killpg(leader, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(leader: int, found: list[ProcInfo], sig: signal.Signals) -> None:
    """Send `sig` to the process group, and to any member that moved to a group of its own
    inside the session."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for info in found:
        if info.pgrp != leader:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(info.pid, sig)
