"""Checking a working folder's archive, and making the canonical archive from a zip.

An archive is a gzip-compressed tar of regular files and folders only: no links, devices or
pipes, no absolute names and no `..`, each name once. It is read as a stream, header by header,
and refused at the first problem (`ArchiveError`, in words that say what to fix): the sizes its
headers declare are added up before any file's bytes are decompressed, so an archive that
unpacks past the limit costs no more than the limit to refuse.
"""

import gzip
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

BLOCK = 1 << 20
# A folder of more files than this is data: it goes through datasets (and the file list of a
# working folder is kept whole).
MAX_MEMBERS = 100_000
# What may follow the end-of-archive marker: tar pads to its record size (10 KiB for `tar`).
MAX_TRAILER = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
LIMIT_SETTING = "OGAI_WORKDIR_MAX_MB"
HOW_TO_MAKE = "make it with `tar czf folder.tar.gz -C folder .` (or `ogai job submit`)"


class ArchiveError(ValueError):
    pass


@dataclass
class Listing:
    """What an archive holds: its files ({"path", "size"}, in archive order) and their total."""

    files: list[dict] = field(default_factory=list)
    unpacked_bytes: int = 0


def limit_words(max_bytes: int) -> str:
    return f"the limit of {max_bytes // 2**20} MiB ({LIMIT_SETTING})"


def too_large(what: str, max_bytes: int) -> ArchiveError:
    return ArchiveError(f"{what} is larger than {limit_words(max_bytes)}: code and small files "
                        "ship with a job, data goes through datasets (`ogai dataset upload`).")


def is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGICS)


def member_path(name: str) -> str:
    """The member's path inside the folder ("" for the folder itself), or ArchiveError."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveError(f"{name.encode('utf-8', 'replace').decode()!r}: file names must "
                           "be UTF-8.") from None
    if "\x00" in name:
        raise ArchiveError(f"{name!r}: a file name holds a NUL byte.")
    if name.startswith("/"):
        raise ArchiveError(f"{name!r} is an absolute path; names must be inside the folder.")
    parts = [part for part in PurePosixPath(name).parts if part != "."]
    if ".." in parts:
        raise ArchiveError(f"{name!r} reaches outside the folder (`..`).")
    return "/".join(parts)


class _Tally:
    """Paths seen and bytes declared so far, refusing repeats and what passes the limit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.seen: set[str] = set()
        self.file_paths: set[str] = set()
        self.folder_paths: set[str] = set()  # the parents of what was seen
        self.listing = Listing()

    def add(self, path: str, *, size: int | None) -> None:
        """A file of `size` bytes, or a folder (None)."""
        if len(self.seen) >= MAX_MEMBERS:
            raise ArchiveError(f"The archive holds more than {MAX_MEMBERS:,} files and folders; "
                               "ship data as a dataset (`ogai dataset upload`).")
        if not path:
            if size is not None:
                raise ArchiveError("The archive holds a file with no name.")
            return  # the folder itself
        if path in self.seen:
            raise ArchiveError(f"{path!r} is in the archive twice.")
        self.seen.add(path)
        for parent in PurePosixPath(path).parents:
            if str(parent) in self.file_paths:
                raise ArchiveError(f"{str(parent)!r} is both a file and a folder.")
            self.folder_paths.add(str(parent))
        if size is None:
            return
        if path in self.folder_paths:
            raise ArchiveError(f"{path!r} is both a file and a folder.")
        self.file_paths.add(path)
        self.listing.unpacked_bytes += size
        if self.listing.unpacked_bytes > self.max_bytes:
            raise too_large("Unpacked, the folder", self.max_bytes)
        self.listing.files.append({"path": path, "size": size})


