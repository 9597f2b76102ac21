"""Bare-metal servers and their BMCs: registration (one or a file of many), inventory, power.

BMC passwords are stored encrypted (`ogai.crypto`) and leave the database only inside a
`BmcAccess` handed to a driver: never in an audit event, a log line or an error message.
"""

import logging
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.choices import (
    ACTIVE_RUN_STATES,
    LIVE_LEASE_STATES,
    PowerAction,
    ServerAllocation,
    ServerState,
)
from infra_os.drivers import BmcAccess, BmcDriver, BmcError, get_bmc_driver
from infra_os.drivers.base import Inventory
from infra_os.models import Bmc, InventorySnapshot, Rack, Server
from infra_os.services.audit import audit_record
from ogai.crypto import decrypt, encrypt
from ogai.models import assign_changes

logger = logging.getLogger(__name__)

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
SERVER_FIELDS = ("rack", "description", "expected_gpu_model", "expected_gpu_count")


def bmc_driver(server: Server) -> BmcDriver:
    """A driver for the server's BMC, with its credentials decrypted."""
    bmc = server.bmc
    access = BmcAccess(address=bmc.address, username=bmc.username,
                       password=decrypt(bmc.password_encrypted), system_id=bmc.system_id,
                       verify_tls=bmc.verify_tls)
    return get_bmc_driver(bmc.driver, access)


def normalise_mac(value: str) -> str:
    mac = value.strip().lower().replace("-", ":")
    if mac and not MAC_RE.match(mac):
        raise ValidationError({"boot_mac": "This is not a MAC address (aa:bb:cc:dd:ee:ff)."})
    return mac


def _rack_named(name: str) -> Rack | None:
    if not name:
        return None
    rack = Rack.objects.filter(name=name).first()
    if rack is None:
        rack = Rack(name=name)
        rack.full_clean()
        rack.save()
    return rack


