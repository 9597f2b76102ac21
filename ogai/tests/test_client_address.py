"""Whose address a request is: X-Forwarded-For only from trusted proxies, one rule for the
audit log (infra_os/tests/test_audit_address.py), the sign-in throttle, /metrics and
provisioning callbacks."""

import os
import subprocess
import sys
from pathlib import Path

from django.test import RequestFactory

from ogai.request_context import client_ip

REPO = Path(__file__).resolve().parents[2]


def _ip(remote, forwarded=None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client_ip(RequestFactory().get("/", REMOTE_ADDR=remote, **extra))


def test_the_header_is_ignored_unless_it_comes_from_a_trusted_proxy(settings):
    settings.OGAI_USE_X_FORWARDED_FOR = False
    settings.OGAI_TRUSTED_PROXIES = ["10.0.0.1/32"]
    assert _ip("10.0.0.1", "198.51.100.7") == "10.0.0.1"
    settings.OGAI_USE_X_FORWARDED_FOR = True
    # A client that reaches the platform directly writes whatever it likes: not believed.
    assert _ip("203.0.113.9", "198.51.100.7") == "203.0.113.9"
    assert _ip("203.0.113.9", "10.0.0.1") == "203.0.113.9"


def test_behind_trusted_proxies_the_rightmost_untrusted_address_is_the_client(settings):
    settings.OGAI_USE_X_FORWARDED_FOR = True
    settings.OGAI_TRUSTED_PROXIES = ["10.0.0.0/30", "::1/128"]
    assert _ip("10.0.0.1", "198.51.100.7") == "198.51.100.7"
    # What the client wrote itself is on the left; the proxy appended the real address.
    assert _ip("10.0.0.1", "1.2.3.4, 198.51.100.7") == "198.51.100.7"
    # Two proxies in a row: both skipped.
    assert _ip("10.0.0.1", "1.2.3.4, 198.51.100.7, 10.0.0.2") == "198.51.100.7"
    assert _ip("::1", "2001:db8::5") == "2001:db8::5"
    # No header, an empty one, or garbage next to the proxy: the proxy itself.
    assert _ip("10.0.0.1") == "10.0.0.1"
    assert _ip("10.0.0.1", "") == "10.0.0.1"
    assert _ip("10.0.0.1", "1.2.3.4, not-an-address") == "10.0.0.1"
    assert _ip("10.0.0.1", "not-an-address, 10.0.0.2") == "10.0.0.2"


def test_forwarded_for_without_trusted_proxies_is_refused_at_start(tmp_path):
    env = {**os.environ, "OGAI_USE_X_FORWARDED_FOR": "true", "OGAI_DATA_DIR": str(tmp_path)}
    env.pop("OGAI_TRUSTED_PROXIES", None)
    result = subprocess.run([sys.executable, "-c", "import ogai.settings"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "OGAI_TRUSTED_PROXIES" in result.stderr
    env["OGAI_TRUSTED_PROXIES"] = "10.0.0.1/32,not-a-network"
    result = subprocess.run([sys.executable, "-c", "import ogai.settings"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert "'not-a-network' is not an address or a CIDR" in result.stderr
