"""The processes a job runs on this machine, found by the job id the local driver sets."""

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
