"""The servers API as an operator uses it, and what it refuses; BMC passwords never leave."""

import json
import logging

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from infra_os.models import AuditEvent, Bmc, Rack, Server
from ogai.crypto import decrypt

SERVERS = "/api/v1/infra-os/servers/"
SECRET = "s3cret-bmc-passw0rd"


def server_body(name="gpu-01", **extra):
    return {"name": name, "rack": "r1", "bmc_address": "https://10.0.0.5",
            "bmc_username": "root", "bmc_password": SECRET, "expected_gpu_model": "H100",
            "expected_gpu_count": 8, **extra}


def upload(rows, name="servers.json"):
    return {"file": SimpleUploadedFile(name, json.dumps(rows).encode(), "application/json")}


def test_register_keeps_the_password_encrypted_and_never_returns_it(world, api, caplog):
    caplog.set_level(logging.DEBUG)
    client = api.as_user(world.operator)
    created = client.post(SERVERS, server_body(), format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["bmc"] == {"driver": "redfish", "address": "https://10.0.0.5", "system_id": "",
                           "verify_tls": True, "username": "root"}
    assert body["rack"] == "r1" and Rack.objects.filter(name="r1").exists()
    bmc = Bmc.objects.get(server__name="gpu-01")
    assert SECRET not in bmc.password_encrypted and decrypt(bmc.password_encrypted) == SECRET

    listed = client.get(SERVERS).content.decode() + client.get(f"{SERVERS}gpu-01/").content \
        .decode()
    changed = client.patch(f"{SERVERS}gpu-01/bmc/", {"password": "an0ther-secret"},
                           format="json")
    assert changed.status_code == 200
    audit = " ".join(str(e.changes) for e in AuditEvent.objects.all())
    for text in (listed, changed.content.decode(), audit, caplog.text):
        assert SECRET not in text and "an0ther-secret" not in text


def test_bad_servers_get_every_problem_named_and_nothing_is_registered(world, api):
    client = api.as_user(world.operator)
    refused = client.post(SERVERS, server_body(name="Bad Name", bmc_address="not a url",
                                               boot_mac="zz"), format="json")
    assert refused.status_code == 400
    assert {"name", "bmc_address", "boot_mac"} <= set(refused.json()["fields"])

    rows = [server_body(name="ok-1"), server_body(name="ok-1"),
            server_body(name="ok-3", bmc_address="ftp//x"),
            {**server_body(name="ok-4"), "gpus": 8}]
    imported = client.post(f"{SERVERS}import/", upload(rows), format="multipart")
    assert imported.status_code == 400
    problems = imported.json()["fields"]["file"]
    assert any("row 4" in text and "unknown column" in text for text in problems)
    rows.pop()
    imported = client.post(f"{SERVERS}import/", upload(rows), format="multipart")
    problems = imported.json()["fields"]["file"]
    assert any(p.startswith("row 2 (ok-1): name: This name appears twice") for p in problems)
    assert any(p.startswith("row 3 (ok-3): bmc_address") for p in problems)
    assert Server.objects.count() == 0

    garbage = client.post(f"{SERVERS}import/", {"file": SimpleUploadedFile(
        "servers.csv", b"\xff\xfe\x00garbage", "text/csv")}, format="multipart")
    assert garbage.status_code == 400 and "UTF-8" in garbage.json()["message"] + str(
        garbage.json()["fields"])
    no_header = client.post(f"{SERVERS}import/", {"file": SimpleUploadedFile(
        "servers.csv", b"gpu-1,https://x\n", "text/csv")}, format="multipart")
    assert no_header.status_code == 400 and "header row" in str(no_header.json()["fields"])


def test_a_csv_file_registers_all_its_servers(world, api):
    client = api.as_user(world.operator)
    text = ("name,rack,bmc_address,bmc_username,bmc_password,expected_gpu_count,verify_tls\n"
            f"n-1,r2,https://10.0.1.1,root,{SECRET},8,false\n"
            f"n-2,r2,https://10.0.1.2,root,{SECRET},8,true\n")
    imported = client.post(f"{SERVERS}import/", {"file": SimpleUploadedFile(
        "servers.csv", text.encode(), "text/csv")}, format="multipart")
    assert imported.status_code == 201, imported.content
    assert [s["name"] for s in imported.json()] == ["n-1", "n-2"]
    assert list(Bmc.objects.order_by("server__name").values_list("verify_tls", flat=True)) == \
        [False, True]
    assert SECRET not in imported.content.decode()


def test_power_on_a_selection_is_accepted_and_audited_per_server(world, api):
    client = api.as_user(world.operator)
    for name in ("p-1", "p-2"):
        client.post(SERVERS, server_body(name=name), format="json")
    accepted = client.post(f"{SERVERS}power/", {"servers": ["p-1", "p-2"], "action": "cycle"},
                           format="json")
    assert accepted.status_code == 202 and accepted.json() == {"accepted": 2}
    assert AuditEvent.objects.filter(action="server.power_cycle").count() == 2
    unknown = client.post(f"{SERVERS}power/", {"servers": ["p-1", "nope"], "action": "on"},
                          format="json")
    assert unknown.status_code == 400 and "nope" in str(unknown.json()["fields"])
    bad = client.post(f"{SERVERS}p-1/power/", {"action": "explode"}, format="json")
    assert bad.status_code == 400 and "action" in bad.json()["fields"]


@pytest.mark.parametrize("who", ["alpha_admin", "alpha_member"])
def test_servers_are_the_operators_alone(world, api, who):
    api.as_user(world.operator).post(SERVERS, server_body(), format="json")
    client = api.as_user(getattr(world, who))
    assert client.get(SERVERS).json()["count"] == 0
    assert client.get(f"{SERVERS}gpu-01/").status_code == 404
    assert client.post(SERVERS, server_body(name="mine"), format="json").status_code == 403
    assert client.post(f"{SERVERS}power/", {"servers": ["gpu-01"], "action": "off"},
                       format="json").status_code == 403
    assert client.get("/api/v1/infra-os/provisioning-batches/").json()["count"] == 0


def test_the_server_list_costs_a_fixed_number_of_queries(world, api, django_assert_num_queries):
    client = api.as_user(world.operator)
    for index in range(5):
        client.post(SERVERS, server_body(name=f"q-{index}"), format="json")
    with django_assert_num_queries(2):  # count, page
        assert client.get(SERVERS).json()["count"] == 5


def test_a_new_bmc_address_needs_the_password_again_and_a_blank_tls_cell_keeps_it_on(world, api):
    client = api.as_user(world.operator)
    client.post(SERVERS, server_body(), format="json")
    moved = client.patch(f"{SERVERS}gpu-01/bmc/", {"address": "https://attacker.example"},
                         format="json")
    assert moved.status_code == 400 and "password" in moved.json()["fields"]
    assert Bmc.objects.get().address == "https://10.0.0.5"
    assert client.patch(f"{SERVERS}gpu-01/bmc/", {"address": "https://10.0.0.6",
                                                  "password": "new-one"},
                        format="json").status_code == 200

    text = ("name,bmc_address,bmc_username,bmc_password,verify_tls\n"
            f"t-1,https://10.0.2.1,root,{SECRET},\n")
    imported = client.post(f"{SERVERS}import/", {"file": SimpleUploadedFile(
        "servers.csv", text.encode(), "text/csv")}, format="multipart")
    assert imported.status_code == 201
    assert Bmc.objects.get(server__name="t-1").verify_tls is True
    refused = client.post(SERVERS, server_body(name="u-1",
                                               bmc_address="https://root:pw@10.0.0.9"),
                          format="json")
    assert refused.status_code == 400 and "own fields" in str(refused.json()["fields"])
