"""The processes a job runs on this machine: found by the job id the local driver sets, or
(a Ray cluster's daemons) by the ports its state names."""

import os
from pathlib import Path


def job_processes(job_id: int) -> list[int]:
    """Live (not zombie) processes whose environment carries OGAI_JOB_ID=job_id."""
    marker = f"OGAI_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def ray_processes(driver, handle: str) -> list[str]:
    """The Ray daemons (gcs_server, raylet) of a local driver's Ray workload still running:
    those listening on its ports."""
    state = driver._load(handle)
    assert state and state["ray"]
    marks = [f"--gcs_server_port={state['ray']['head']['gcs']}"] + [
        f"--node_manager_port={node['node_manager']}" for node in state["ray"]["nodes"]]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(mark in cmdline for mark in marks) and ("raylet" in cmdline
                                                      or "gcs_server" in cmdline):
            found.append(f"{pid}: {cmdline[:120]}")
    return found
