"""The working folder a job ships with: a deterministic archive of a folder.

The archive is a gzip-compressed tar of regular files and folders only, with sorted names, mtime
0, uid/gid 0, modes 0644/0755 and a gzip header without a name or time, so the same files always
give the same bytes and the same sha256, which is the archive's id on the platform (a rerun, or
a second submit of an unchanged folder, uploads nothing).

What it leaves out, as git does: whatever the `.gitignore` files say (the root's and those of
sub-folders, each relative to its own folder, the nearest one winning), then `.ogaiignore` files
(same syntax, read in the same places) which win over them and may re-include with `!`; and
always `.git`. A link to a file inside the folder is stored as that file's content; links out of
the folder, links to folders and special files are left out and listed in `left_out`.

    with build_archive("project", max_bytes=200 * MIB) as archive:
        print(archive.sha256, archive.size_bytes, len(archive.files), archive.left_out)
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pathspec

GITIGNORE = ".gitignore"
OGAIIGNORE = ".ogaiignore"
ALWAYS_LEFT_OUT = frozenset({".git"})
MIB = 1024 * 1024
# A fixed level: the bytes (hence the id) must not depend on a default that could change.
GZIP_LEVEL = 6
CHUNK = 1024 * 1024
# How many of the biggest top-level entries an over-the-limit error names.
BIGGEST_SHOWN = 3

_Layers = tuple[tuple[str, pathspec.GitIgnoreSpec], ...]


class WorkdirError(ValueError):
    """The folder cannot be shipped; the message names the folder and what to do."""


@dataclass(frozen=True)
class Entry:
    """One member of the archive: `path` relative to the folder (with "/" separators), `source`
    the file whose bytes it holds (a link's target for a link), None for a folder."""

    path: str
    source: str | None
    size: int = 0
    executable: bool = False


@dataclass
class Archive:
    """The archive of a folder in a temporary file, removed by `close()` (or leaving `with`)."""

    folder: Path
    path: Path
    sha256: str
    size_bytes: int
    unpacked_bytes: int
    files: list[dict] = field(default_factory=list)  # [{"path", "size"}], in archive order
    left_out: list[str] = field(default_factory=list)  # "data -> /mnt/x (a link out of ...)"

    @property
    def file_count(self) -> int:
        return len(self.files)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def human_size(size: int) -> str:
    """"23 KiB", "612 MiB", "1.5 GiB": binary units, three figures at most."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{size} B"
    return f"{value:.1f} {unit}".replace(".0 ", " ") if value < 10 else f"{value:.0f} {unit}"


def display_folder(folder: str | os.PathLike) -> str:
    """The folder as a person would type it: "./" and "./sub/" under the current folder, else
    its absolute path, always with a trailing "/"."""
    absolute = Path(os.path.abspath(folder))
    try:
        relative = absolute.relative_to(Path.cwd())
    except (ValueError, OSError):  # outside it, or the current folder is gone
        return f"{absolute.as_posix().rstrip('/')}/"
    return "./" if str(relative) == "." else f"./{relative.as_posix()}/"


def _read_rules(directory: str, name: str, where: str) -> pathspec.GitIgnoreSpec | None:
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return pathspec.GitIgnoreSpec.from_lines(handle.read().splitlines())
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError as exc:
        raise WorkdirError(f"cannot read {where}{name}: {exc.strerror or exc}") from None


def _decide(layers: _Layers, path: str, directory: bool) -> bool | None:
    """True: left out, False: kept by a `!` pattern, None: no pattern of these layers says."""
    for prefix, spec in reversed(layers):  # the nearest ignore file decides first
        result = spec.check_file(path[len(prefix):] + ("/" if directory else ""))
        if result.include is not None:
            return bool(result.include)
    return None


def _ignored(git: _Layers, ogai: _Layers, path: str, directory: bool) -> bool:
    verdict = _decide(ogai, path, directory)
    if verdict is None:
        verdict = _decide(git, path, directory)
    return bool(verdict)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


@dataclass
class _Walk:
    entries: list[Entry] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    # Links to files inside the folder, kept only if their target is: (entry, link text).
    links: list[tuple[Entry, str]] = field(default_factory=list)
    unpacked: int = 0
    by_top: dict[str, int] = field(default_factory=dict)  # bytes per top-level entry

    def add_file(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.unpacked += entry.size
        top, _, rest = entry.path.partition("/")
        key = f"{top}/" if rest else top
        self.by_top[key] = self.by_top.get(key, 0) + entry.size


def collect(folder: str | os.PathLike, *, max_bytes: int | None = None) -> _Walk:
    """What the archive of `folder` holds, in archive order (each folder before its contents,
    names sorted). Raises WorkdirError when the files add up to more than `max_bytes`: the
    folder is only walked (sizes read from its directory entries), nothing is read or packed."""
    shown = display_folder(folder)
    root = os.path.abspath(folder)
    if not os.path.exists(root):
        raise WorkdirError(f"the working folder {shown} does not exist")
    if not os.path.isdir(root):
        raise WorkdirError(f"the working folder {shown} is not a folder")
    real_root = os.path.realpath(root)
    walk = _Walk()
    # Folders still to visit, popped from the end: (relative path with a trailing "/" or "",
    # absolute path, the .gitignore layers and the .ogaiignore layers that apply inside it).
    pending: list[tuple[str, str, _Layers, _Layers]] = [("", root, (), ())]
    while pending:
        prefix, directory, git, ogai = pending.pop()
        where = f"{shown}{prefix}"
        own_git = _read_rules(directory, GITIGNORE, where)
        own_ogai = _read_rules(directory, OGAIIGNORE, where)
        git = (*git, (prefix, own_git)) if own_git is not None else git
        ogai = (*ogai, (prefix, own_ogai)) if own_ogai is not None else ogai
        try:
            with os.scandir(directory) as scan:
                children = sorted(scan, key=lambda item: item.name)
        except OSError as exc:
            raise WorkdirError(f"cannot read {where}: {exc.strerror or exc}; list it in "
                               f"{OGAIIGNORE} if the job need not have it") from None
        subfolders: list[tuple[str, str, _Layers, _Layers]] = []
        for child in children:
            if child.name in ALWAYS_LEFT_OUT:
                continue
            path = f"{prefix}{child.name}"
            try:
                if child.is_symlink():
                    _add_link(walk, child, path, real_root, git, ogai)
                elif child.is_dir(follow_symlinks=False):
                    if not _ignored(git, ogai, path, directory=True):
                        walk.entries.append(Entry(path=path, source=None))
                        subfolders.append((f"{path}/", child.path, git, ogai))
                elif not _ignored(git, ogai, path, directory=False):
                    info = child.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        walk.add_file(Entry(path=path, source=child.path, size=info.st_size,
                                            executable=bool(info.st_mode & 0o111)))
                    else:
                        walk.left_out.append(f"{path} ({_kind(info.st_mode)})")
            except OSError as exc:
                raise WorkdirError(f"cannot read {shown}{path}: {exc.strerror or exc}; list it "
                                   f"in {OGAIIGNORE} if the job need not have it") from None
        pending.extend(subfolders)
    _keep_links(walk)
    # Archive order: names sorted, each folder right before its contents.
    walk.entries.sort(key=lambda entry: entry.path.split("/"))
    if max_bytes is not None and walk.unpacked > max_bytes:
        biggest = sorted(walk.by_top.items(), key=lambda item: (-item[1], item[0]))
        named = ", ".join(f"{name} {human_size(size)}" for name, size in
                          biggest[:BIGGEST_SHOWN])
        raise WorkdirError(
            f"the working folder {shown} is {human_size(walk.unpacked)}, over the platform's "
            f"limit of {human_size(max_bytes)}; list what it need not ship in {OGAIIGNORE}"
            f" (biggest: {named})")
    return walk


def _add_link(walk: _Walk, child: os.DirEntry, path: str, real_root: str, git: _Layers,
              ogai: _Layers) -> None:
    target = os.readlink(child.path)
    resolved = os.path.realpath(child.path)
    pointed_dir = os.path.isdir(resolved)
    if _ignored(git, ogai, path, directory=pointed_dir):
        return
    if os.path.commonpath([real_root, resolved]) != real_root:
        walk.left_out.append(f"{path} -> {target} (a link out of the folder)")
    elif not os.path.exists(resolved):
        walk.left_out.append(f"{path} -> {target} (a broken link)")
    elif pointed_dir:
        walk.left_out.append(f"{path} -> {target} (a link to a folder; the archive holds "
                             "no links)")
    else:
        info = os.stat(resolved)
        if not stat.S_ISREG(info.st_mode):
            walk.left_out.append(f"{path} -> {target} ({_kind(info.st_mode)})")
            return
        walk.links.append((Entry(path=path, source=resolved, size=info.st_size,
                                 executable=bool(info.st_mode & 0o111)), target))


def _keep_links(walk: _Walk) -> None:
    """A link ships as its target's content only where the target itself ships: a link must not
    carry out a file the ignore rules keep home (`alias.env -> secret.env`)."""
    if not walk.links:
        return
    kept = {os.path.realpath(entry.source) for entry in walk.entries if entry.source}
    for entry, target in walk.links:
        if entry.source in kept:
            walk.add_file(entry)
        else:
            walk.left_out.append(f"{entry.path} -> {target} (a link to a file the ignore "
                                 "rules leave out)")


class _HashingWriter:
    """A binary file that hashes and counts what goes through it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()


def _member(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path)
    info.type = tarfile.REGTYPE if entry.source else tarfile.DIRTYPE
    info.mode = 0o755 if entry.source is None or entry.executable else 0o644
    info.size = entry.size if entry.source else 0
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_archive(folder: str | os.PathLike, *, max_bytes: int | None = None,
                  on_file: Callable[[str], None] | None = None) -> Archive:
    """The archive of `folder` in a temporary file, written as the files are read (never held
    in memory). Raises WorkdirError before reading anything when the files add up to more than
    `max_bytes`, and after packing when the archive itself does."""
    walk = collect(folder, max_bytes=max_bytes)
    shown = display_folder(folder)
    handle, name = tempfile.mkstemp(prefix="ogai-workdir-", suffix=".tar.gz")
    path = Path(name)
    try:
        with os.fdopen(handle, "wb") as raw:
            writer = _HashingWriter(raw)
            with gzip.GzipFile(filename="", mode="wb", fileobj=writer,  # type: ignore[arg-type]
                               compresslevel=GZIP_LEVEL, mtime=0) as packed, \
                    tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT,
                                 encoding="utf-8") as tar:
                for entry in walk.entries:
                    if on_file is not None:
                        on_file(entry.path)
                    if entry.source is None:
                        tar.addfile(_member(entry))
                        continue
                    try:
                        with open(entry.source, "rb") as content:
                            tar.addfile(_member(entry), content)
                    except OSError as exc:
                        # A file that shrank while packing reads as "unexpected end of data".
                        raise WorkdirError(f"cannot read {shown}{entry.path}: "
                                           f"{exc.strerror or exc}; list it in {OGAIIGNORE} if "
                                           "the job need not have it") from None
        if max_bytes is not None and writer.size > max_bytes:
            raise WorkdirError(f"the archive of the working folder {shown} is "
                               f"{human_size(writer.size)}, over the platform's limit of "
                               f"{human_size(max_bytes)}; list what it need not ship in "
                               f"{OGAIIGNORE}")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Archive(folder=Path(os.path.abspath(folder)), path=path,
                   sha256=writer.digest.hexdigest(), size_bytes=writer.size,
                   unpacked_bytes=walk.unpacked,
                   files=[{"path": e.path, "size": e.size} for e in walk.entries if e.source],
                   left_out=walk.left_out)
