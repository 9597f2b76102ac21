"""Starting the platform as a user does (`make run`) and finding the processes it leaves."""

import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_using(data_dir: Path) -> list[int]:
    """PIDs of live processes whose environment names this data directory, or a folder inside
    it (a sandboxed job's run and checkpoint folders: it is not given the directory itself)."""
    markers = (f"={data_dir}".encode(), f"={data_dir}/".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if state == "Z":
            continue
        for variable in environ.split(b"\0"):
            if variable.endswith(markers[0]) or markers[1] in variable:
                found.append(int(entry.name))
                break
    return found
