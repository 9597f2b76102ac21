"""The Redfish BMC driver, through the `sushy` library.

One `sushy.Sushy` per driver instance, built on first use. Every request to the BMC goes through
`RedfishBmc._call`, the one place that times it (`bmc_seconds`), retries what is worth retrying
(no answer, a 5xx, an answer that is not JSON) with a short backoff, and turns sushy's and
requests' exceptions into a `BmcError` that says what happened in words — the BMC's own words
where it gave any — and never carries the credentials. sushy's own retries are switched off
(`_Connector`) so the retry policy lives in one place.

Authentication is HTTP Basic on every request: it needs no session that could be left open on the
BMC (BMCs allow only a few), and sushy-tools' emulator offers no SessionService.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
import sushy
from sushy import exceptions as sushy_exc
from sushy.auth import BasicAuth
from sushy.connector import Connector

from infra_os.drivers.base import (
    BmcAccess,
    BmcDriver,
    BmcError,
    BmcErrorKind,
    BootDevice,
    Disk,
    Gpu,
    Inventory,
    Nic,
)

T = TypeVar("T")

# Reset types to ask for, best first; the first one the system advertises is used.
_POWER_RESETS: dict[str, tuple[str, ...]] = {
    "on": ("On", "ForceOn"),
    "off": ("ForceOff",),
    "shutdown": ("GracefulShutdown",),
}
_RESTART_RESETS = ("ForceRestart", "PowerCycle")  # `cycle` of a server that is on
_ON_STATES = ("On", "PoweringOn")
_BOOT_TARGETS = {BootDevice.PXE: "Pxe", BootDevice.CD: "Cd", BootDevice.DISK: "Hdd"}
_GPU_TYPES = ("GPU", "Accelerator")
_CD_MEDIA = {sushy.VirtualMediaType.CD, sushy.VirtualMediaType.DVD}


class _Connector(Connector):
    """sushy's connector without its own server-side retries: `RedfishBmc._call` retries.

    (With `server_side_retries=1` sushy also makes a single connection attempt per request.)
    """

    def _op(self, method: str, path: str = "", **kwargs: Any) -> Any:
        if kwargs.get("server_side_retries_left") is None:
            kwargs["server_side_retries_left"] = 0
        return super()._op(method, path, **kwargs)


def _web_base(address: str) -> str:
    """`scheme://host[:port]` of a BMC address, without credentials or path. A bare host gets
    https, which is what every BMC speaks."""
    text = address.strip()
    if "://" not in text:
        text = "https://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise ValueError(f"not a BMC address: {address!r} (expected e.g. https://10.0.0.5)")
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme.lower()}://{host}{port}"


def _excerpt(text: str | bytes | None, limit: int = 80) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    flat = " ".join((text or "").split())
    if not flat:
        return "an empty body"
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return repr(flat)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _bmc_words(exc: sushy_exc.HTTPError) -> str:
    """The message the BMC put in its Redfish error body, or ""."""
    words = exc.detail
    body = exc.body if isinstance(exc.body, dict) else {}
    if not words:
        words = body.get("message")
    if not words:
        for info in exc.extended_info or ():
            if isinstance(info, dict) and info.get("Message"):
                words = info["Message"]
                break
    return " ".join(str(words).split()) if words else ""


def _str(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


class RedfishBmc(BmcDriver):
    backoff_s = 0.5  # first retry after this, then doubled, at most 4 s

    def __init__(self, access: BmcAccess, *, timeout_s: float = 30, retries: int = 2):
        super().__init__(access, timeout_s=timeout_s, retries=retries)
        self._base_url = _web_base(access.address)
        self._root: Any = None
        self._system_obj: Any = None

    def __repr__(self) -> str:
        return f"RedfishBmc({self._base_url!r}, system_id={self.access.system_id!r})"

    # ---- the one door to the BMC ------------------------------------------------------------

    def _call(self, fn: Callable[[], T], *, retry_answers: bool = True) -> T:
        """Run `fn` (which talks to the BMC), timed and retried; failures become `BmcError`.

        Retries `self.retries` times with a doubling pause, and none once `timeout_s` would be
        spent (each request has its own `timeout_s` read timeout and a shorter connect timeout).

        `retry_answers=False` retries only when the BMC did not answer at all, not when it
        answered an error (used for optional inventory sections, where an error just means the
        section is missing)."""
        started = time.monotonic()
        attempt = 0
        try:
            while True:
                try:
                    return fn()
                except Exception as exc:
                    error, transient = self._classify(exc)
                    answered = error.kind is not BmcErrorKind.UNREACHABLE
                    pause = min(self.backoff_s * 2**attempt, 4.0)
                    if (
                        transient
                        and (retry_answers or not answered)
                        and attempt < self.retries
                        and time.monotonic() - started + pause < self.timeout_s
                    ):
                        time.sleep(pause)
                        attempt += 1
                        continue
                    raise error from None
        finally:
            self.bmc_seconds += time.monotonic() - started

    def _error(self, message: str, kind: BmcErrorKind) -> BmcError:
        """A `BmcError` with the credentials scrubbed out of its message. (A password of under
        four characters is left alone: it would turn up inside ordinary words.)"""
        secret = self.access.password
        if len(secret) >= 4:
            message = message.replace(f"{self.access.username}:{secret}", "***")
            message = message.replace(secret, "***")
        return BmcError(message, kind=kind)

    def _classify(self, exc: Exception) -> tuple[BmcError, bool]:
        """(the error to raise, whether another try may help)."""
        if isinstance(exc, BmcError):
            return self._error(str(exc), exc.kind), False
        if isinstance(exc, sushy_exc.AccessError):
            status = exc.status_code or 401
            return self._error(
                f"the BMC refused the credentials (HTTP {status})", BmcErrorKind.AUTH
            ), False
        if isinstance(exc, sushy_exc.HTTPError):
            return self._http_error(exc)
        if isinstance(exc, sushy_exc.ConnectionError):
            return self._no_answer(exc)
        if isinstance(exc, json.JSONDecodeError | requests.exceptions.JSONDecodeError):
            return self._error(
                f"{self._base_url} answered something that is not Redfish JSON: "
                f"{_excerpt(getattr(exc, 'doc', ''))}",
                BmcErrorKind.PROTOCOL,
            ), True
        if isinstance(exc, sushy_exc.MissingActionError):
            return self._error(
                f"the BMC does not offer the {_action_name(exc)} action here",
                BmcErrorKind.REFUSED,
            ), False
        if isinstance(exc, sushy_exc.InvalidParameterValueError):
            return self._error(f"the BMC does not accept this: {exc}", BmcErrorKind.REFUSED), False
        if isinstance(
            exc, sushy_exc.SushyError | AttributeError | TypeError | KeyError | ValueError
        ):
            # Missing/malformed required fields, or JSON of the wrong shape: not Redfish.
            return self._error(
                f"{self._base_url} answered JSON that is not valid Redfish: {_excerpt(str(exc))}",
                BmcErrorKind.PROTOCOL,
            ), True
        raise exc

    def _http_error(self, exc: sushy_exc.HTTPError) -> tuple[BmcError, bool]:
        status = exc.status_code
        words = _bmc_words(exc)
        said = f": {words}" if words else ""
        if isinstance(exc, sushy_exc.ResourceNotFoundError) or status == 404:
            match = re.search(r"Resource (\S+) not found", str(exc))
            where = urlsplit(match.group(1)).path if match else "the resource"
            return self._error(
                f"the BMC has no {where} (HTTP 404){said}", BmcErrorKind.NOT_FOUND
            ), False
        if status is not None and status >= 500 and status != 501:
            return self._error(f"the BMC failed (HTTP {status}){said}", BmcErrorKind.PROTOCOL), True
        busy = bool(self._root is not None and self._root._conn.check_retry_on_exception(exc))
        return self._error(
            f"the BMC refused (HTTP {status}){said or ' without saying why'}", BmcErrorKind.REFUSED
        ), busy

    def _no_answer(self, exc: Exception) -> tuple[BmcError, bool]:
        reason, transient = "no connection", True
        for cause in _chain(exc):
            text = str(cause)
            lowered = text.lower()
            if isinstance(cause, requests.exceptions.SSLError):
                reason, transient = f"TLS handshake failed ({_tls_reason(cause)})", False
                break
            if isinstance(cause, requests.exceptions.ConnectTimeout):
                reason = "connection timed out"
                break
            if isinstance(cause, requests.exceptions.ReadTimeout):
                reason = f"no reply within {self.timeout_s:g} s"
                break
            if isinstance(cause, requests.exceptions.ConnectionError):
                if "refused" in lowered:
                    reason = "connection refused"
                elif any(
                    s in lowered
                    for s in ("name or service not known", "name resolution", "nodename nor")
                ):
                    reason = "its name does not resolve"
                elif "timed out" in lowered:
                    reason = "connection timed out"
                elif "reset" in lowered:
                    reason = "connection reset"
                elif "remotedisconnected" in lowered or "without response" in lowered:
                    reason = "it closed the connection without answering"
                else:
                    reason = _excerpt(text, 120)
                break
        error = self._error(f"no answer from {self._base_url}: {reason}", BmcErrorKind.UNREACHABLE)
        return error, transient

    # ---- session and system -----------------------------------------------------------------

    def _service(self) -> Any:
        if self._root is None:
            connector = _Connector(
                self._base_url,
                verify=self.access.verify_tls,
                server_side_retries=1,
                server_side_retries_delay=0,
                default_request_timeout=self.timeout_s,
                # All tries of a BMC that does not answer fit in about `timeout_s`.
                connect_timeout=max(1.0, min(10.0, self.timeout_s / (self.retries + 1))),
            )
            # Credentials on the root request too: a few BMCs protect the service root.
            connector.set_http_basic_auth(self.access.username, self.access.password)
            try:
                self._root = sushy.Sushy(
                    self._base_url,
                    auth=BasicAuth(username=self.access.username, password=self.access.password),
                    connector=connector,
                )
            except Exception:
                connector.close()
                raise
        return self._root

    def _system_path(self, root: Any) -> str:
        wanted = self.access.system_id.strip()
        collection = (
            _str((root.json.get("Systems") or {}).get("@odata.id")) or "/redfish/v1/Systems"
        )
        if wanted:
            if "://" in wanted:
                wanted = urlsplit(wanted).path
            if wanted.startswith("/"):
                return wanted.rstrip("/")
            return f"{collection.rstrip('/')}/{quote(wanted, safe='')}"
        members = root.get_system_collection().members_identities
        if len(members) == 1:
            return str(members[0])
        if not members:
            raise BmcError("the BMC lists no systems", kind=BmcErrorKind.NOT_FOUND)
        raise BmcError(
            f"the BMC manages {len(members)} systems; set the system id to say which one",
            kind=BmcErrorKind.NOT_FOUND,
        )

    def _system(self, *, fresh: bool = False) -> Any:
        if self._system_obj is None:
            root = self._service()
            path = self._system_path(root)
            try:
                self._system_obj = root.get_system(path)
            except sushy_exc.ResourceNotFoundError as exc:
                words = _bmc_words(exc)
                raise BmcError(
                    f"the BMC has no system {self.access.system_id or path!r}"
                    + (f" ({words})" if words else ""),
                    kind=BmcErrorKind.NOT_FOUND,
                ) from None
        elif fresh:
            self._system_obj.refresh()
        return self._system_obj

    def close(self) -> None:
        root, self._root, self._system_obj = self._root, None, None
        if root is not None:
            root._conn.close()

    # ---- power ------------------------------------------------------------------------------

    def power_state(self) -> str:
        system = self._call(lambda: self._system(fresh=True))
        return _str(system.json.get("PowerState"))

    def power(self, action: str) -> None:
        if action not in (*_POWER_RESETS, "cycle"):
            raise ValueError(f"unknown power action {action!r}: use on, off, shutdown or cycle")

        def run() -> None:
            system = self._system(fresh=True)
            state = _str(system.json.get("PowerState"))
            if action == "cycle":
                wanted = _RESTART_RESETS if state in _ON_STATES else _POWER_RESETS["on"]
            elif (action == "on" and state == "On") or (action != "on" and state == "Off"):
                return  # already there; some BMCs refuse a reset to the state they are in
            else:
                wanted = _POWER_RESETS[action]
            allowed = system.get_allowed_reset_system_values()
            offered = [v.value for v in sushy.ResetType if v in allowed]
            choice = next((w for w in wanted if w in offered), None)
            if choice is None:
                raise BmcError(
                    f"the BMC does not offer {' or '.join(wanted)} for this system "
                    f"(it offers {', '.join(offered) or 'no reset types'})",
                    kind=BmcErrorKind.REFUSED,
                )
            system.reset_system(sushy.ResetType(choice))

        self._call(run)

    # ---- boot and virtual media -------------------------------------------------------------

    def set_one_time_boot(self, device: BootDevice) -> None:
        target = _BOOT_TARGETS[BootDevice(device)]

        def run() -> None:
            system = self._system(fresh=True)
            offered = list(system.boot.allowed_values or ()) if system.boot else []
            if offered and target not in offered:
                raise BmcError(
                    f"the BMC cannot boot this system from {target} "
                    f"(it offers {', '.join(map(str, offered))})",
                    kind=BmcErrorKind.REFUSED,
                )
            system.set_system_boot_options(
                target=sushy.BootSource(target), enabled=sushy.BootSourceOverrideEnabled.ONCE
            )

        self._call(run)

    def _cd_drive(self) -> Any:
        system = self._system()
        owners = [system] if "VirtualMedia" in system.json else []
        if "ManagedBy" in (system.json.get("Links") or {}):
            owners.extend(m for m in system.managers if "VirtualMedia" in m.json)
        for owner in owners:
            for drive in owner.virtual_media.get_members():
                if _CD_MEDIA & set(drive.media_types or ()):
                    return drive
        raise BmcError(
            "the BMC offers no virtual CD/DVD drive for this system", kind=BmcErrorKind.NOT_FOUND
        )

    def insert_media(self, image_url: str) -> None:
        if urlsplit(image_url).scheme not in ("http", "https"):
            raise ValueError(f"the image URL must be http(s)://…, not {image_url!r}")

        def run() -> None:
            drive = self._cd_drive()
            if drive.inserted or drive.image:
                drive.eject_media()
            drive.insert_media(image_url, inserted=True, write_protected=True)

        self._call(run)

    def eject_media(self) -> None:
        def run() -> None:
            drive = self._cd_drive()
            if drive.inserted or drive.image:
                drive.eject_media()

        self._call(run)

    # ---- inventory --------------------------------------------------------------------------

    def _section(self, fn: Callable[[], T]) -> T | None:
        """An optional part of the inventory: None when the BMC does not report it."""
        try:
            return self._call(fn, retry_answers=False)
        except BmcError:
            return None

    def inventory(self) -> Inventory:
        system = self._call(lambda: self._system(fresh=True))
        doc: dict[str, Any] = system.json
        missing: list[str] = []
        summary = doc.get("ProcessorSummary") or {}

        processors = (
            self._section(lambda: [p.json for p in system.processors.get_members()])
            if "Processors" in doc
            else None
        )
        gpus: list[Gpu] = []
        cpus: list[dict[str, Any]] = []
        if processors is not None:
            for proc in processors:
                kind = _str(proc.get("ProcessorType"))
                if kind in _GPU_TYPES:
                    gpus.append(
                        Gpu(
                            model=_str(proc.get("Model")) or _str(proc.get("Name")),
                            vendor=_str(proc.get("Manufacturer")),
                            serial=_str(proc.get("SerialNumber")),
                        )
                    )
                elif kind in ("CPU", ""):
                    cpus.append(proc)
        cpu_count = len(cpus) or _int(summary.get("Count"))
        cpu_model = next((_str(c.get("Model")) for c in cpus if c.get("Model")), "") or _str(
            summary.get("Model")
        )
        cores = [n for n in (_int(c.get("TotalCores")) for c in cpus) if n is not None]
        cpu_cores = sum(cores) if cores else _int(summary.get("CoreCount"))
        if not cpu_count:
            missing.append("cpus")
        if processors is None:
            missing.append("gpus")

        memory_gib = self._memory_gib(system, doc)
        if memory_gib is None:
            missing.append("memory")

        nics = self._section(lambda: self._nics(system)) if "EthernetInterfaces" in doc else None
        if nics is None:
            missing.append("nics")

        disks = self._section(lambda: self._storage_disks(system)) if "Storage" in doc else None
        if disks is None and "SimpleStorage" in doc:
            disks = self._section(lambda: self._simple_storage_disks(system))
        if disks is None:
            missing.append("disks")

        console_url = ""
        if "ManagedBy" in (doc.get("Links") or {}):
            consoles = self._section(
                lambda: [(m.json.get("GraphicalConsole") or {}) for m in system.managers]
            )
            if consoles is None:
                missing.append("console")
            elif any(c.get("ServiceEnabled") for c in consoles):
                console_url = self._base_url + "/"

        status = doc.get("Status") or {}
        return Inventory(
            system_id=_str(doc.get("Id")),
            power_state=_str(doc.get("PowerState")),
            health=_str(status.get("Health")),
            manufacturer=_str(doc.get("Manufacturer")),
            model=_str(doc.get("Model")),
            serial=_str(doc.get("SerialNumber")),
            cpu_count=cpu_count or None,
            cpu_model=cpu_model,
            cpu_cores=cpu_cores,
            memory_gib=memory_gib,
            gpus=tuple(gpus),
            nics=tuple(nics or ()),
            disks=tuple(disks or ()),
            console_url=console_url,
            missing=tuple(missing),
        )

    def _memory_gib(self, system: Any, doc: dict[str, Any]) -> float | None:
        total = (doc.get("MemorySummary") or {}).get("TotalSystemMemoryGiB")
        if isinstance(total, int | float) and not isinstance(total, bool) and total > 0:
            return float(total)
        path = _str((doc.get("Memory") or {}).get("@odata.id"))
        if not path:
            return None

        def read() -> float | None:
            conn = system._conn
            members = conn.get(path).json().get("Members") or []
            mib = 0
            for member in members:
                mib += _int(conn.get(member["@odata.id"]).json().get("CapacityMiB")) or 0
            return mib / 1024 if mib else None

        return self._section(read)

    @staticmethod
    def _nics(system: Any) -> list[Nic]:
        nics = []
        for nic in system.ethernet_interfaces.get_members():
            mac = _str(nic.json.get("MACAddress")) or _str(nic.json.get("PermanentMACAddress"))
            nics.append(
                Nic(
                    name=_str(nic.json.get("Id")) or _str(nic.json.get("Name")),
                    mac=mac.lower(),
                    speed_mbps=_int(nic.json.get("SpeedMbps")),
                )
            )
        return nics

    @staticmethod
    def _storage_disks(system: Any) -> list[Disk]:
        disks = []
        for storage in system.storage.get_members():
            for drive in storage.drives:
                disks.append(
                    Disk(
                        name=_str(drive.json.get("Name")) or _str(drive.json.get("Id")),
                        capacity_bytes=_int(drive.json.get("CapacityBytes")),
                        media_type=_str(drive.json.get("MediaType")),
                    )
                )
        return disks

    @staticmethod
    def _simple_storage_disks(system: Any) -> list[Disk]:
        disks = []
        for storage in system.simple_storage.get_members():
            for device in storage.json.get("Devices") or ():
                disks.append(
                    Disk(
                        name=_str(device.get("Name")),
                        capacity_bytes=_int(device.get("CapacityBytes")),
                    )
                )
        return disks


def _tls_reason(exc: requests.exceptions.SSLError) -> str:
    """The innermost `ssl` error of a requests SSLError, in a few words."""
    inner: Any = exc.args[0] if exc.args else None
    inner = getattr(inner, "reason", inner)
    for _ in range(4):
        if isinstance(inner, ssl.SSLCertVerificationError):
            return (
                f"certificate not trusted: {str(inner.verify_message).rstrip('.')}; "
                "turn TLS verification off for a BMC with a self-signed certificate"
            )
        if isinstance(inner, ssl.SSLError):
            return str(inner.reason or inner)
        inner = inner.args[0] if isinstance(inner, BaseException) and inner.args else None
    return "TLS error"


def _action_name(exc: Exception) -> str:
    match = re.search(r"action (\S+)", str(exc))
    return match.group(1) if match else "requested"
