"""A fake Kubernetes API server for tests (see ``server.py`` for what it simulates).

Use the ``fake_kube`` fixture (``from tests.fakekube import fake_kube`` in a test module), or
``FakeKube().start()`` and ``stop()`` by hand."""

import pytest

from podsys.drivers import kube_watch
from tests.fakekube.server import ApiError, FakeKube, label_selector_matches, quantity

__all__ = ["ApiError", "FakeKube", "fake_kube", "label_selector_matches", "quantity"]


@pytest.fixture
def fake_kube():
    """A started fake API server (namespaces ``default`` and ``kube-system``, no nodes);
    stopped after the test, once the drivers' watches of it are."""
    fake = FakeKube().start()
    try:
        yield fake
    finally:
        kube_watch.stop_all()
        fake.stop()
