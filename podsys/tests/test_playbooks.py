"""Every playbook OGAI ships passes `ansible-playbook --syntax-check` and `ansible-lint`."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podsys.metric_names import GPU_METRIC_NAMES
from podsys.services.deployments import PLAYBOOKS, PLAYBOOKS_DIR

BIN = Path(sys.executable).parent
PLAYBOOK_FILES = sorted(PLAYBOOKS_DIR.glob("*.yml"))


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_HOME": str(tmp_path / "ansible-home"), "ANSIBLE_NOCOLOR": "1",
            "NO_COLOR": "1"}


def test_every_deployment_kind_has_its_playbook():
    assert {path.name for path in PLAYBOOK_FILES} >= set(PLAYBOOKS.values())


@pytest.mark.parametrize("playbook", PLAYBOOK_FILES, ids=lambda path: path.name)
def test_syntax_check(playbook, tmp_path):
    result = subprocess.run(
        [BIN / "ansible-playbook", "--syntax-check", "-i", "localhost,", playbook.name],
        cwd=PLAYBOOKS_DIR, env=_env(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_ansible_lint_passes(tmp_path):
    """On a copy: ansible-lint keeps a cache (.ansible/) in the folder it lints."""
    copy = tmp_path / "playbooks"
    shutil.copytree(PLAYBOOKS_DIR, copy, ignore=shutil.ignore_patterns(".ansible"))
    result = subprocess.run(
        [BIN / "ansible-lint", "--offline", "--nocolor"],
        cwd=copy, env=_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Profile 'production' was required, and it passed" in output


def test_dcgm_exporter_exports_every_gpu_metric_ogai_charts():
    counters = PLAYBOOKS_DIR / "roles" / "dcgm" / "files" / "counters.csv"
    rows = [row for row in csv.reader(counters.read_text().splitlines())
            if row and not row[0].startswith("#")]
    exported = {row[0].strip(): row[1].strip() for row in rows}
    missing = set(GPU_METRIC_NAMES) - set(exported)
    assert not missing, f"counters.csv lacks {sorted(missing)}"
    assert set(exported.values()) <= {"gauge", "counter"}
