"""The data directory, its SQLite database and its secret key are their owner's alone."""

import os
import stat
import subprocess
import sys
from pathlib import Path

from ogai.env import private_path

SETTINGS = "import django; django.setup()"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_fresh_data_directory_is_made_private(tmp_path):
    data = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(OGAI_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="ogai.settings")
    subprocess.run([sys.executable, "-c", SETTINGS], env=env, check=True, capture_output=True)
    assert _mode(data) == 0o700
    assert _mode(data / "ogai.sqlite3") == 0o600
    assert _mode(data / "secret_key") == 0o600


def test_an_open_data_directory_is_closed_and_a_file_made_private(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    private_path(folder, folder=True)
    assert _mode(folder) == 0o700
    database = folder / "ogai.sqlite3"
    database.write_text("")
    database.chmod(0o644)
    private_path(database, folder=False)
    assert _mode(database) == 0o600
