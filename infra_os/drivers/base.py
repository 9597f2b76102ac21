"""The BMC driver contract: how OGAI talks to a server's baseboard management controller.

Redfish (`infra_os.drivers.redfish`) is the one driver today; IPMI would be another class with
the same methods. Only the plain dataclasses below cross it. Every call has a timeout and
retries transient failures itself; what it cannot do ends in a `BmcError` whose message is the
BMC's own words (or says plainly that it did not answer) and never contains the credentials.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


class BmcErrorKind(enum.StrEnum):
    AUTH = "auth"  # the BMC refused the credentials
    UNREACHABLE = "unreachable"  # no answer: refused, timed out, DNS
    PROTOCOL = "protocol"  # it answered something that is not Redfish
    REFUSED = "refused"  # it understood and said no (unsupported action, bad state)
    NOT_FOUND = "not_found"  # no such system or device


class BmcError(Exception):
    def __init__(self, message: str, *, kind: BmcErrorKind):
        super().__init__(message)
        self.kind = kind

    @property
    def retryable(self) -> bool:
        """Worth another try later: retrying a refused password only locks the account."""
        return self.kind in (BmcErrorKind.UNREACHABLE, BmcErrorKind.PROTOCOL)


@dataclass(frozen=True)
class BmcAccess:
    """Where and as whom. `repr` hides the password so it never reaches a log."""

    address: str
    username: str
    password: str = field(repr=False)
    system_id: str = ""
    verify_tls: bool = True


@dataclass(frozen=True)
class Gpu:
    model: str
    vendor: str = ""
    serial: str = ""


@dataclass(frozen=True)
class Nic:
    name: str
    mac: str
    speed_mbps: int | None = None


@dataclass(frozen=True)
class Disk:
    name: str
    capacity_bytes: int | None = None
    media_type: str = ""


@dataclass(frozen=True)
class Inventory:
    """What the BMC reports about its system. `missing` names the sections it did not report
    (many BMCs leave some out), so "no GPUs" and "GPUs not reported" stay different."""

    system_id: str
    power_state: str  # "On", "Off", or the BMC's word
    health: str = ""  # "OK", "Warning", "Critical", or "" when not reported
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    cpu_count: int | None = None
    cpu_model: str = ""
    cpu_cores: int | None = None
    memory_gib: float | None = None
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    disks: tuple[Disk, ...] = ()
    console_url: str = ""
    missing: tuple[str, ...] = ()


class BootDevice(enum.StrEnum):
    PXE = "pxe"
    CD = "cd"  # virtual media
    DISK = "disk"


class BmcDriver(ABC):
    """One BMC. `bmc_seconds` adds up the time spent waiting on it, so callers can tell their
    own time from the BMC's."""

    def __init__(self, access: BmcAccess, *, timeout_s: float = 30, retries: int = 2):
        self.access = access
        self.timeout_s = timeout_s
        self.retries = retries
        self.bmc_seconds = 0.0

    @abstractmethod
    def inventory(self) -> Inventory: ...

    @abstractmethod
    def power_state(self) -> str: ...

    @abstractmethod
    def power(self, action: str) -> None:
        """`on`, `off` (forced), `shutdown` (graceful) or `cycle` (on from off)."""

    @abstractmethod
    def set_one_time_boot(self, device: BootDevice) -> None: ...

    @abstractmethod
    def insert_media(self, image_url: str) -> None:
        """Insert the image as virtual CD (ejecting what was there)."""

    @abstractmethod
    def eject_media(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - drivers without a session need nothing here
        """Release the session."""