def _build(*, name: str = "", bmc_address: str = "", bmc_username: str = "",
           bmc_password: str = "",
           rack: str = "", system_id: str = "", verify_tls: bool = True, bmc_driver: str = "",
           expected_gpu_model: str = "", expected_gpu_count: int = 0, description: str = "",
           boot_mac: str = "") -> tuple[Server, Bmc, str]:
    """Validate one server and its BMC without saving; returns them and the rack name."""
    errors: dict[str, list[str]] = {}
    server = Server(name=name, description=description, expected_gpu_model=expected_gpu_model,
                    expected_gpu_count=expected_gpu_count)
    try:
        server.boot_mac = normalise_mac(boot_mac)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    try:
        server.full_clean(exclude=["rack"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    driver = bmc_driver or "redfish"
    if driver not in settings.OGAI_BMC_DRIVERS:
        errors["bmc_driver"] = [f"Unknown BMC driver {driver!r}; known: "
                                f"{', '.join(sorted(settings.OGAI_BMC_DRIVERS))}."]
    if not bmc_username:
        errors["bmc_username"] = ["The BMC needs a user name."]
    if not bmc_password:
        errors["bmc_password"] = ["The BMC needs a password."]
    if "@" in bmc_address.split("//", 1)[-1].split("/", 1)[0]:
        errors["bmc_address"] = ["Give the BMC's user name and password in their own fields, "
                                 "not in the address."]
    bmc = Bmc(driver=driver, address=bmc_address.rstrip("/"), system_id=system_id,
              verify_tls=verify_tls, username=bmc_username)
    try:
        bmc.full_clean(exclude=["server", "username", "password_encrypted"])
    except ValidationError as exc:
        errors.update({f"bmc_{key}": value for key, value in exc.message_dict.items()})
    if errors:
        raise ValidationError(errors)
    bmc.password_encrypted = encrypt(bmc_password)
    return server, bmc, rack


def _save(server: Server, bmc: Bmc, rack: str) -> Server:
    server.rack = _rack_named(rack)
    server.save()
    bmc.server = server
    bmc.save()
    return server


def _registered(actor, servers: list[Server]) -> None:
    for server in servers:
        audit_record(actor=actor, action="server.register", obj=server,
                     changes={"bmc_address": server.bmc.address, "rack": str(server.rack or ""),
                              "expected_gpus": f"{server.expected_gpu_count} x "
                              f"{server.expected_gpu_model}".strip()})
    ids = [server.pk for server in servers]
    transaction.on_commit(lambda: _enqueue_inventory(ids))


@transaction.atomic
def server_register(*, actor, **fields) -> Server:
    """Register one server with its BMC; its inventory is read in the background."""
    require_platform_admin(actor)
    server = _save(*_build(**fields))
    _registered(actor, [server])
    return server


@transaction.atomic
def server_import(*, actor, rows: list[dict]) -> list[Server]:
    """Register many servers at once: all of them, or none when any row is wrong (every wrong
    row is named with what to fix)."""
    require_platform_admin(actor)
    if not rows:
        raise ValidationError({"file": "The file lists no servers."})
    built, problems, seen = [], [], set()
    existing = set(Server.objects.filter(name__in=[r.get("name") for r in rows])
                   .values_list("name", flat=True))
    for number, row in enumerate(rows, start=1):
        label = f"row {number}" + (f" ({row.get('name')})" if row.get("name") else "")
        try:
            if row.get("name") in seen:
                raise ValidationError({"name": "This name appears twice in the file."})
            if row.get("name") in existing:
                raise ValidationError({"name": "A server with this name already exists."})
            seen.add(row.get("name"))
            built.append(_build(**row))
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                problems.append(f"{label}: {field}: {' '.join(messages)}")
        except TypeError:
            allowed = ", ".join(IMPORT_COLUMNS)
            problems.append(f"{label}: unknown column; the columns are {allowed}.")
    if problems:
        raise ValidationError({"file": problems})
    servers = [_save(*item) for item in built]
    _registered(actor, servers)
    return servers


# What a row of a server file may hold (CSV header or JSON keys).
IMPORT_COLUMNS = ("name", "rack", "bmc_address", "bmc_username", "bmc_password", "system_id",
                  "verify_tls", "bmc_driver", "expected_gpu_model", "expected_gpu_count",
                  "description", "boot_mac")


@transaction.atomic
def server_update(*, actor, server: Server, **fields) -> Server:
    require_platform_admin(actor)
    if "rack" in fields and not isinstance(fields["rack"], Rack | None):
        fields["rack"] = _rack_named(fields["rack"])
    changes = assign_changes(server, fields, allowed=SERVER_FIELDS)
    server.full_clean()
    server.save()
    if changes:
        audit_record(actor=actor, action="server.update", obj=server,
                     changes={k: {"from": str(v["from"]), "to": str(v["to"])}
                              for k, v in changes.items()})
    return server


@transaction.atomic
def bmc_update(*, actor, server: Server, address: str | None = None, username: str | None = None,
               password: str | None = None, system_id: str | None = None,
               verify_tls: bool | None = None) -> Bmc:
    """Change how the BMC is reached; a new password replaces the old one (never shown)."""
    require_platform_admin(actor)
    bmc = server.bmc
    changed = []
    if address and "@" in address.split("//", 1)[-1].split("/", 1)[0]:
        raise ValidationError({"bmc_address": "Give the BMC's user name and password in their "
                               "own fields, not in the address."})
    if address is not None:
        address = address.rstrip("/")
    moved = (address is not None and address != bmc.address) or \
        (verify_tls is False and bmc.verify_tls)
    if moved and not password:
        raise ValidationError({"password": "Give the BMC password again when its address "
                               "changes or TLS verification is turned off: the stored one is "
                               "only ever sent to the BMC it was given for."})
    fields: tuple[tuple[str, str | bool | None], ...] = (
        ("address", address), ("username", username), ("system_id", system_id),
        ("verify_tls", verify_tls))
    for field, value in fields:
        if value is not None and getattr(bmc, field) != value:
            setattr(bmc, field, value)
            changed.append(field)
    if password:
        bmc.password_encrypted = encrypt(password)
        changed.append("password")
    try:
        bmc.full_clean(exclude=["server", "username", "password_encrypted"])
    except ValidationError as exc:
        raise ValidationError({f"bmc_{k}": v for k, v in exc.message_dict.items()}) from None
    bmc.save()
    if changed:
        audit_record(actor=actor, action="server.bmc_update", obj=server,
                     changes={"fields": changed})
        transaction.on_commit(lambda: _enqueue_inventory([server.pk]))
    return bmc


@transaction.atomic
def server_delete(*, actor, server: Server) -> None:
    """Forget a server. One with a live lease, a provisioning run under way or a place in a
    cluster is refused; one with leases in its history is kept for billing: retire it."""
    require_platform_admin(actor)
    if server.leases.filter(state__in=LIVE_LEASE_STATES).exists():
        raise ValidationError("This server is leased: end its lease first.")
    if server.provisioning_runs.filter(state__in=ACTIVE_RUN_STATES).exists():
        raise ValidationError("This server is being provisioned: cancel its batch first.")
    if server.allocation == ServerAllocation.CLUSTER:
        raise ValidationError(f"This server is a node of {server.allocated_to}: take it out "
                              "of the cluster first.")
    audit_record(actor=actor, action="server.delete", obj=server)
    try:
        with transaction.atomic():
            server.delete()
    except ProtectedError:
        raise ValidationError("This server has leases on record (billing keeps them): retire "
                              "it instead of deleting it.") from None


@transaction.atomic
def server_retire(*, actor, server: Server) -> Server:
    require_platform_admin(actor)
    if server.leases.filter(state__in=LIVE_LEASE_STATES).exists():
        raise ValidationError("This server is leased: end its lease first.")
    if server.provisioning_runs.filter(state__in=ACTIVE_RUN_STATES).exists():
        raise ValidationError("This server is being provisioned: cancel its batch first.")
    server.state = ServerState.RETIRED
    server.save(update_fields=["state", "updated_at"])
    audit_record(actor=actor, action="server.retire", obj=server)
    return server


@transaction.atomic
def rack_create(*, actor, name: str, location: str = "") -> Rack:
    require_platform_admin(actor)
    rack = Rack(name=name, location=location)
    rack.full_clean()
    rack.save()
    audit_record(actor=actor, action="rack.create", obj=rack)
    return rack


@transaction.atomic
def rack_delete(*, actor, rack: Rack) -> None:
    """Forget a rack; its servers stay, in no rack."""
    require_platform_admin(actor)
    audit_record(actor=actor, action="rack.delete", obj=rack,
                 changes={"servers": rack.servers.count()})
    rack.delete()


def server_refresh_request(*, actor, server: Server) -> None:
    """Read the inventory again, in the background."""
    require_platform_admin(actor)
    _enqueue_inventory([server.pk])


def expected_mismatches(server: Server, inventory: Inventory) -> list[str]:
    """What the BMC reports that differs from what the operator said to expect, in words."""
    found = []
    expected = server.expected_gpu_count
    model = server.expected_gpu_model
    if expected or model:
        want = f"{expected} x {model}".strip() if expected else model
        if "gpus" in inventory.missing or "processors" in inventory.missing:
            found.append(f"The BMC does not report GPUs: cannot check the expected {want}.")
        else:
            if expected and len(inventory.gpus) != expected:
                found.append(f"Expected {expected} GPUs, the BMC reports {len(inventory.gpus)}.")
            wrong = sorted({gpu.model for gpu in inventory.gpus
                            if model and model.lower() not in gpu.model.lower()})
            if wrong:
                found.append(f"Expected {model} GPUs, the BMC reports {', '.join(wrong)}.")
    if inventory.health and inventory.health != "OK":
        found.append(f"The BMC reports the server's health as {inventory.health}.")
    return found


def inventory_data(inventory: Inventory) -> dict:
    return {
        "system": {"id": inventory.system_id, "manufacturer": inventory.manufacturer,
                   "model": inventory.model, "serial": inventory.serial},
        "cpus": {"count": inventory.cpu_count, "model": inventory.cpu_model,
                 "cores": inventory.cpu_cores},
        "memory_gib": inventory.memory_gib,
        "gpus": [{"model": g.model, "vendor": g.vendor, "serial": g.serial}
                 for g in inventory.gpus],
        "nics": [{"name": n.name, "mac": n.mac.lower(), "speed_mbps": n.speed_mbps}
                 for n in inventory.nics],
        "disks": [{"name": d.name, "capacity_bytes": d.capacity_bytes,
                   "media_type": d.media_type} for d in inventory.disks],
    }


def _bmc_failed(server: Server, exc: BmcError) -> None:
    Server.objects.filter(pk=server.pk).update(bmc_error=str(exc), updated_at=timezone.now())
    logger.warning("Server %s: BMC call failed (%s): %s", server.name, exc.kind, exc)


def server_refresh_inventory(*, server: Server) -> InventorySnapshot | None:
    """Ask the BMC what the server is and keep it as a snapshot; None when the BMC failed
    (its words are kept in `server.bmc_error`)."""
    driver = bmc_driver(server)
    try:
        inventory = driver.inventory()
    except BmcError as exc:
        _bmc_failed(server, exc)
        return None
    finally:
        driver.close()
    mismatches = expected_mismatches(server, inventory)
    models = sorted({gpu.model for gpu in inventory.gpus})
    with transaction.atomic():
        snapshot = InventorySnapshot.objects.create(
            server=server, power_state=inventory.power_state, health=inventory.health,
            data=inventory_data(inventory), missing=list(inventory.missing),
            mismatches=mismatches)
        server.power_state = inventory.power_state
        server.health = inventory.health
        server.gpu_model = ", ".join(models)
        server.gpu_count = len(inventory.gpus)
        server.mismatches = mismatches
        server.console_url = inventory.console_url
        server.last_seen_at = snapshot.taken_at
        server.bmc_error = ""
        if not server.boot_mac and inventory.nics:
            try:
                server.boot_mac = normalise_mac(inventory.nics[0].mac)
            except ValidationError:
                logger.warning("Server %s: the BMC reports a NIC with an unreadable MAC",
                               server.name)
        server.save(update_fields=["power_state", "health", "gpu_model", "gpu_count",
                                   "mismatches", "console_url", "last_seen_at", "bmc_error",
                                   "boot_mac", "updated_at"])
    return snapshot


def server_power_request(*, actor, servers: list[Server], action: str) -> int:
    """Ask for a power action on each server (done in the background on the `provision`
    queue, every server on its own). Servers being provisioned are refused: the batch owns
    their power."""
    require_platform_admin(actor)
    if action not in PowerAction.values:
        raise ValidationError({"action": f"Unknown power action {action!r}; use one of "
                               f"{', '.join(PowerAction.values)}."})
    busy = sorted(Server.objects.filter(
        pk__in=[s.pk for s in servers], provisioning_runs__state__in=ACTIVE_RUN_STATES,
    ).values_list("name", flat=True).distinct())
    if busy:
        raise ValidationError({"servers": f"Being provisioned, so their power is the batch's: "
                               f"{', '.join(busy)}."})
    with transaction.atomic():
        for server in servers:
            audit_record(actor=actor, action=f"server.power_{action}", obj=server)
        ids = [server.pk for server in servers]
        transaction.on_commit(lambda: _enqueue_power(ids, action))
    return len(servers)


def server_power_now(*, server: Server, action: str) -> str:
    """Do a power action through the BMC now; returns the power state it reports after."""
    driver = bmc_driver(server)
    try:
        driver.power(action)
        state = driver.power_state()
    except BmcError as exc:
        _bmc_failed(server, exc)
        raise
    finally:
        driver.close()
    Server.objects.filter(pk=server.pk).update(power_state=state, bmc_error="",
                                               last_seen_at=timezone.now())
    return state


def _enqueue_inventory(ids: list[int]) -> None:
    from infra_os.tasks import refresh_inventory

    for pk in ids:
        refresh_inventory.delay(server_id=pk)


def _enqueue_power(ids: list[int], action: str) -> None:
    from infra_os.tasks import power_server

    for pk in ids:
        power_server.delay(server_id=pk, action=action)
