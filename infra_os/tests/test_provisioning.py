"""Provisioning against the Redfish emulator (sushy-tools): the test plays the installed
servers' first-boot agents, reading power straight from the emulator and calling back through
the API with the token the boot-config endpoint hands out by MAC.

The runs are driven in this process (`drive`) so every step is visible; the test in
`test_provisioning_worker.py` drives a batch through a real Celery worker instead."""

import time

import pytest
from django.utils import timezone

from infra_os.choices import BUSY_RUN_STATES, BatchState, RunState, ServerState
from infra_os.models import AuditEvent, ProvisioningBatch, ProvisioningRun, Server
from infra_os.services.provisioning import (
    batch_cancel,
    batch_create,
    batch_fill_slots,
    profile_create,
    run_advance,
)
from infra_os.services.servers import server_refresh_inventory, server_register
from tests.redfish.fixtures import EMULATOR_PASSWORD

BOOT_CONFIG = "/api/v1/infra-os/provisioning/boot-config/"
CALLBACK = "/api/v1/infra-os/provisioning/callback/"


@pytest.fixture(autouse=True)
def _fast_provisioning(settings):
    settings.OGAI_PROVISION_POLL_S = 0.5
    settings.OGAI_PROVISION_RETRY_S = 0.2
    settings.OGAI_BMC_TIMEOUT_S = 2
    settings.OGAI_BMC_RETRIES = 0


def register(operator, emulator, system, *, password=EMULATOR_PASSWORD, address=None, **extra):
    server = server_register(
        actor=operator, name=system.name, bmc_address=address or emulator.url,
        bmc_username=emulator.username, bmc_password=password, system_id=system.uuid,
        verify_tls=False, boot_mac=system.macs[0], **extra)
    return Server.objects.select_related("bmc").get(pk=server.pk)


def register_at(operator, name, address, mac):
    return server_register(actor=operator, name=name, bmc_address=address, bmc_username="admin",
                           bmc_password=EMULATOR_PASSWORD, boot_mac=mac)


@pytest.fixture
def profile(world):
    return profile_create(actor=world.operator, name="ubuntu-gpu",
                          user_data="#cloud-config\nhostname: x\n")


def play_agents(api, emulator, *, silent=frozenset()) -> int:
    """Every server whose run waits for its first boot and that the emulator shows powered on
    fetches its boot config by MAC and calls back. Returns how many called back."""
    called = 0
    waiting = ProvisioningRun.objects.filter(
        state__in=(RunState.REBOOTING, RunState.AWAITING_CALLBACK)).select_related("server__bmc")
    for run in waiting:
        server = run.server
        if server.name in silent or server.bmc.address != emulator.url:
            continue
        if emulator.power_state(server.bmc.system_id) != "On":
            continue
        config = api.get(BOOT_CONFIG, {"mac": server.boot_mac.upper()})
        assert config.status_code == 200, config.content
        assert config.json()["server"] == server.name
        answer = api.post(CALLBACK, {"token": config.json()["token"], "hostname": server.name},
                          format="json")
        assert answer.status_code == 200, answer.content
        called += 1
    return called


def drive(batch, api, emulator, *, silent=frozenset(), timeout_s=90.0) -> int:
    """Advance the batch's runs as the `provision` queue would, until it finishes; returns the
    most runs that were busy at once."""
    deadline = time.monotonic() + timeout_s
    most_busy = 0
    while time.monotonic() < deadline:
        batch_fill_slots(batch_id=batch.pk)
        batch.refresh_from_db()
        if batch.state != BatchState.RUNNING:
            return most_busy
        runs = ProvisioningRun.objects.filter(batch=batch, state__in=BUSY_RUN_STATES)
        most_busy = max(most_busy, runs.count())
        for run in runs.filter(next_check_at__lte=timezone.now()):
            run_advance(run_id=run.pk)
        play_agents(api, emulator, silent=silent)
        time.sleep(0.2)
    raise AssertionError(f"batch {batch.name} did not finish in {timeout_s} s: " + ", ".join(
        f"{r.server.name}={r.state}" for r in batch.runs.select_related("server")))


def test_a_batch_provisions_its_servers_over_pxe_within_its_concurrency(
        world, api, redfish_emulator, profile):
    systems = redfish_emulator.claim(5)
    servers = [register(world.operator, redfish_emulator, s) for s in systems]
    batch = batch_create(actor=world.operator, name="rack 1", profile=profile, servers=servers,
                         image_url="http://images.example/ubuntu.iso", concurrency=3)

    most_busy = drive(batch, api, redfish_emulator)

    batch.refresh_from_db()
    assert batch.state == BatchState.SUCCEEDED
    assert most_busy <= 3
    assert batch.summary["provisioned"] == 5 and batch.summary["failed"] == 0
    for system in systems:
        server = Server.objects.get(name=system.name)
        assert server.state == ServerState.PROVISIONED
        boot = redfish_emulator.system_json(system.uuid)["Boot"]
        assert boot["BootSourceOverrideTarget"] == "Pxe"
        run = server.provisioning_runs.get()
        names = [step.name for step in run.steps.all()]
        # The agent may call back before OGAI's poll saw the power come on.
        assert names[:2] == ["boot", "power"] and names[-1] == "callback"
        assert "network (PXE)" in run.steps.first().message
        assert run.bmc_seconds > 0


