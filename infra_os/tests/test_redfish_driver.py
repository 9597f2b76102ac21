"""The Redfish BMC driver against sushy-tools: the fake-driver emulator (24 systems, Basic auth)
and sushy-static serving a GPU-server mockup; plus BMCs that refuse, vanish or answer garbage."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest

from infra_os.drivers.base import BmcAccess, BmcError, BmcErrorKind, BootDevice
from infra_os.drivers.redfish import RedfishBmc
from tests.redfish.emulator import MOCKUP_DIR, StaticRedfish
from tests.redfish.fixtures import EMULATOR_PASSWORD, EMULATOR_SYSTEMS

H100 = "NVIDIA H100 80GB HBM3"


def _wait_for_power(drivers: dict[str, RedfishBmc], wanted: str, timeout_s: float = 15) -> None:
    """Poll every driver every 0.5 s until each reads `wanted` (the emulator takes 1-11 s)."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(drivers)
    while waiting:
        for name, driver in list(waiting.items()):
            if driver.power_state() == wanted:
                del waiting[name]
        if not waiting:
            return
        assert time.monotonic() < deadline, f"still not {wanted}: {sorted(waiting)}"
        time.sleep(0.5)


# ---- inventory --------------------------------------------------------------------------------


def test_inventory_of_an_emulated_system(redfish_emulator):
    system = redfish_emulator.claim()[0]
    assert len(system.macs) == 2
    driver = RedfishBmc(redfish_emulator.access(system))

    inventory = driver.inventory()

    assert inventory.system_id == system.uuid
    assert inventory.power_state == "Off"
    assert inventory.health == "OK"
    assert inventory.manufacturer == "Sushy Emulator"
    assert [nic.mac for nic in inventory.nics] == list(system.macs)
    # The fake driver implements no processors, memory or storage: reported as missing, not
    # as "none", and the inventory still comes back.
    assert set(inventory.missing) == {"cpus", "gpus", "memory", "disks"}
    assert inventory.gpus == () and inventory.cpu_count is None and inventory.memory_gib is None
    assert inventory.console_url == ""
    assert driver.bmc_seconds > 0


def test_inventory_of_the_static_gpu_server(redfish_static):
    driver = RedfishBmc(redfish_static.access())  # no system id: the BMC's only system

    inventory = driver.inventory()

    assert inventory.system_id == "1"
    assert (inventory.manufacturer, inventory.model) == ("Supermicro", "SYS-821GE-TNHR")
    assert inventory.serial == "S454387X4A12345"
    assert inventory.power_state == "On" and inventory.health == "OK"
    assert len(inventory.gpus) == 8
    assert {(gpu.model, gpu.vendor) for gpu in inventory.gpus} == {(H100, "NVIDIA")}
    assert len({gpu.serial for gpu in inventory.gpus}) == 8
    assert inventory.cpu_count == 2
    assert inventory.cpu_model == "Intel(R) Xeon(R) Platinum 8480+"
    assert inventory.cpu_cores == 112  # 2 x 56
    assert inventory.memory_gib == 2048
    assert [(nic.mac, nic.speed_mbps) for nic in inventory.nics] == [
        ("3c:ec:ef:a1:00:01", 100000),
        ("3c:ec:ef:a1:00:02", 25000),
    ]
    assert [(d.name, d.capacity_bytes, d.media_type) for d in inventory.disks] == [
        ("nvme0", 3840755982336, "SSD"),
        ("nvme1", 3840755982336, "SSD"),
    ]
    assert inventory.console_url == redfish_static.url + "/"
    assert inventory.missing == ()


def test_system_id_may_be_a_full_path(redfish_emulator):
    system = redfish_emulator.claim()[0]
    access = redfish_emulator.access(f"/redfish/v1/Systems/{system.uuid}")
    assert RedfishBmc(access).inventory().system_id == system.uuid


# ---- power, boot, virtual media ---------------------------------------------------------------


def test_power_on_off_shutdown_and_cycle(redfish_emulator):
    first, second, third = redfish_emulator.claim(3)
    drivers = {s.name: RedfishBmc(redfish_emulator.access(s)) for s in (first, second, third)}
    one, two, three = drivers.values()

    one.power("on")
    two.power("on")
    three.power("cycle")  # from off: switched on
    _wait_for_power(drivers, "On")
    assert {redfish_emulator.power_state(s.uuid) for s in (first, second, third)} == {"On"}

    one.power("off")
    two.power("shutdown")
    _wait_for_power({first.name: one, second.name: two}, "Off")
    assert redfish_emulator.power_state(third.uuid) == "On"  # the others left alone


