"""Where MModel keeps its files under DATA_DIR: each model version is a folder in Hugging Face
layout (config, safetensors weights, tokenizer) of its own, never changed once recorded and
never the user's source folder."""

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from podsys.drivers.base import DataMount

# DATA_DIR and paths relative to it, as YLink keeps them.
from ylink.storage import absolute, data_root, relative
from ylink.storage import content_hash as _content_hash

__all__ = ["absolute", "artifact_folder", "content_hash", "data_mounts", "data_root",
           "file_list", "relative", "remove", "staging_folder", "version_files",
           "version_folder"]


def staging_folder() -> Path:
    """A fresh folder for files not yet recorded; removed on failure, renamed on success."""
    folder = data_root() / "models" / ".staging" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    return folder


def artifact_folder(version) -> Path:
    """A recorded version's files (its artifact_path is relative to DATA_DIR, or absolute)."""
    return absolute(version.artifact_path)


def version_folder(*, tenant: str, model_id: int, model: str, number: int,
                   content_hash: str) -> Path:
    return (data_root() / "models" / tenant / f"{model_id}-{model}"
            / f"v{number}-{content_hash[:12]}")


def version_files(folder: Path) -> list[Path]:
    # Links are never followed: a version's files are its own.
    return sorted(p for p in folder.rglob("*") if not p.is_symlink() and p.is_file())


def file_list(folder: Path) -> list[dict]:
    """[{"path", "bytes"}] of the version's files, by path."""
    return [{"path": str(path.relative_to(folder)), "bytes": path.stat().st_size}
            for path in version_files(folder)]


def content_hash(folder: Path) -> str:
    """SHA-256 over the files' paths (relative to the folder) and contents, in path order."""
    return _content_hash(version_files(folder), folder)


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def data_mounts(read: Iterable[Path | str | None], write: Iterable[Path | str | None] = ()
                ) -> list[DataMount]:
    """The folders of the data directory a job reads (and writes) as its mounts, each once;
    folders outside the data directory (a version recorded at an absolute path elsewhere) are
    not the data directory's to hand out and are left out. Paths are compared as written
    (`..` removed), links not followed: a folder a Slurm run moved to its cluster's shared
    path is still the data directory's, and each driver decides how it binds a link."""
    root = Path(os.path.normpath(data_root().absolute()))
    mounts: dict[str, DataMount] = {}
    for paths, read_only in ((write, False), (read, True)):
        for path in paths:
            if path is None:
                continue
            folder = Path(os.path.normpath(Path(path).absolute()))
            if root in folder.parents and str(folder) not in mounts:
                mounts[str(folder)] = DataMount(str(folder), read_only=read_only)
    return list(mounts.values())