def test_a_callback_token_works_once_and_only_for_its_server(world, api, redfish_emulator,
                                                             profile):
    [system] = redfish_emulator.claim(1)
    server = register(world.operator, redfish_emulator, system)
    batch = batch_create(actor=world.operator, name="one", profile=profile, servers=[server],
                         image_url="http://images.example/ubuntu.iso")
    batch_fill_slots(batch_id=batch.pk)
    run = batch.runs.get()
    run_advance(run_id=run.pk)  # boot set, power cycled

    assert api.get(BOOT_CONFIG, {"mac": "02:00:00:00:00:99"}).status_code == 404
    token = api.get(BOOT_CONFIG, {"mac": system.macs[0]}).json()["token"]
    wrong = api.post(CALLBACK, {"token": token[:-2] + "xx"}, format="json")
    assert wrong.status_code == 403
    assert "not valid" in wrong.json()["message"]

    assert api.post(CALLBACK, {"token": token}, format="json").status_code == 200
    again = api.post(CALLBACK, {"token": token}, format="json")
    assert again.status_code == 403
    # Done: the boot config is no longer served, and the token is no longer stored.
    assert api.get(BOOT_CONFIG, {"mac": system.macs[0]}).status_code == 404
    run.refresh_from_db()
    assert run.state == RunState.PROVISIONED and not run.token_encrypted


def test_failures_end_per_server_in_the_bmcs_words_and_the_rest_carry_on(
        world, api, redfish_emulator, profile, garbage_bmc, unreachable_bmc_url):
    good, wrong_password, silent = redfish_emulator.claim(3)
    servers = [
        register(world.operator, redfish_emulator, good),
        register(world.operator, redfish_emulator, wrong_password, password="not-the-password"),
        register(world.operator, redfish_emulator, silent),
        register_at(world.operator, "garbage", garbage_bmc.url, "02:aa:00:00:00:01"),
        register_at(world.operator, "unreachable", unreachable_bmc_url, "02:aa:00:00:00:02"),
    ]
    batch = batch_create(actor=world.operator, name="mixed", profile=profile, servers=servers,
                         image_url="http://images.example/ubuntu.iso", max_attempts=2,
                         callback_timeout_s=2, concurrency=5)

    drive(batch, api, redfish_emulator, silent={silent.name})

    batch.refresh_from_db()
    assert batch.state == BatchState.PARTIAL
    runs = {run.server.name: run for run in batch.runs.select_related("server")}
    assert runs[good.name].state == RunState.PROVISIONED
    failures = {f["server"]: f for f in batch.summary["failures"]}
    assert set(failures) == {wrong_password.name, silent.name, "garbage", "unreachable"}
    # A refused password is not tried again (it would only lock the account); the rest are.
    assert failures[wrong_password.name]["attempts"] == 1
    assert "credentials" in failures[wrong_password.name]["error"]
    assert failures["unreachable"]["attempts"] == 2
    assert "no answer" in failures["unreachable"]["error"].lower()
    assert failures["garbage"]["attempts"] == 2
    assert "redfish" in failures["garbage"]["error"].lower()
    assert failures[silent.name]["attempts"] == 2
    assert "no first-boot callback within 2 s" in failures[silent.name]["error"]
    assert Server.objects.get(name="garbage").state == ServerState.FAILED
    # The password is nowhere: not in steps, errors, the summary or the audit log.
    texts = [str(batch.summary)]
    for run in runs.values():
        texts.append(run.error)
        texts += [step.message for step in run.steps.all()]
    texts += [str(event.changes) for event in AuditEvent.objects.all()]
    assert not any("not-the-password" in text or EMULATOR_PASSWORD in text for text in texts)


def test_virtual_media_inserts_the_image_and_boots_from_it_once(world, api, redfish_emulator,
                                                                profile, image_server):
    [system] = redfish_emulator.claim(1)
    server = register(world.operator, redfish_emulator, system)
    batch = batch_create(actor=world.operator, name="vm", profile=profile, servers=[server],
                         image_url=image_server.url, boot_method="virtual_media")

    drive(batch, api, redfish_emulator)

    batch.refresh_from_db()
    assert batch.state == BatchState.SUCCEEDED
    media = redfish_emulator.virtual_media(system.uuid)
    assert media["Inserted"] is True and media["Image"] == image_server.url
    assert redfish_emulator.system_json(system.uuid)["Boot"]["BootSourceOverrideTarget"] == "Cd"


