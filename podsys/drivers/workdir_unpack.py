"""Unpacking a job's working folder (`Workload.workdir_archive`) into its run folder.

The platform checked the archive when it was uploaded (files and folders only, nothing outside
the folder); it is unpacked here with tarfile's `data` filter all the same, and anything but a
file or a folder is refused, so an archive that reached the disk some other way still cannot
write outside `dest`, make links, devices or set-uid programs.
"""

import tarfile
import zlib
from pathlib import Path

from podsys.drivers.base import DriverError


def _files_and_folders(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    if member.name.startswith("/"):  # the data filter would only strip the slash
        raise tarfile.FilterError(f"{member.name!r} is an absolute path")
    member = tarfile.data_filter(member, dest)
    if not (member.isreg() or member.isdir()):
        raise tarfile.FilterError(f"{member.name!r} is neither a file nor a folder")
    return member


def workdir_unpack(path: str | Path, dest: str | Path) -> None:
    """Unpack the gzip tar at `path` into the folder `dest` (made if missing). DriverError,
    saying why, when it cannot be: what was unpacked before the problem stays, and the caller
    fails the attempt."""
    dest = Path(dest)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, mode="r:gz") as archive:
            archive.extractall(dest, filter=_files_and_folders)  # noqa: S202 (filtered)
    except FileNotFoundError as exc:
        raise DriverError(f"the working folder's archive {path} is missing: {exc}") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise DriverError(f"could not unpack the working folder's archive {path} into "
                          f"{dest}: {exc}") from None