def _check_member(member: tarfile.TarInfo) -> tuple[str, int | None]:
    path = member_path(member.name)
    if member.issym() or member.islnk():
        raise ArchiveError(f"{member.name!r} is a link (to {member.linkname!r}); links are not "
                           "shipped: copy the file into the folder, or leave it out.")
    if member.ischr() or member.isblk() or member.isfifo():
        raise ArchiveError(f"{member.name!r} is a device or a pipe; only files and folders "
                           "are shipped.")
    if member.isdir():
        return path, None
    if not member.isreg():
        raise ArchiveError(f"{member.name!r} is neither a file nor a folder; only files and "
                           "folders are shipped.")
    return path, member.size


def inspect_tar(path: Path, *, max_bytes: int) -> Listing:
    """Check the archive at `path` as the module says; its listing, or ArchiveError."""
    with path.open("rb") as stream:
        head = stream.read(len(GZIP_MAGIC))
    if head != GZIP_MAGIC:
        raise ArchiveError(f"The archive is not gzip-compressed: {HOW_TO_MAKE}.")
    tally = _Tally(max_bytes)
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            while (member := tar.next()) is not None:
                # A header at a time: nothing piles up in memory (`members` is not typed).
                tar.members.clear()  # type: ignore[attr-defined]
                member_path_, size = _check_member(member)
                tally.add(member_path_, size=size)
            # Read to the end, so the gzip checksum is verified and nothing hides after the
            # archive's end.
            trailer = 0
            while chunk := tar.fileobj.read(BLOCK):
                trailer += len(chunk)
                if trailer > MAX_TRAILER:
                    raise ArchiveError("The archive goes on after its end; "
                                       f"{HOW_TO_MAKE}.")
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise ArchiveError(f"The archive is damaged or not a tar archive ({exc}); "
                           f"{HOW_TO_MAKE}.") from None
    return tally.listing


def _zip_entries(archive: zipfile.ZipFile, max_bytes: int) -> dict[str, zipfile.ZipInfo | None]:
    """The zip's paths, each with its entry (None: a folder, named or implied by a file)."""
    tally = _Tally(max_bytes)
    entries: dict[str, zipfile.ZipInfo | None] = {}
    for info in archive.infolist():
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ArchiveError(f"{info.filename!r} is a link; links are not shipped: copy the "
                               "file into the folder, or leave it out.")
        kind = stat.S_IFMT(mode)
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            raise ArchiveError(f"{info.filename!r} is neither a file nor a folder; only files "
                               "and folders are shipped.")
        if info.flag_bits & 0x1:
            raise ArchiveError(f"{info.filename!r} is encrypted; upload a zip without a "
                               "password.")
        path = member_path(info.filename)
        folder = info.is_dir()
        tally.add(path, size=None if folder else info.file_size)
        if path:
            entries[path] = None if folder else info
    for name in tally.folder_paths - {"."}:
        entries.setdefault(name, None)
    return entries


def _tar_info(path: str, *, size: int | None, executable: bool) -> tarfile.TarInfo:
    """A header as the client makes them: no owner, no time, 0755 folders and programs."""
    info = tarfile.TarInfo(path)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if size is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o755 if executable else 0o644
    return info


def zip_to_tar(source: Path, target: Path, *, max_bytes: int) -> None:
    """Write the canonical archive (sorted names, no times or owners, gzip without a time) of
    the zip at `source` to `target`, with the same checks as a tar; ArchiveError if refused."""
    try:
        with zipfile.ZipFile(source) as archive:
            entries = _zip_entries(archive, max_bytes)
            with target.open("wb") as raw, \
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
                    tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(entries):
                    info = entries[path]
                    if info is None:
                        tar.addfile(_tar_info(path, size=None, executable=True))
                        continue
                    # Copied by the size its header declared (and counted above); a zip whose
                    # data disagrees fails its checksum here.
                    header = _tar_info(path, size=info.file_size,
                                       executable=bool((info.external_attr >> 16) & 0o111))
                    with archive.open(info) as stream:
                        tar.addfile(header, stream)
    except ArchiveError:
        raise
    # NotImplementedError: a compression method zipfile cannot read; RuntimeError: encrypted.
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError,
            NotImplementedError) as exc:
        raise ArchiveError(f"The zip is damaged or cannot be read ({exc}).") from None
