"""Fixtures of the registry's tests: their own DATA_DIR and import root, a tiny model folder
built once per session and copied where a test wants it, Celery tasks run in-line."""

import shutil
from pathlib import Path

import pytest

from mmodel.tests.tiny import tiny_model
from ogai.celery import app


@pytest.fixture
def roots(settings, tmp_path) -> Path:
    """DATA_DIR and the only import root (returned) in this test's own folder: files outlive
    a rolled-back transaction."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    imports = tmp_path / "imports"
    imports.mkdir()
    settings.OGAI_MODEL_IMPORT_ROOTS = [str(imports)]
    settings.OGAI_MODEL_ALLOW_PICKLE = False
    return imports


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def tiny_copy(tiny_source):
    """`tiny_copy(target)`: a copy of the tiny model's folder at `target`."""

    def copy(target: Path) -> Path:
        shutil.copytree(tiny_source, target)
        return target

    return copy


@pytest.fixture
def eager():
    """Tasks enqueued with .delay() run at once, in this process."""
    before = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before