def test_a_batch_refuses_servers_it_cannot_install_and_cancel_stops_it(
        world, redfish_emulator, profile):
    first, second = redfish_emulator.claim(2)
    one = register(world.operator, redfish_emulator, first)
    two = register(world.operator, redfish_emulator, second)
    batch = batch_create(actor=world.operator, name="a", profile=profile, servers=[one, two],
                         image_url="http://images.example/a.iso", concurrency=1)
    with pytest.raises(Exception, match="another batch is provisioning it"):
        batch_create(actor=world.operator, name="b", profile=profile, servers=[two],
                     image_url="http://images.example/b.iso")
    with pytest.raises(Exception, match="Only a platform admin"):
        batch_create(actor=world.alpha_admin, name="c", profile=profile, servers=[one],
                     image_url="http://images.example/c.iso")

    batch_fill_slots(batch_id=batch.pk)
    assert batch.runs.filter(state=RunState.PREPARING).count() == 1  # concurrency 1
    batch_cancel(actor=world.operator, batch=batch)

    batch.refresh_from_db()
    assert batch.state == BatchState.CANCELLED
    assert batch.summary["cancelled"] == 2
    assert set(Server.objects.values_list("state", flat=True)) == {ServerState.REGISTERED}
    assert ProvisioningBatch.objects.count() == 1


def test_inventory_of_a_gpu_server_and_mismatches_with_what_was_expected(
        world, redfish_static, redfish_emulator):
    access = redfish_static.access()
    gpu_server = server_register(
        actor=world.operator, name="dgx-01", bmc_address=access.address,
        bmc_username=access.username, bmc_password=access.password,
        system_id=access.system_id, verify_tls=False,
        expected_gpu_model="H100", expected_gpu_count=8)
    snapshot = server_refresh_inventory(server=Server.objects.get(pk=gpu_server.pk))
    assert snapshot is not None and snapshot.mismatches == []
    gpu_server.refresh_from_db()
    assert gpu_server.gpu_count == 8 and "H100" in gpu_server.gpu_model
    assert gpu_server.console_url
    assert len(snapshot.data["nics"]) >= 1 and gpu_server.boot_mac

    [system] = redfish_emulator.claim(1)
    fake = server_register(
        actor=world.operator, name="fake-01", bmc_address=redfish_emulator.url,
        bmc_username="admin", bmc_password=EMULATOR_PASSWORD, system_id=system.uuid,
        expected_gpu_model="A100", expected_gpu_count=4)
    snapshot = server_refresh_inventory(server=Server.objects.get(pk=fake.pk))
    fake.refresh_from_db()
    assert [nic["mac"] for nic in snapshot.data["nics"]] == list(system.macs)
    assert fake.boot_mac == system.macs[0]
    assert fake.power_state == "Off"
    assert any("does not report GPUs" in text for text in fake.mismatches)


def test_boot_configs_go_once_and_only_to_the_provisioning_networks(
        world, api, redfish_emulator, profile, settings):
    [system] = redfish_emulator.claim(1)
    server = register(world.operator, redfish_emulator, system)
    batch = batch_create(actor=world.operator, name="net", profile=profile, servers=[server],
                         image_url="http://images.example/ubuntu.iso")
    batch_fill_slots(batch_id=batch.pk)
    run_advance(run_id=batch.runs.get().pk)

    settings.OGAI_PROVISIONING_NETWORKS = ["10.9.0.0/16"]  # the test client is 127.0.0.1
    assert api.get(BOOT_CONFIG, {"mac": system.macs[0]}).status_code == 404
    assert api.post(CALLBACK, {"token": "x" * 43}, format="json").status_code == 403
    # A client outside the networks writing an address inside them into X-Forwarded-For is
    # still outside: only a trusted proxy's header is believed.
    settings.OGAI_USE_X_FORWARDED_FOR = True
    settings.OGAI_TRUSTED_PROXIES = ["192.0.2.1/32"]
    assert api.get(BOOT_CONFIG, {"mac": system.macs[0]},
                   HTTP_X_FORWARDED_FOR="10.9.1.1").status_code == 404
    settings.OGAI_USE_X_FORWARDED_FOR = False
    settings.OGAI_PROVISIONING_NETWORKS = ["127.0.0.0/8"]
    first = api.get(BOOT_CONFIG, {"mac": system.macs[0]})
    assert first.status_code == 200
    assert api.get(BOOT_CONFIG, {"mac": system.macs[0]}).status_code == 404  # handed out once
    assert api.post(CALLBACK, {"token": first.json()["token"]}, format="json").status_code == 200


def test_a_server_in_a_batch_cannot_be_leased_until_the_batch_is_done(world, redfish_emulator,
                                                                       profile):
    from datetime import timedelta

    from django.core.exceptions import ValidationError

    from infra_os.services.leases import lease_create

    first, second = redfish_emulator.claim(2)
    busy = register(world.operator, redfish_emulator, first)
    waiting = register(world.operator, redfish_emulator, second)
    Server.objects.filter(pk__in=[busy.pk, waiting.pk]).update(state=ServerState.PROVISIONED)
    batch_create(actor=world.operator, name="reinstall", profile=profile,
                 servers=[busy, waiting], image_url="http://images.example/u.iso",
                 concurrency=1)
    now = timezone.now()
    with pytest.raises(ValidationError, match="provisioning batch"):
        lease_create(actor=world.operator, server=Server.objects.get(pk=waiting.pk),
                     tenant=world.alpha, starts_at=now, ends_at=now + timedelta(days=1))
