"""Browser tests drive Debian's Chromium (never a downloaded one) through Playwright."""

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make beside
# it would otherwise trip Django's async-safety check.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not CHROMIUM.exists():
        pytest.fail(f"No Chromium at {CHROMIUM}: `make chromium` installs Debian's.")
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS}
