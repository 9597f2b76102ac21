"""Checkpoint directories under $OGAI_CHECKPOINT_DIR: `step-<n>/`, complete or absent.

A checkpoint is written into a hidden temporary directory and renamed to `step-<n>` only once
every file is written and synced, so a process killed mid-save leaves a `.tmp-…` directory that
no reader takes for a checkpoint (and the next start removes it). Old checkpoints are renamed to
`.trash-…` before they are deleted, for the same reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def tree_bytes(root: Path) -> int:
    return sum(
        os.path.getsize(os.path.join(dirpath, name))
        for dirpath, _dirnames, filenames in os.walk(root)
        for name in filenames
    )


class CheckpointStore:
    def __init__(self, root: str | os.PathLike, keep: int = 2):
        self.root = Path(root)
        self.keep = max(1, keep)

    def complete(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir() and (entry / STATE_FILE).is_file():
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def latest(self) -> tuple[int, Path] | None:
        found = self.complete()
        return found[-1] if found else None

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        return json.loads((path / STATE_FILE).read_text())

    def remove_partial(self) -> None:
        """Delete what a killed save or prune left behind (only the main rank calls this)."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name.startswith((".tmp-", ".trash-")) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)

    def save(
        self, step: int, write: Callable[[Path], None], state: dict[str, Any]
    ) -> tuple[Path, int]:
        """Write a checkpoint with `write(tmp_dir)` plus `state`; return its path and size."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-step-{step}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write(tmp)
        # The state file goes last: a directory with it has everything else already.
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
        _fsync_tree(tmp)
        final = self.root / f"step-{step}"
        if final.exists():  # the same step saved again after a resume: replace it whole
            self._discard(final)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        self.prune()
        return final, tree_bytes(final)

    def prune(self) -> None:
        found = self.complete()
        for _step, path in found[: max(0, len(found) - self.keep)]:
            self._discard(path)

    def _discard(self, path: Path) -> None:
        trash = self.root / f".trash-{path.name}-{os.getpid()}"
        if trash.exists():
            shutil.rmtree(trash)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
