"""The bare-metal console pages: servers, racks, provisioning profiles and batches. No BMC is
called: the services enqueue their BMC work on commit, which never comes inside a `db` test."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from infra_os.choices import BatchState, RunState, ServerState
from infra_os.models import (
    AuditEvent,
    Bmc,
    InventorySnapshot,
    ProvisioningRun,
    ProvisioningStep,
    Server,
)
from infra_os.services.leases import lease_create
from infra_os.services.provisioning import batch_cancel, batch_create, profile_create
from infra_os.services.servers import rack_create, server_register
from ogai.crypto import encrypt

HTMX = {"HTTP_HX_REQUEST": "true"}
PASSWORD = "Zq-bmc-PASSWORD-7731-unique"


def _server(name: str, *, rack=None, **fields) -> Server:
    """A server and its BMC straight in the database (no registration, no inventory task)."""
    server = Server.objects.create(name=name, rack=rack, **fields)
    Bmc.objects.create(server=server, address=f"https://bmc-{name}.example", username="admin",
                       password_encrypted=encrypt(f"pw-of-{name}"))
    return server


@pytest.fixture
def bare(world):
    """A rack with servers: gpu-01 registered through the service with PASSWORD, an inventory
    and a mismatch; gpu-02 and gpu-03 plain; a profile, and a running batch of gpu-02 and
    gpu-03 whose runs are mid-way."""
    operator = world.operator
    rack = rack_create(actor=operator, name="rack-a", location="hall 1")
    first = server_register(actor=operator, name="gpu-01", rack="rack-a",
                            bmc_address="https://10.0.0.11", bmc_username="admin",
                            bmc_password=PASSWORD, expected_gpu_model="H100",
                            expected_gpu_count=8)
    snapshot = InventorySnapshot.objects.create(
        server=first, power_state="On", health="OK", missing=["disks"],
        mismatches=["Expected 8 GPUs, the BMC reports 7."],
        data={"system": {"id": "1", "manufacturer": "Supermicro", "model": "SYS-821GE",
                         "serial": "S123"},
              "cpus": {"count": 2, "model": "Xeon 8480", "cores": 112}, "memory_gib": 2048,
              "gpus": [{"model": "H100 SXM", "vendor": "NVIDIA", "serial": f"G{n}"}
                       for n in range(7)],
              "nics": [{"name": "eth0", "mac": "aa:bb:cc:00:00:01", "speed_mbps": 100000}],
              "disks": []})
    Server.objects.filter(pk=first.pk).update(
        power_state="On", health="OK", gpu_model="H100 SXM", gpu_count=7,
        mismatches=snapshot.mismatches, last_seen_at=snapshot.taken_at,
        console_url="https://10.0.0.11/console", bmc_error="")
    second = _server("gpu-02", rack=rack)
    third = _server("gpu-03", rack=rack)
    free = _server("gpu-04")
    profile = profile_create(actor=operator, name="ubuntu", user_data="#cloud-config\n")
    batch = batch_create(actor=operator, name="wave-1", profile=profile,
                         servers=[second, third], image_url="http://images.example/u.iso")
    runs = {run.server.name: run for run in batch.runs.select_related("server")}
    ProvisioningRun.objects.filter(pk=runs["gpu-02"].pk).update(
        state=RunState.AWAITING_CALLBACK, attempt=1)
    ProvisioningStep.objects.create(run=runs["gpu-02"], attempt=1, name="power",
                                    message="powered on; waiting for the first-boot agent")
    ProvisioningRun.objects.filter(pk=runs["gpu-03"].pk).update(
        state=RunState.FAILED, attempt=3, error="the BMC said: Base.1.0.GeneralError boom")
    ProvisioningStep.objects.create(run=runs["gpu-03"], attempt=3, name="failed",
                                    outcome="error",
                                    message="gave up after 3 attempts: the BMC said: boom")
    return SimpleNamespace(world=world, rack=rack, first=first, second=second, third=third,
                           free=free, profile=profile, batch=batch, runs=runs)


@pytest.fixture
def ops(client, bare):
    client.force_login(bare.world.operator)
    return client


def _pages(bare) -> list[str]:
    return [
        reverse("frontend:servers"),
        reverse("frontend:server-register"),
        reverse("frontend:server-import"),
        reverse("frontend:server", args=["gpu-01"]),
        reverse("frontend:server", args=["gpu-02"]),
        reverse("frontend:racks"),
        reverse("frontend:provisioning"),
        reverse("frontend:batch-create"),
        reverse("frontend:batch", args=[bare.batch.pk]),
        reverse("frontend:profiles"),
        reverse("frontend:profile-create"),
        reverse("frontend:profile-edit", args=["ubuntu"]),
    ]


def test_every_page_renders_for_a_platform_admin(ops, bare):
    for url in _pages(bare):
        response = ops.get(url)
        assert response.status_code == 200, url
        assert 'class="sidebar"' in response.content.decode()


@pytest.mark.parametrize("name", ["servers", "racks", "provisioning", "profiles"])
def test_list_pages_answer_htmx_with_the_table_area(ops, bare, name):
    response = ops.get(reverse(f"frontend:{name}"), **HTMX)
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith('<div id="table-area"')


def test_a_tenant_admin_gets_none_of_it(client, bare):
    client.force_login(bare.world.alpha_admin)
    for url in _pages(bare):
        assert client.get(url).status_code in (403, 404), url
    posts = [
        (reverse("frontend:server-bulk"), {"action": "cycle", "servers": ["gpu-01"],
                                           "confirmed": "1"}),
        (reverse("frontend:server-delete", args=["gpu-01"]), {}),
        (reverse("frontend:server-retire", args=["gpu-01"]), {}),
        (reverse("frontend:rack-create"), {"name": "rack-z"}),
        (reverse("frontend:rack-delete", args=["rack-a"]), {}),
        (reverse("frontend:batch-cancel", args=[bare.batch.pk]), {}),
        (reverse("frontend:profile-delete", args=["ubuntu"]), {}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code in (403, 404), url
    assert Server.objects.filter(name="gpu-01", state=ServerState.REGISTERED).exists()
    assert not AuditEvent.objects.filter(action="server.power_cycle").exists()
    assert bare.batch.__class__.objects.get(pk=bare.batch.pk).state == BatchState.RUNNING


def test_the_server_list_shows_gpus_against_expected_and_filters(ops, bare):
    page = ops.get(reverse("frontend:servers")).content.decode()
    row = page.split('data-server="gpu-01"')[1].split("</tr>")[0]
    assert "7" in row and "/ 8" in row and "Mismatch" in row
    assert 'name="servers" value="gpu-01"' in page and 'form="bulk-form"' in page
    assert "Power cycle" in page and "Provision…" in page
    mismatched = ops.get(reverse("frontend:servers"), {"mismatch": "true"}, **HTMX)
    assert 'data-server="gpu-01"' in mismatched.content.decode()
    assert 'data-server="gpu-02"' not in mismatched.content.decode()


def test_the_server_page_shows_inventory_console_and_history(ops, bare):
    page = ops.get(reverse("frontend:server", args=["gpu-01"])).content.decode()
    assert "Expected 8 GPUs, the BMC reports 7." in page
    assert 'href="https://10.0.0.11/console"' in page
    assert "aa:bb:cc:00:00:01" in page and "Xeon 8480" in page
    assert page.count("H100 SXM") >= 7
    assert "Not reported by the BMC: disks." in page
    other = ops.get(reverse("frontend:server", args=["gpu-03"])).content.decode()
    assert "The BMC offers no remote console link" not in other  # never read: not known yet
    assert "Not known until the BMC answers" in other
    assert f'href="{reverse("frontend:batch", args=[bare.batch.pk])}"' in other
    assert "Base.1.0.GeneralError boom" in other


def test_the_bmc_password_never_appears_in_a_page(ops, bare):
    secret = "Xx-distinct-BMC-secret-4242"
    bad = ops.post(reverse("frontend:server-register"), {
        "name": "Not A Slug", "bmc_address": "https://10.0.0.50", "bmc_username": "root",
        "bmc_password": secret, "expected_gpu_count": 0, "verify_tls": "on"})
    assert bad.status_code == 200 and "name" in bad.context["form"].errors
    assert secret not in bad.content.decode()
    made = ops.post(reverse("frontend:server-register"), {
        "name": "gpu-50", "bmc_address": "https://10.0.0.50", "bmc_username": "root",
        "bmc_password": secret, "expected_gpu_count": 0, "verify_tls": "on"})
    assert made.status_code == 302
    assert Server.objects.get(name="gpu-50").bmc.password_encrypted
    bmc_bad = ops.post(reverse("frontend:server-bmc", args=["gpu-50"]), {
        "address": "not a url", "username": "root", "password": secret + "-new"})
    assert bmc_bad.status_code == 400
    assert secret not in bmc_bad.content.decode()
    for url in [*_pages(bare), reverse("frontend:server", args=["gpu-50"])]:
        html = ops.get(url).content.decode()
        assert secret not in html and PASSWORD not in html, url
    events = AuditEvent.objects.filter(action__startswith="server.")
    assert events.exists()
    assert all(secret not in str(event.changes) for event in events)


def test_bulk_power_asks_for_confirmation_before_calling_the_service(ops, bare):
    url = reverse("frontend:server-bulk")
    chosen = {"action": "cycle", "servers": ["gpu-01", "gpu-04"]}
    confirm = ops.post(url, chosen)
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert 'data-server="gpu-01"' in html and 'data-server="gpu-04"' in html
    assert 'data-server="gpu-02"' not in html
    assert "Power cycle" in html and 'name="confirmed" value="1"' in html
    assert not AuditEvent.objects.filter(action="server.power_cycle").exists()

    done = ops.post(url, {**chosen, "confirmed": "1"})
    assert done.status_code == 302 and done.url == reverse("frontend:servers")
    powered = AuditEvent.objects.filter(action="server.power_cycle")
    assert sorted(powered.values_list("object_repr", flat=True)) == ["gpu-01", "gpu-04"]


def test_bulk_power_on_a_server_being_provisioned_says_why(ops, bare):
    response = ops.post(reverse("frontend:server-bulk"),
                        {"action": "off", "servers": ["gpu-02"], "confirmed": "1"})
    assert response.status_code == 400
    assert "Being provisioned, so their power is the batch&#x27;s: gpu-02." in \
        response.content.decode()
    assert not AuditEvent.objects.filter(action="server.power_off").exists()


def test_provision_bulk_action_opens_the_batch_form_with_the_servers(ops, bare):
    response = ops.post(reverse("frontend:server-bulk"),
                        {"action": "provision", "servers": ["gpu-01", "gpu-04"]})
    assert response.status_code == 302
    form = ops.get(response.url)
    assert sorted(form.context["form"].initial["servers"]) == ["gpu-01", "gpu-04"]
    html = form.content.decode()
    for name in ("gpu-01", "gpu-04"):
        box = html.split(f'value="{name}"')[1].split(">")[0]
        assert "checked" in box, name


def test_import_with_a_bad_row_registers_nothing(ops, bare):
    content = (
        b"name,rack,bmc_address,bmc_username,bmc_password,expected_gpu_count\n"
        b"gpu-10,rack-b,https://10.0.1.10,admin,pw-1,8\n"
        b"gpu-11,rack-b,not-a-url,admin,,8\n"
    )
    upload = SimpleUploadedFile("servers.csv", content, content_type="text/csv")
    response = ops.post(reverse("frontend:server-import"), {"file": upload})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Nothing was registered" in html
    assert "row 2 (gpu-11): bmc_password" in html and "row 2 (gpu-11): bmc_address" in html
    assert not Server.objects.filter(name__in=["gpu-10", "gpu-11"]).exists()
    assert "name,rack,bmc_address" in html  # the columns and example stay in view

    good = SimpleUploadedFile("servers.json", b'[{"name": "gpu-12", "bmc_address": '
                              b'"https://10.0.1.12", "bmc_username": "a", "bmc_password": "b"}]')
    assert ops.post(reverse("frontend:server-import"), {"file": good}).status_code == 302
    assert Server.objects.filter(name="gpu-12").exists()


def test_the_batch_grid_is_a_polled_partial_with_a_tile_per_server(ops, bare):
    url = reverse("frontend:batch", args=[bare.batch.pk])
    page = ops.get(url).content.decode()
    assert 'id="batch-grid"' in page and 'hx-trigger="every 2s"' in page
    part = ops.get(url, {"open": str(bare.runs["gpu-03"].pk)}, **HTMX).content.decode()
    assert "<html" not in part and 'id="batch-grid"' in part
    tile_02 = part.split('data-server="gpu-02"')[1].split("</details>")[0]
    tile_03 = part.split('data-server="gpu-03"')[1].split("</details>")[0]
    assert 'data-state="awaiting_callback"' in tile_02 and "waiting for the first-boot" in tile_02
    assert 'data-state="failed"' in tile_03 and "attempt 3/3" in tile_03
    assert "gave up after 3 attempts" in tile_03
    assert tile_03.split(">")[0].endswith(" open")  # the history the reader had open stays
    assert " open" not in tile_02.split(">")[0]
    assert "Cancel batch" in part

    batch_cancel(actor=bare.world.operator, batch=bare.batch)
    finished = ops.get(url, **HTMX).content.decode()
    assert "hx-trigger" not in finished  # a finished batch stops polling
    assert 'data-summary="cancelled">1<' in finished
    assert "Base.1.0.GeneralError boom" in finished  # the failure, in the BMC's words
    assert "Retry failed servers (1)" in finished and "Cancel batch" not in finished


def test_retry_failed_servers_starts_a_new_batch(ops, bare):
    batch_cancel(actor=bare.world.operator, batch=bare.batch)
    response = ops.post(reverse("frontend:batch-retry", args=[bare.batch.pk]))
    retry = bare.batch.__class__.objects.exclude(pk=bare.batch.pk).get()
    assert response.url == reverse("frontend:batch", args=[retry.pk])
    assert list(retry.runs.values_list("server__name", flat=True)) == ["gpu-03"]


def test_new_batch_form_refuses_busy_servers_with_the_services_words(ops, bare):
    Server.objects.filter(pk=bare.free.pk).update(state=ServerState.PROVISIONED)
    now = timezone.now()
    lease_create(actor=bare.world.operator, server=bare.free, tenant=bare.world.alpha,
                 starts_at=now, ends_at=now + timedelta(days=1))
    form = ops.get(reverse("frontend:batch-create")).content.decode()
    assert 'value="gpu-01"' in form
    assert 'value="gpu-02"' not in form and 'value="gpu-04"' not in form  # not offered
    response = ops.post(reverse("frontend:batch-create"), {
        "name": "wave-2", "profile": "ubuntu", "image_url": "http://images.example/u.iso",
        "servers": ["gpu-02", "gpu-04"], "concurrency": 5, "max_attempts": 2,
        "power_timeout_s": 60, "callback_timeout_s": 600})
    assert response.status_code == 400
    html = response.content.decode()
    assert "gpu-02: another batch is provisioning it." in html
    assert "gpu-04: it is leased; installing would wipe the tenant&#x27;s server." in html
    assert bare.batch.__class__.objects.count() == 1
    leased = ops.get(reverse("frontend:server", args=["gpu-04"])).content.decode()
    assert "Leased</span> to alpha" in leased and 'data-lease="' in leased


def test_a_server_without_a_bmc_still_has_a_page(ops, bare):
    Server.objects.create(name="orphan")
    page = ops.get(reverse("frontend:server", args=["orphan"]))
    assert page.status_code == 200
    assert "This server has no BMC" in page.content.decode()
    assert page.context["bmc_form"] is None


def test_new_batch_form_starts_a_batch(ops, bare):
    response = ops.post(reverse("frontend:batch-create"), {
        "name": "wave-2", "profile": "ubuntu", "image_url": "http://images.example/u.iso",
        "boot_method": "virtual_media", "servers": ["gpu-01", "gpu-04"], "concurrency": 5,
        "max_attempts": 2, "power_timeout_s": 60, "callback_timeout_s": 600})
    batch = bare.batch.__class__.objects.get(name="wave-2")
    assert response.url == reverse("frontend:batch", args=[batch.pk])
    assert batch.boot_method == "virtual_media" and batch.concurrency == 5
    assert sorted(batch.runs.values_list("server__name", flat=True)) == ["gpu-01", "gpu-04"]


def test_server_edit_retire_and_delete(ops, bare):
    edit = ops.post(reverse("frontend:server-edit", args=["gpu-04"]), {
        "rack": "rack-c", "description": "spare", "expected_gpu_model": "A100",
        "expected_gpu_count": 4})
    assert edit.status_code == 302
    server = Server.objects.get(name="gpu-04")
    assert server.rack.name == "rack-c" and server.expected_gpu_count == 4
    busy = ops.post(reverse("frontend:server-delete", args=["gpu-02"]), follow=True)
    assert "being provisioned: cancel its batch first" in busy.content.decode()
    assert Server.objects.filter(name="gpu-02").exists()
    ops.post(reverse("frontend:server-retire", args=["gpu-04"]))
    assert Server.objects.get(name="gpu-04").state == ServerState.RETIRED
    gone = ops.post(reverse("frontend:server-delete", args=["gpu-04"]))
    assert gone.url == reverse("frontend:servers")
    assert not Server.objects.filter(name="gpu-04").exists()


def test_racks_and_profiles_are_added_and_deleted(ops, bare):
    assert ops.post(reverse("frontend:rack-create"), {"name": "rack-z"}).status_code == 302
    duplicate = ops.post(reverse("frontend:rack-create"), {"name": "rack-z"})
    assert "A rack with this name already exists." in duplicate.content.decode()
    racks = ops.get(reverse("frontend:racks")).content.decode()
    row = racks.split('data-rack="rack-a"')[1].split("</tr>")[0]
    assert ">3<" in row  # gpu-01 (registered into it by name), gpu-02 and gpu-03
    ops.post(reverse("frontend:rack-delete", args=["rack-z"]))
    assert 'data-rack="rack-z"' not in ops.get(reverse("frontend:racks")).content.decode()

    ops.post(reverse("frontend:profile-create"), {"name": "rocky", "boot_method": "pxe",
                                                 "user_data": "#cloud-config"})
    ops.post(reverse("frontend:profile-edit", args=["rocky"]),
             {"name": "ignored", "boot_method": "virtual_media", "description": "Rocky 9"})
    profiles = ops.get(reverse("frontend:profiles")).content.decode()
    assert "Rocky 9" in profiles and "Virtual media" in profiles
    used = ops.post(reverse("frontend:profile-delete", args=["ubuntu"]), follow=True)
    assert "Batches used this profile" in used.content.decode()
    ops.post(reverse("frontend:profile-delete", args=["rocky"]))
    assert 'data-profile="rocky"' not in ops.get(reverse("frontend:profiles")).content.decode()


@pytest.fixture
def crowded(bare):
    """30 more servers, all in a second batch with a step each."""
    servers = [_server(f"node-{number:02d}", rack=bare.rack) for number in range(30)]
    batch = batch_create(actor=bare.world.operator, name="wave-big", profile=bare.profile,
                         servers=servers, image_url="http://images.example/u.iso")
    for run in batch.runs.all():
        ProvisioningStep.objects.create(run=run, attempt=1, name="boot", message="next boot: PXE")
    return SimpleNamespace(bare=bare, batch=batch)


@pytest.mark.parametrize(("name", "most"), [
    ("servers", 8), ("racks", 8), ("provisioning", 8), ("profiles", 8), ("batch-create", 9),
])
def test_list_pages_pin_their_query_counts(ops, crowded, django_assert_max_num_queries, name,
                                           most):
    with django_assert_max_num_queries(most):
        assert ops.get(reverse(f"frontend:{name}")).status_code == 200


def test_the_batch_grid_pins_its_query_count(ops, crowded, django_assert_max_num_queries):
    url = reverse("frontend:batch", args=[crowded.batch.pk])
    with django_assert_max_num_queries(8):
        part = ops.get(url, **HTMX).content.decode()
    assert part.count('<details class="run-tile') == 30
