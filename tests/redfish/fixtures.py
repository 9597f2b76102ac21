"""Pytest fixtures for Redfish tests, registered for the whole suite by the root conftest.

* `redfish_emulator` (module): `RedfishEmulator` with 24 fake systems, all off, HTTP Basic auth
  as `EMULATOR_USERNAME`/`EMULATOR_PASSWORD`. Tests of one module share it: take systems with
  `redfish_emulator.claim(n)` so they do not step on each other.
* `redfish_static` (module): `StaticRedfish`, the GPU-server mockup (system id "1").
* `image_server`: `ImageServer`, a boot image at `.url`.
* `garbage_bmc`: `GarbageServer`, answers HTML to everything, at `.url`.
* `unreachable_bmc_url`: an http URL on a port nobody listens on.
"""

from collections.abc import Iterator

import pytest

from tests.redfish.emulator import (
    GarbageServer,
    ImageServer,
    RedfishEmulator,
    StaticRedfish,
    free_port,
)

EMULATOR_USERNAME = "admin"
EMULATOR_PASSWORD = "ogai-bmc-secret"
EMULATOR_SYSTEMS = 24


@pytest.fixture(scope="module")
def redfish_emulator() -> Iterator[RedfishEmulator]:
    """sushy-emulator with 24 fake systems (all off, Basic auth); `claim(n)` your systems."""
    with RedfishEmulator(
        EMULATOR_SYSTEMS, username=EMULATOR_USERNAME, password=EMULATOR_PASSWORD
    ) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def redfish_static() -> Iterator[StaticRedfish]:
    """sushy-static serving the GPU-server mockup (system "1"); `bodies()` shows what was sent."""
    with StaticRedfish() as static:
        yield static


@pytest.fixture
def image_server() -> Iterator[ImageServer]:
    """A boot image over HTTP at `.url`; `.downloads` counts fetches."""
    with ImageServer() as server:
        yield server


@pytest.fixture
def garbage_bmc() -> Iterator[GarbageServer]:
    """A "BMC" at `.url` answering 200 with HTML to everything; `.hits` counts requests."""
    with GarbageServer() as server:
        yield server


@pytest.fixture
def unreachable_bmc_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
