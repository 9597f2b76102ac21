"""Folders of the platform's data directory that a workload on a Slurm cluster reads or writes
(datasets, models, toolchain runs), given homes on the path the cluster shares.

The data directory is the platform's alone (mode 0700) and Slurm's nodes need not see it, so
each folder a workload names gets a home under the shared path, and the launcher binds every
home at the folder's own path inside the job (`slurm_launcher`, with bubblewrap): the job sees
the same paths as on every other driver, and nothing else of the data directory.

- A folder the workload writes (a toolchain run's) moves to `data/<path>` under the shared
  path, the tenant's account's (0700), and the data directory keeps a link to it in its place:
  what the runner writes is where the platform reads it, during the job and after.
- A folder it only reads (a dataset or model version) is staged for the account under
  `staged/<uid>/` (root's, open to the account's group alone), one copy per content (a
  signature of its names, sizes and times), so a job reading it never sees it change. Files
  are hard links where the shared path is on the data directory's file system and the file is
  root's and readable by all, copies otherwise. A folder that is already a home (another run's
  output, read by the next fine-tune) is bound from there: its owner alone can read it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from podsys.drivers.base import DataMount, DriverError

# Under the shared path.
DATA_FOLDER = "data"
STAGED_FOLDER = "staged"
# A staged copy's name: the folder's, then its content's signature (a partial one: hidden).
STAGED_NAME = re.compile(r"^\.?.+@[0-9a-f]{16}(\.[0-9a-f]{8})?$")


def data_relative(path: str | Path, data_dir: Path) -> Path | None:
    """`path` relative to the data directory (lexically: links in it are not followed), or
    None when it is not inside it."""
    lexical = Path(os.path.normpath(os.path.abspath(path)))
    for root in (Path(os.path.normpath(os.path.abspath(data_dir))),
                 Path(os.path.realpath(data_dir))):
        if lexical != root and root in lexical.parents:
            return lexical.relative_to(root)
    return None


def data_binds(mounts: tuple[DataMount, ...], *, data_dir: Path, root: Path, uid: int,
               workload_id: str) -> list[dict]:
    """Give each of the workload's folders of the data directory its home on the shared path;
    what the launcher binds: `{"source", "path", "read_only"}` each, `path` as the workload
    names it. Folders outside the data directory are not the platform's to hand out and are
    left as the nodes have them."""
    binds = []
    for mount in mounts:
        relative = data_relative(mount.path, data_dir)
        if relative is None:
            continue
        where = data_dir / relative
        home = _home_of(where, data_dir, root, uid)
        if home is None:
            if mount.read_only:
                home = _stage(where, root, relative, uid, workload_id)
            else:
                home = _move(where, root / DATA_FOLDER / relative, uid)
        binds.append({"source": str(home), "path": str(where), "read_only": mount.read_only})
    return binds


def _home_of(where: Path, data_dir: Path, root: Path, uid: int) -> Path | None:
    """Where `where` lives when it, or a folder above it, was moved to the shared path already
    (the data directory keeps a link there); None when it is the data directory's own."""
    homes = root / DATA_FOLDER
    above = where
    while above != data_dir and data_dir in above.parents:
        if above.is_symlink():
            target = Path(os.readlink(above))
            if not target.is_absolute() or homes not in target.parents:
                raise DriverError(f"{above} of the data directory links to {target}, which is "
                                  f"not a home under {homes}")
            if not target.is_dir():  # the shared path lost it: written again from empty
                target.mkdir(mode=0o700, parents=True)
                os.chown(target, uid, uid)
            return target / where.relative_to(above)
        above = above.parent
    return None


def _move(where: Path, home: Path, uid: int) -> Path:
    """Move a folder the workload writes to its home, the account's, and link it from the
    data directory."""
    passable_parents(home)
    if where.is_dir():
        if home.exists():
            raise DriverError(f"cannot move {where} to the shared path: {home} exists")
        shutil.move(where, home)
    home.mkdir(mode=0o700, exist_ok=True)
    home.chmod(0o700)
    _chown_tree(home, uid)
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(home, where)
    return home