def test_cycle_of_a_running_server_restarts_it(redfish_static):
    driver = RedfishBmc(redfish_static.access())
    driver.power("cycle")  # the mockup is On
    assert redfish_static.bodies()[-1] == {"ResetType": "ForceRestart"}
    driver.power("off")
    assert redfish_static.bodies()[-1] == {"ResetType": "ForceOff"}


def test_power_to_the_state_it_is_in_sends_nothing(redfish_static):
    before = len(redfish_static.bodies())
    RedfishBmc(redfish_static.access()).power("on")  # the mockup is On
    assert len(redfish_static.bodies()) == before


def test_a_reset_the_system_does_not_offer_is_refused_with_the_list(tmp_path):
    mockup = tmp_path / "mockup"
    shutil.copytree(MOCKUP_DIR, mockup)
    system_file = mockup / "Systems" / "1" / "index.json"
    doc = json.loads(system_file.read_text())
    doc["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = [
        "On",
        "ForceOff",
    ]
    system_file.write_text(json.dumps(doc))
    with StaticRedfish(mockup) as static:
        with pytest.raises(BmcError) as caught:
            RedfishBmc(static.access()).power("shutdown")
        assert caught.value.kind is BmcErrorKind.REFUSED
        assert str(caught.value) == (
            "the BMC does not offer GracefulShutdown for this system (it offers On, ForceOff)"
        )
        assert static.bodies() == []


def test_unknown_power_action_is_bad_input(redfish_static):
    with pytest.raises(ValueError, match="use on, off, shutdown or cycle"):
        RedfishBmc(redfish_static.access()).power("reboot")


