"""Unpacking a job's working-folder archive into its run folder.

A minimal version so the local driver and its tests run; the working-folder helper's module of
the same name (the full checks) replaces it at merge. tarfile's "data" filter refuses absolute
names, `..`, links out of the folder, devices, and drops set-id bits.
"""

from __future__ import annotations

import tarfile
from pathlib import Path


def workdir_unpack(archive_path: str | Path, dest: str | Path) -> None:
    with tarfile.open(archive_path, "r:gz") as archive:
        archive.extractall(dest, filter="data")
