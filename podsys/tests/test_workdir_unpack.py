"""Unpacking a job's working folder: files and folders land in the run folder; nothing else
is made, and nothing outside it, whatever the archive holds."""

import gzip
import io
import stat
import tarfile

import pytest

from podsys.drivers.base import DriverError
from podsys.drivers.workdir_unpack import workdir_unpack


def _archive(path, members):
    """Write a gzip tar of `members`: (name, bytes or None for a folder, extra TarInfo attrs)."""
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w") as tar:
        for name, data, attrs in members:
            info = tarfile.TarInfo(name)
            if data is None and "type" not in attrs:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif data is not None:
                info.size, info.mode = len(data), 0o644
            for key, value in attrs.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(raw.getvalue())
    return path


def test_files_and_folders_are_unpacked_into_the_folder(tmp_path):
    archive = _archive(tmp_path / "w.tar.gz", [
        ("src", None, {}), ("src/train.py", b"print('hi')\n", {}),
        ("run.sh", b"#!/bin/sh\n", {"mode": 0o4755}), ("empty", None, {}),
    ])
    dest = tmp_path / "run"
    workdir_unpack(archive, dest)
    assert (dest / "src" / "train.py").read_text() == "print('hi')\n"
    assert (dest / "empty").is_dir()
    mode = stat.S_IMODE((dest / "run.sh").stat().st_mode)
    assert mode & stat.S_ISUID == 0  # no set-uid programs, whatever the archive says
    assert mode & stat.S_IXUSR


@pytest.mark.parametrize(("members", "words"), [
    ([("../escape.py", b"x", {})], "outside"),
    ([("/etc/ogai-absolute.py", b"x", {})], "absolute"),
    ([("link", None, {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})], "link"),
    ([("a.py", b"x", {}), ("hard", None, {"type": tarfile.LNKTYPE, "linkname": "a.py"})],
     "neither a file nor a folder"),
    ([("fifo", None, {"type": tarfile.FIFOTYPE})], "special"),
], ids=["dotdot", "absolute", "symlink", "hardlink", "fifo"])
def test_anything_else_is_refused(tmp_path, members, words):
    archive = _archive(tmp_path / "w.tar.gz", members)
    dest = tmp_path / "deep" / "run"
    with pytest.raises(DriverError) as refused:
        workdir_unpack(archive, dest)
    assert words in str(refused.value)
    assert not (tmp_path / "deep" / "escape.py").exists()
    assert not (dest / "link").is_symlink()
    assert not (dest / "hard").exists()
    assert not (dest / "fifo").exists()


def test_a_missing_or_damaged_archive_is_a_driver_error(tmp_path):
    with pytest.raises(DriverError, match="missing"):
        workdir_unpack(tmp_path / "gone.tar.gz", tmp_path / "run")
    damaged = tmp_path / "bad.tar.gz"
    damaged.write_bytes(b"not an archive")
    with pytest.raises(DriverError, match="could not unpack"):
        workdir_unpack(damaged, tmp_path / "run")
