"""A batch of 20 emulated servers provisioned end to end as an operator would: registered
from a CSV file through the API, a batch created through the API, every step driven by a real
Celery worker on the `provision` queue, and each server's first-boot agent (played here) asking
for its boot config by MAC and calling back with its token as soon as its power comes on."""

import csv
import io
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from infra_os.choices import BatchState, RunState, ServerState
from infra_os.models import ProvisioningRun, Server
from tests.redfish.fixtures import EMULATOR_PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def provision_worker(monkeypatch, request):
    """The suite's worker, polling the BMCs every second."""
    monkeypatch.setenv("OGAI_PROVISION_POLL_S", "1")
    monkeypatch.setenv("OGAI_PROVISION_RETRY_S", "1")
    return request.getfixturevalue("celery_worker_process")


def test_twenty_servers_from_a_csv_file_to_provisioned_through_the_worker(
        world, api, redfish_emulator, provision_worker):
    systems = redfish_emulator.claim(20)
    api.as_user(world.operator)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["name", "rack", "bmc_address", "bmc_username", "bmc_password", "system_id",
                     "verify_tls", "expected_gpu_model", "expected_gpu_count", "boot_mac"])
    for system in systems:
        writer.writerow([system.name, "r1", redfish_emulator.url, "admin", EMULATOR_PASSWORD,
                         system.uuid, "false", "H100", "8", system.macs[0]])
    upload = SimpleUploadedFile("servers.csv", out.getvalue().encode(), "text/csv")
    imported = api.post("/api/v1/infra-os/servers/import/", {"file": upload},
                        format="multipart")
    assert imported.status_code == 201, imported.content
    assert EMULATOR_PASSWORD not in imported.content.decode()

    profile = api.post("/api/v1/infra-os/provisioning-profiles/",
                       {"name": "ubuntu", "boot_method": "pxe"}, format="json")
    assert profile.status_code == 201, profile.content
    created = api.post("/api/v1/infra-os/provisioning-batches/", {
        "name": "rack r1", "profile": "ubuntu", "image_url": "http://images.example/u.iso",
        "servers": [s.name for s in systems], "concurrency": 20}, format="json")
    assert created.status_code == 202, created.content
    batch_url = f"/api/v1/infra-os/provisioning-batches/{created.json()['id']}/"

    agent = api.__class__()  # the servers carry no credentials: only their token
    called_back: set[str] = set()
    deadline = time.monotonic() + 120
    state = BatchState.RUNNING
    while time.monotonic() < deadline and state == BatchState.RUNNING:
        waiting = ProvisioningRun.objects.filter(
            state__in=(RunState.REBOOTING, RunState.AWAITING_CALLBACK)).select_related("server")
        for run in waiting:
            server = run.server
            system = next(s for s in systems if s.name == server.name)
            if server.name in called_back or redfish_emulator.power_state(system.uuid) != "On":
                continue
            config = agent.get("/api/v1/infra-os/provisioning/boot-config/",
                               {"mac": system.macs[0]})
            assert config.status_code == 200, config.content
            answer = agent.post(config.json()["callback_url"], {"token": config.json()["token"]},
                                format="json")
            assert answer.status_code == 200, answer.content
            called_back.add(server.name)
        state = api.get(batch_url).json()["state"]
        time.sleep(0.3)

    batch = api.get(batch_url).json()
    assert batch["state"] == BatchState.SUCCEEDED, batch
    assert batch["summary"]["provisioned"] == 20
    assert all(run["state"] == RunState.PROVISIONED for run in batch["runs"])
    assert Server.objects.filter(state=ServerState.PROVISIONED).count() == 20
    # The worker also read each server's inventory after registration.
    assert Server.objects.exclude(last_seen_at=None).count() == 20
    listed = api.get("/api/v1/infra-os/servers/", {"state": "provisioned"}).json()
    assert listed["count"] == 20
    assert all("does not report GPUs" in s["mismatches"][0] for s in listed["results"])