def _stage(where: Path, root: Path, relative: Path, uid: int, workload_id: str) -> Path:
    """The account's read-only copy of a folder it reads, staged once per content."""
    if not where.is_dir():
        raise DriverError(f"workload {workload_id} reads {where}, which is not a folder of "
                          "the platform's data directory")
    top = root / STAGED_FOLDER / str(uid)
    _own(root / STAGED_FOLDER, 0o711, 0, 0)
    _own(top, 0o750, 0, uid)
    copy = top / relative.parent / f"{relative.name}@{_signature(where)[:16]}"
    if copy.is_dir():
        os.utime(copy)  # in use again: `staged_prune` keeps it
        return copy
    copy.parent.mkdir(parents=True, exist_ok=True)
    partial = copy.with_name(f".{copy.name}.{secrets.token_hex(4)}")
    linkable = os.stat(where).st_dev == os.stat(top).st_dev
    try:
        shutil.copytree(where, partial, symlinks=True,
                        copy_function=_link_or_copy if linkable else shutil.copy2)
        _readable(partial)
        partial.rename(copy)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if not copy.is_dir():  # not a launch beside this one that staged it first
            raise DriverError(f"could not stage {where} for workload {workload_id}: "
                              f"{exc}") from exc
    return copy


def _signature(folder: Path) -> str:
    """Names, types, sizes and modification times of everything under the folder."""
    digest = hashlib.sha256()
    for place, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(place, name)
            info = os.lstat(path)
            digest.update(f"{os.path.relpath(path, folder)}\0{stat.S_IFMT(info.st_mode)}\0"
                          f"{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link to a file nobody but root can change and everyone may read; else a copy
    (a link to a file another account owns would let it change what this one reads)."""
    info = os.lstat(source)
    if info.st_uid == 0 and not info.st_mode & 0o022 and info.st_mode & 0o004:
        try:
            os.link(source, destination)
            return
        except OSError:
            pass
    shutil.copy2(source, destination)


def _readable(folder: Path) -> None:
    """Root's, readable by everyone who may enter the account's staging folder."""
    for place, _dirs, files in os.walk(folder):
        os.chmod(place, 0o755)  # noqa: S103 - inside the account's 0750 staging folder
        for name in files:
            path = os.path.join(place, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                os.chmod(path, 0o755 if info.st_mode & 0o111 else 0o644)


def _chown_tree(folder: Path, uid: int) -> None:
    os.chown(folder, uid, uid)
    for place, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            os.chown(os.path.join(place, name), uid, uid, follow_symlinks=False)


def _own(folder: Path, mode: int, uid: int, gid: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, uid, gid)
    folder.chmod(mode)


def passable_parents(home: Path) -> None:
    """The folders above a home, made as they are needed: passable by every account, listable
    by none, so no account learns the names of others' folders."""
    missing = [parent for parent in home.parents if not parent.exists()]
    for parent in reversed(missing):
        parent.mkdir(mode=0o711)
        parent.chmod(0o711)


def staged_prune(root: Path, *, keep: set[str], older_than: float) -> int:
    """Remove the staged copies no workload in `keep` (their paths) binds and none staged or
    used again since `older_than` (epoch seconds), and what a stopped staging left; return
    how many. Called under the launches' lock, so no launch is choosing a copy meanwhile."""
    removed = 0
    for place, dirs, _files in os.walk(root / STAGED_FOLDER):
        for name in list(dirs):
            if not STAGED_NAME.match(name):
                continue
            dirs.remove(name)  # a copy: nothing under it is another
            copy = os.path.join(place, name)
            if copy not in keep and os.lstat(copy).st_mtime < older_than:
                shutil.rmtree(copy, ignore_errors=True)
                removed += 1
    return removed
