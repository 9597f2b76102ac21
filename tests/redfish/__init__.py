"""Redfish servers for tests: sushy-tools' emulator, a static GPU-server mockup, an image server
and a BMC that answers garbage (see `emulator.py`; fixtures in `fixtures.py`)."""

from tests.redfish.emulator import (
    EmulatedSystem,
    GarbageServer,
    ImageServer,
    RedfishEmulator,
    StaticRedfish,
    free_port,
)

__all__ = [
    "EmulatedSystem",
    "GarbageServer",
    "ImageServer",
    "RedfishEmulator",
    "StaticRedfish",
    "free_port",
]
