"""The Leases page: members read their tenant's leases; platform admins see all, lease free
provisioned servers and end or cancel leases."""

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from infra_os.choices import LeaseState, ServerAllocation, ServerState
from infra_os.models import Lease, Server, UsageRecord
from infra_os.services.leases import lease_create

HOUR = timedelta(hours=1)
T0 = datetime(datetime.now(UTC).year + 1, 12, 1, 10, 0, tzinfo=UTC)
PAGE = reverse("frontend:leases")
CREATE = reverse("frontend:lease-create")


def server(name="h100-01", **extra):
    fields = {"state": ServerState.PROVISIONED, "expected_gpu_model": "H100",
              "expected_gpu_count": 8, **extra}
    return Server.objects.create(name=name, **fields)


def lease(world, srv, tenant=None, start=T0, end=T0 + 2 * HOUR):
    return lease_create(actor=world.operator, server=srv, tenant=tenant or world.alpha,
                        starts_at=start, ends_at=end)


def form_data(**extra):
    # datetime-local inputs, read in the console's time zone (UTC in tests).
    return {"server": "h100-01", "tenant": "alpha", "starts_at": f"{T0:%Y-%m-%dT%H:%M}",
            "ends_at": f"{T0 + 2 * HOUR:%Y-%m-%dT%H:%M}", "note": "", **extra}


def test_members_see_their_tenants_leases_read_only(signed_in, world):
    mine = lease(world, server("alpha-box"))
    lease(world, server("beta-box"), tenant=world.beta)
    response = signed_in(world.alpha_member).get(PAGE)
    assert response.status_code == 200
    content = response.content.decode()
    assert [row.record for row in response.context["table"].page.object_list] == [mine]
    assert "alpha-box" in content and "beta-box" not in content
    assert "New lease" not in content and ">Cancel</button>" not in content
    assert response.context["form"] is None


def test_the_nav_has_leases(signed_in, world):
    content = signed_in(world.alpha_member).get(PAGE).content.decode()
    assert f'href="{PAGE}"' in content and ">Leases<" in content


def test_a_platform_admin_sees_all_leases_and_the_form(signed_in, world):
    lease(world, server("h1"))
    lease(world, server("h2"), tenant=world.beta)
    server("free-1")
    server("in-cluster", allocation=ServerAllocation.CLUSTER, allocated_to="farm")
    server("not-ready", state=ServerState.REGISTERED)
    response = signed_in(world.operator, world.alpha).get(PAGE)
    assert response.status_code == 200
    assert len(response.context["table"].page.object_list) == 2
    choices = [name for name, _label in response.context["form"].fields["server"].choices
               if name]
    # Leased servers stay choosable (another window may be free); cluster nodes and servers
    # that are not provisioned are not.
    assert sorted(str(name) for name in choices) == ["free-1", "h1", "h2"]
    content = response.content.decode()
    assert "New lease" in content and ">Cancel</button>" in content
    assert "data-confirm=\"Cancel lease" in content
    assert content.count('id="id_tenant"') == 1  # the filter's; the form's ids differ


def test_a_platform_admin_leases_a_server(signed_in, world):
    server()
    response = signed_in(world.operator).post(CREATE, form_data(note="eval week"))
    assert response.status_code == 302 and response.url == PAGE
    made = Lease.objects.get()
    assert (made.server.name, made.tenant, made.starts_at, made.state, made.note) == (
        "h100-01", world.alpha, T0, LeaseState.SCHEDULED, "eval week")
    page = signed_in(world.operator).get(PAGE).content.decode()
    assert "h100-01 leased to alpha" in page


def test_an_empty_start_means_now(signed_in, world):
    server()
    end = datetime.now(UTC) + 3 * HOUR
    signed_in(world.operator).post(CREATE, form_data(starts_at="",
                                                     ends_at=f"{end:%Y-%m-%dT%H:%M}"))
    assert Lease.objects.get().state == LeaseState.ACTIVE


def test_the_form_shows_the_services_refusals(signed_in, world):
    lease(world, server())
    server("h100-02")
    client = signed_in(world.operator)
    overlap = client.post(CREATE, form_data(tenant="beta"))
    assert overlap.status_code == 200
    assert "leases of one server cannot overlap" in overlap.content.decode()
    over_quota = client.post(CREATE, form_data(server="h100-02"))
    assert (f"alpha would lease 16 GPUs at once from {T0.year}-12-01 10:00 UTC; its quota is 8"
            in over_quota.content.decode())
    backwards = client.post(CREATE, form_data(server="h100-02", tenant="beta",
                                              ends_at=f"{T0 - HOUR:%Y-%m-%dT%H:%M}"))
    assert "must come after the start" in backwards.context["form"].errors["ends_at"][0]
    missing = client.post(CREATE, form_data(server="", ends_at=""))
    assert set(missing.context["form"].errors) == {"server", "ends_at"}
    assert Lease.objects.count() == 1


@pytest.mark.parametrize("user", ["alpha_admin", "alpha_member"])
def test_only_platform_admins_create_and_end(signed_in, world, user):
    made = lease(world, server())
    server("h100-02")
    client = signed_in(getattr(world, user))
    assert client.post(CREATE, form_data(server="h100-02")).status_code == 403
    assert client.post(reverse("frontend:lease-end", args=[made.pk])).status_code == 403
    made.refresh_from_db()
    assert made.state == LeaseState.SCHEDULED and Lease.objects.count() == 1


def test_another_tenants_lease_is_not_found(signed_in, world):
    theirs = lease(world, server(), tenant=world.beta)
    response = signed_in(world.alpha_admin).post(reverse("frontend:lease-end", args=[theirs.pk]))
    assert response.status_code == 404


def test_cancel_and_end(signed_in, world):
    scheduled = lease(world, server("h1"))
    now = datetime.now(UTC)
    active = lease(world, server("h2"), start=now, end=now + 5 * HOUR)
    client = signed_in(world.operator)
    page = client.get(PAGE).content.decode()
    assert ">End</button>" in page and "End lease" in page

    response = client.post(reverse("frontend:lease-end", args=[scheduled.pk]), follow=True)
    assert f"Lease {scheduled.pk} of h1 cancelled." in response.content.decode()
    response = client.post(reverse("frontend:lease-end", args=[active.pk]), follow=True)
    assert f"Lease {active.pk} of h2 ended; its usage is recorded." in response.content.decode()
    assert UsageRecord.objects.filter(source=f"lease {active.pk}").count() == 1
    again = client.post(reverse("frontend:lease-end", args=[active.pk]), follow=True)
    assert f"Lease {active.pk} is already ended." in again.content.decode()


def test_filters_and_the_htmx_partial(signed_in, world):
    lease(world, server("h1"))
    now = datetime.now(UTC)
    lease(world, server("h2"), start=now, end=now + HOUR)
    client = signed_in(world.operator)
    response = client.get(PAGE, {"state": "active"}, HTTP_HX_REQUEST="true")
    content = response.content.decode()
    assert content.lstrip().startswith('<div id="table-area"')
    assert [row.record.server.name for row in response.context["table"].page.object_list] == \
        ["h2"]


def test_the_page_pins_its_query_count(signed_in, world, django_assert_max_num_queries):
    for number in range(10):
        lease(world, server(f"h{number}", expected_gpu_count=0))
    client = signed_in(world.alpha_member)
    client.get(PAGE)
    with django_assert_max_num_queries(7):
        assert client.get(PAGE).status_code == 200