def test_one_time_boot(redfish_emulator, redfish_static):
    system = redfish_emulator.claim()[0]
    driver = RedfishBmc(redfish_emulator.access(system))

    driver.set_one_time_boot(BootDevice.PXE)
    assert redfish_emulator.system_json(system.uuid)["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    driver.set_one_time_boot(BootDevice.CD)
    assert redfish_emulator.system_json(system.uuid)["Boot"]["BootSourceOverrideTarget"] == "Cd"

    # What is sent (the emulator ignores BootSourceOverrideEnabled and always reads Continuous).
    static = RedfishBmc(redfish_static.access())
    static.set_one_time_boot(BootDevice.PXE)
    assert redfish_static.bodies()[-1] == {
        "Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}
    }
    static.set_one_time_boot(BootDevice.CD)  # a Supermicro boots virtual media as UsbCd
    assert redfish_static.bodies()[-1]["Boot"]["BootSourceOverrideTarget"] == "UsbCd"


def test_virtual_media_insert_and_eject(redfish_emulator, image_server):
    system = redfish_emulator.claim()[0]
    driver = RedfishBmc(redfish_emulator.access(system))

    driver.insert_media(image_server.url)
    media = redfish_emulator.virtual_media(system.uuid)
    assert media["Image"] == image_server.url
    assert media["Inserted"] is True and media["WriteProtected"] is True
    assert image_server.downloads == 1  # the emulator really fetched it

    driver.insert_media(image_server.url)  # again: ejects what is there, inserts anew
    assert redfish_emulator.virtual_media(system.uuid)["Inserted"] is True

    driver.eject_media()
    media = redfish_emulator.virtual_media(system.uuid)
    assert media["Inserted"] is False and media["Image"] == ""
    driver.eject_media()  # nothing inserted: nothing to do, no error


def test_virtual_media_of_the_manager(redfish_static, image_server):
    """No VirtualMedia on the system: the manager's CD drive is used."""
    RedfishBmc(redfish_static.access()).insert_media(image_server.url)
    assert redfish_static.bodies()[-1] == {"Image": image_server.url}


def test_image_the_bmc_cannot_fetch_is_refused_in_its_words(redfish_emulator, image_server):
    system = redfish_emulator.claim()[0]
    with pytest.raises(BmcError) as caught:
        RedfishBmc(redfish_emulator.access(system)).insert_media(image_server.url + ".missing")
    assert caught.value.kind is BmcErrorKind.REFUSED
    assert "Cannot download virtual media: got error 404" in str(caught.value)


# ---- failures ---------------------------------------------------------------------------------


def test_wrong_password_is_an_auth_error(redfish_emulator):
    system = redfish_emulator.claim()[0]
    driver = RedfishBmc(redfish_emulator.access(system, password="not-the-password"), retries=2)
    with pytest.raises(BmcError) as caught:
        driver.inventory()
    assert caught.value.kind is BmcErrorKind.AUTH
    assert str(caught.value) == "the BMC refused the credentials (HTTP 401)"
    assert not caught.value.retryable


def test_unreachable_bmc_fails_within_the_timeout(unreachable_bmc_url):
    driver = RedfishBmc(BmcAccess(unreachable_bmc_url, "admin", "secret"), timeout_s=5, retries=2)
    started = time.monotonic()
    with pytest.raises(BmcError) as caught:
        driver.power_state()
    assert time.monotonic() - started < 5
    assert caught.value.kind is BmcErrorKind.UNREACHABLE
    assert str(caught.value) == f"no answer from {unreachable_bmc_url}: connection refused"
    assert caught.value.retryable
    assert driver.bmc_seconds > 0


def test_garbage_answers_are_a_protocol_error_after_retries(garbage_bmc):
    driver = RedfishBmc(BmcAccess(garbage_bmc.url, "admin", "secret"), retries=2)
    with pytest.raises(BmcError) as caught:
        driver.inventory()
    assert caught.value.kind is BmcErrorKind.PROTOCOL
    assert "answered something that is not Redfish JSON" in str(caught.value)
    assert "<h1>Welcome</h1>" in str(caught.value)  # an excerpt of what it said
    assert garbage_bmc.hits == 3  # one try and two retries

    before = garbage_bmc.hits
    with pytest.raises(BmcError):
        RedfishBmc(BmcAccess(garbage_bmc.url, "admin", "secret"), retries=0).power_state()
    assert garbage_bmc.hits == before + 1


def test_unknown_system_id_is_not_found(redfish_emulator):
    with pytest.raises(BmcError) as caught:
        RedfishBmc(redfish_emulator.access("no-such-system")).power_state()
    assert caught.value.kind is BmcErrorKind.NOT_FOUND
    assert "no system 'no-such-system'" in str(caught.value)


def test_several_systems_and_no_system_id(redfish_emulator):
    access = BmcAccess(redfish_emulator.url, redfish_emulator.username, EMULATOR_PASSWORD)
    with pytest.raises(BmcError) as caught:
        RedfishBmc(access).inventory()
    assert caught.value.kind is BmcErrorKind.NOT_FOUND
    assert str(caught.value) == (
        f"the BMC manages {EMULATOR_SYSTEMS} systems; set the system id to say which one"
    )


def test_password_never_in_errors_reprs_or_logs(
    redfish_emulator, garbage_bmc, unreachable_bmc_url, caplog
):
    caplog.set_level(logging.DEBUG)
    secret = "Sup3r-Secret-BMC-pw"
    port = unreachable_bmc_url.rsplit(":", 1)[1]
    cases = [
        redfish_emulator.access(redfish_emulator.systems[0], password=secret),  # refused
        BmcAccess(garbage_bmc.url, "admin", secret),
        BmcAccess(unreachable_bmc_url, "admin", secret),
        BmcAccess(f"http://admin:{secret}@127.0.0.1:{port}", "admin", secret),  # in the URL
        redfish_emulator.access("nope"),  # the right password, a wrong system
    ]
    kinds = set()
    for access in cases:
        password = access.password
        if "@" not in access.address:  # BmcAccess shows its address as given
            assert password not in repr(access)
        driver = RedfishBmc(access, retries=0)
        assert password not in repr(driver)
        with pytest.raises(BmcError) as caught:
            driver.inventory()
        kinds.add(caught.value.kind)
        for text in (str(caught.value), repr(caught.value)):
            assert password not in text
    assert kinds == {
        BmcErrorKind.AUTH,
        BmcErrorKind.PROTOCOL,
        BmcErrorKind.UNREACHABLE,
        BmcErrorKind.NOT_FOUND,
    }
    assert caplog.records  # sushy did log: none of it has a password
    assert secret not in caplog.text
    assert EMULATOR_PASSWORD not in caplog.text
