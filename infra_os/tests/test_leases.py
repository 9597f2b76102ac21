"""Server leases: overlap, quota (peak over time), activation and end by the sweep, usage,
isolation, the API, and the same rules under concurrent requests."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import close_old_connections
from django.utils import timezone

from infra_os.choices import LeaseState, ServerAllocation, ServerState
from infra_os.models import AuditEvent, Lease, Server, UsageRecord
from infra_os.selectors import lease_list, leased_gpus_by_tenant
from infra_os.services.leases import lease_create, lease_end, lease_sweep
from infra_os.services.quotas import quota_update
from infra_os.services.servers_allocation import server_set_allocation

# A fixed moment well ahead, so messages can be checked word for word.
T0 = datetime(timezone.now().year + 1, 12, 1, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def server(name="h100-01", *, state=ServerState.PROVISIONED, model="H100", gpus=8, **extra):
    return Server.objects.create(name=name, state=state, expected_gpu_model=model,
                                 expected_gpu_count=gpus, **extra)


def lease(world, srv, start, end, tenant=None, **extra):
    return lease_create(actor=world.operator, server=srv, tenant=tenant or world.alpha,
                        starts_at=start, ends_at=end, **extra)


def refused(call) -> str:
    with pytest.raises(ValidationError) as caught:
        call()
    return " ".join(caught.value.messages)


# -- creating --------------------------------------------------------------------------------


def test_a_lease_starting_now_is_active_and_copies_the_servers_gpus(world):
    srv = server()
    srv.gpu_model, srv.gpu_count = "H100 80GB HBM3", 8  # what the BMC reported wins
    srv.save()
    made = lease(world, srv, timezone.now(), timezone.now() + 24 * HOUR, note="training run")
    assert made.state == LeaseState.ACTIVE
    assert (made.gpus, made.gpu_model) == (8, "H100 80GB HBM3")
    assert made.created_by == world.operator
    event = AuditEvent.objects.get(action="lease.create")
    assert event.tenant == world.alpha and event.changes["server"] == "h100-01"


def test_a_later_lease_is_scheduled(world):
    made = lease(world, server(), T0, T0 + 2 * HOUR)
    assert made.state == LeaseState.SCHEDULED
    assert made.starts_at == T0


def test_a_start_in_the_last_minute_is_now_and_older_is_refused(world):
    now = timezone.now()
    made = lease(world, server(), now - timedelta(seconds=30), now + HOUR)
    assert made.state == LeaseState.ACTIVE and made.starts_at >= now
    message = refused(lambda: lease(world, server("h100-02"), now - 2 * HOUR, now + HOUR))
    assert "is in the past" in message


@pytest.mark.parametrize("start, end, words", [
    (T0, T0, "must come after the start"),
    (T0, T0 - HOUR, "must come after the start"),
    (T0, T0 + timedelta(days=4 * 365), "A lease lasts at most 1096 days"),
])
def test_impossible_times_are_refused(world, start, end, words):
    assert words in refused(lambda: lease(world, server(), start, end))
    assert not Lease.objects.exists()


def test_naive_times_are_refused(world):
    naive = datetime(T0.year, 12, 1, 10, 0)
    assert "time zone" in refused(lambda: lease(world, server(), naive, T0 + HOUR))


@pytest.mark.parametrize("state", [ServerState.REGISTERED, ServerState.PROVISIONING,
                                   ServerState.FAILED, ServerState.RETIRED])
def test_only_a_provisioned_server_is_leased(world, state):
    message = refused(lambda: lease(world, server(state=state), T0, T0 + HOUR))
    assert "only a provisioned server can be leased" in message
    assert not Lease.objects.exists()


def test_a_cluster_node_is_not_leased(world):
    srv = server(allocation=ServerAllocation.CLUSTER, allocated_to="farm")
    message = refused(lambda: lease(world, srv, T0, T0 + HOUR))
    assert message == ("h100-01 is a node of cluster farm; take it out of the cluster before "
                       "leasing it.")


def test_only_platform_admins_lease_and_end(world):
    srv = server()
    for user in (world.alpha_admin, world.alpha_member, world.beta_admin):
        with pytest.raises(PermissionDenied):
            lease_create(actor=user, server=srv, tenant=world.alpha, starts_at=T0,
                         ends_at=T0 + HOUR)
    made = lease(world, srv, T0, T0 + HOUR)
    with pytest.raises(PermissionDenied):
        lease_end(actor=world.alpha_admin, lease=made)
    made.refresh_from_db()
    assert made.state == LeaseState.SCHEDULED


def test_an_inactive_tenant_gets_no_lease(world):
    world.alpha.is_active = False
    world.alpha.save()
    assert "alpha is inactive" in refused(lambda: lease(world, server(), T0, T0 + HOUR))


# -- overlap -----------------------------------------------------------------------------------


def test_leases_of_one_server_cannot_overlap(world):
    srv = server()
    first = lease(world, srv, T0, T0 + 10 * HOUR)
    message = refused(lambda: lease(world, srv, T0 + 9 * HOUR, T0 + 12 * HOUR,
                                    tenant=world.beta))
    year = T0.year
    assert message == (f"h100-01 is already leased to alpha from {year}-12-01 10:00 UTC to "
                       f"{year}-12-01 20:00 UTC (lease {first.pk}); leases of one server "
                       "cannot overlap.")
    # A window inside, and one around, are refused too.
    refused(lambda: lease(world, srv, T0 + HOUR, T0 + 2 * HOUR, tenant=world.beta))
    refused(lambda: lease(world, srv, T0 - HOUR, T0 + 11 * HOUR, tenant=world.beta))
    assert Lease.objects.count() == 1


def test_touching_leases_are_allowed(world):
    srv = server()
    lease(world, srv, T0, T0 + 10 * HOUR)
    after = lease(world, srv, T0 + 10 * HOUR, T0 + 20 * HOUR, tenant=world.beta)
    before = lease(world, srv, T0 - 5 * HOUR, T0, tenant=world.beta)
    assert after.state == before.state == LeaseState.SCHEDULED
    assert Lease.objects.count() == 3


def test_an_ended_or_cancelled_lease_frees_its_window(world):
    srv = server()
    first = lease(world, srv, T0, T0 + 10 * HOUR)
    lease_end(actor=world.operator, lease=first)
    again = lease(world, srv, T0, T0 + 10 * HOUR, tenant=world.beta)
    assert again.tenant == world.beta


# -- quota -------------------------------------------------------------------------------------


def test_quota_exceeded_is_refused_with_the_numbers(world):
    lease(world, server("h100-01"), T0 + 5 * HOUR, T0 + 10 * HOUR)
    message = refused(lambda: lease(world, server("h100-02"), T0, T0 + 20 * HOUR))
    assert message == (f"alpha would lease 16 GPUs at once from {T0.year}-12-01 15:00 UTC; its "
                       "quota is 8.")
    # Beta's quota is its own.
    assert lease(world, server("h100-03"), T0, T0 + 20 * HOUR, tenant=world.beta).gpus == 8


def test_the_quota_counts_the_peak_not_the_sum(world):
    quota_update(actor=world.operator, quota=world.alpha.quota, gpus=16)
    lease(world, server("s1"), T0, T0 + 5 * HOUR)
    lease(world, server("s2"), T0 + 6 * HOUR, T0 + 10 * HOUR)
    # 24 GPUs in all over the window, but never more than 16 at once.
    lease(world, server("s3"), T0, T0 + 10 * HOUR)
    message = refused(lambda: lease(world, server("s4"), T0 + 4 * HOUR, T0 + 7 * HOUR))
    assert message == (f"alpha would lease 24 GPUs at once from {T0.year}-12-01 14:00 UTC; its "
                       "quota is 16.")
    # Where s1 and s2 leave a gap, one more fits; touching s1's end and s2's start.
    assert lease(world, server("s5"), T0 + 5 * HOUR, T0 + 6 * HOUR).gpus == 8


def test_a_gpu_model_limit_is_kept(world):
    quota_update(actor=world.operator, quota=world.alpha.quota, gpus=16,
                 gpu_model_limits={"H100": 8})
    lease(world, server("h1"), T0, T0 + HOUR)
    message = refused(lambda: lease(world, server("h2"), T0, T0 + HOUR))
    assert message == (f"alpha would lease 16 H100 GPUs at once from {T0.year}-12-01 10:00 "
                       "UTC; its H100 limit is 8.")
    assert lease(world, server("a1", model="A100"), T0, T0 + HOUR).gpu_model == "A100"


def test_ended_and_cancelled_leases_do_not_count(world):
    first = lease(world, server("h1"), T0, T0 + HOUR)
    lease_end(actor=world.operator, lease=first)  # cancelled: it had not started
    assert lease(world, server("h2"), T0, T0 + HOUR).gpus == 8


def test_a_server_without_gpus_needs_no_quota(world):
    quota_update(actor=world.operator, quota=world.alpha.quota, gpus=0)
    made = lease(world, server("cpu-01", model="", gpus=0), T0, T0 + HOUR)
    assert made.gpus == 0


# -- the sweep, ending and cancelling --------------------------------------------------------


def test_the_sweep_activates_and_ends_each_lease_once(world):
    made = lease(world, server(), T0, T0 + 2 * HOUR)
    assert lease_sweep(now=T0 - timedelta(seconds=1)) == (0, 0)
    assert lease_sweep(now=T0) == (1, 0)
    assert lease_sweep(now=T0 + HOUR) == (0, 0)
    made.refresh_from_db()
    assert made.state == LeaseState.ACTIVE and made.ended_at is None
    assert not UsageRecord.objects.exists()

    # The sweep comes late: the lease still ends (and bills) at its planned end.
    assert lease_sweep(now=T0 + 3 * HOUR) == (0, 1)
    assert lease_sweep(now=T0 + 4 * HOUR) == (0, 0)
    made.refresh_from_db()
    assert made.state == LeaseState.ENDED and made.ended_at == T0 + 2 * HOUR
    record = UsageRecord.objects.get()
    assert (record.kind, record.source, record.tenant) == ("lease", f"lease {made.pk}",
                                                           world.alpha)
    assert (record.started_at, record.ended_at) == (T0, T0 + 2 * HOUR)
    assert (record.gpus, record.gpu_model, record.cpu_cores) == (8, "H100", 0)
    assert record.gpu_seconds == 8 * 2 * 3600
    actions = list(AuditEvent.objects.filter(object_id=str(made.pk))
                   .order_by("pk").values_list("action", "actor_name"))
    assert actions == [("lease.create", "operator"), ("lease.activate", "system"),
                       ("lease.end", "system")]


def test_a_lease_the_sweep_missed_entirely_is_activated_and_ended_at_once(world):
    made = lease(world, server(), T0, T0 + HOUR)
    assert lease_sweep(now=T0 + 5 * HOUR) == (1, 1)
    made.refresh_from_db()
    assert made.state == LeaseState.ENDED
    assert UsageRecord.objects.get().gpu_seconds == 8 * 3600


def test_ending_an_active_lease_early_bills_until_now(world):
    now = timezone.now()
    made = lease(world, server(), now, now + 10 * HOUR)
    Lease.objects.filter(pk=made.pk).update(starts_at=now - 3 * HOUR)  # it began 3 h ago
    ended = lease_end(actor=world.operator, lease=made)
    assert ended.state == LeaseState.ENDED
    assert now <= ended.ended_at <= timezone.now()
    record = UsageRecord.objects.get(source=f"lease {made.pk}")
    assert record.ended_at == ended.ended_at
    assert record.gpu_seconds / 3600 == pytest.approx(24, abs=0.01)
    assert lease_sweep(now=now + 11 * HOUR) == (0, 0)
    assert UsageRecord.objects.count() == 1
    assert "already ended" in refused(lambda: lease_end(actor=world.operator, lease=made))


def test_cancelling_a_scheduled_lease_records_no_usage(world):
    made = lease(world, server(), T0, T0 + HOUR)
    cancelled = lease_end(actor=world.operator, lease=made)
    assert cancelled.state == LeaseState.CANCELLED and cancelled.ended_at is None
    assert lease_sweep(now=T0 + 2 * HOUR) == (0, 0)
    assert not UsageRecord.objects.exists()
    assert AuditEvent.objects.filter(action="lease.cancel", object_id=str(made.pk)).exists()
    assert "already cancelled" in refused(lambda: lease_end(actor=world.operator, lease=made))


# -- reads -------------------------------------------------------------------------------------


def test_leased_gpus_count_while_in_force(world):
    lease(world, server("h1"), T0, T0 + 2 * HOUR)
    lease(world, server("h2"), T0, T0 + HOUR, tenant=world.beta)
    ids = [world.alpha.pk, world.beta.pk]
    assert leased_gpus_by_tenant(tenant_ids=ids, at=T0 - HOUR) == {}
    # In force from its start even before the sweep marks it active.
    assert leased_gpus_by_tenant(tenant_ids=ids, at=T0) == {world.alpha.pk: 8, world.beta.pk: 8}
    assert leased_gpus_by_tenant(tenant_ids=ids, at=T0 + HOUR) == {world.alpha.pk: 8}


def test_members_see_their_tenants_leases_only(world):
    mine = lease(world, server("h1"), T0, T0 + HOUR)
    theirs = lease(world, server("h2"), T0, T0 + HOUR, tenant=world.beta)
    assert list(lease_list(user=world.alpha_viewer)) == [mine]
    assert list(lease_list(user=world.beta_member)) == [theirs]
    assert set(lease_list(user=world.operator)) == {mine, theirs}


# -- allocation --------------------------------------------------------------------------------


def test_a_leased_server_cannot_join_a_cluster(world):
    srv = server()
    made = lease(world, srv, T0, T0 + HOUR)
    message = refused(lambda: server_set_allocation(
        actor=world.operator, server=srv, allocation=ServerAllocation.CLUSTER,
        allocated_to="farm"))
    assert f"h100-01 is leased to alpha from {T0.year}-12-01 10:00 UTC" in message
    assert "end or cancel the lease first" in message
    lease_end(actor=world.operator, lease=made)
    joined = server_set_allocation(actor=world.operator, server=srv,
                                   allocation=ServerAllocation.CLUSTER, allocated_to="farm")
    assert (joined.allocation, joined.allocated_to) == ("cluster", "farm")
    assert "node of cluster farm" in refused(lambda: lease(world, srv, T0, T0 + HOUR))


def test_allocation_refusals_are_clear(world):
    srv = server(state=ServerState.REGISTERED)
    assert "only a provisioned server can join a cluster" in refused(
        lambda: server_set_allocation(actor=world.operator, server=srv,
                                      allocation=ServerAllocation.CLUSTER, allocated_to="farm"))
    srv = server("h2", allocation=ServerAllocation.CLUSTER, allocated_to="farm")
    assert "already a node of cluster farm" in refused(
        lambda: server_set_allocation(actor=world.operator, server=srv,
                                      allocation=ServerAllocation.CLUSTER, allocated_to="other"))
    assert "Name the cluster" in refused(
        lambda: server_set_allocation(actor=world.operator, server=srv,
                                      allocation=ServerAllocation.CLUSTER, allocated_to=""))
    with pytest.raises(PermissionDenied):
        server_set_allocation(actor=world.alpha_admin, server=srv,
                              allocation=ServerAllocation.FREE)
    freed = server_set_allocation(actor=world.operator, server=srv,
                                  allocation=ServerAllocation.FREE)
    assert (freed.allocation, freed.allocated_to) == ("free", "")
    event = AuditEvent.objects.get(action="server.allocation")
    assert event.changes["allocation"] == {"from": "cluster", "to": "free"}


# -- API ---------------------------------------------------------------------------------------

URL = "/api/v1/infra-os/leases/"


def test_api_create_list_and_end(world, api):
    server("h100-01")
    client = api.as_user(world.operator)
    created = client.post(URL, {"server": "h100-01", "tenant": "alpha",
                                "starts_at": T0.isoformat(),
                                "ends_at": (T0 + 2 * HOUR).isoformat(), "note": "eval"},
                          format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["server"], body["tenant"], body["state"], body["gpus"]) == (
        "h100-01", "alpha", "scheduled", 8)
    assert body["created_by"] == "operator"

    listed = api.as_user(world.alpha_viewer).get(URL).json()
    assert [row["id"] for row in listed["results"]] == [body["id"]]
    assert api.as_user(world.alpha_viewer).get(f"{URL}?state=active").json()["results"] == []
    assert api.as_user(world.alpha_viewer).get(f"{URL}?server=h100-01").json()["count"] == 1

    ended = api.as_user(world.operator).post(f"{URL}{body['id']}/end/")
    assert ended.status_code == 200
    assert ended.json()["state"] == "cancelled"
    again = api.as_user(world.operator).post(f"{URL}{body['id']}/end/")
    assert again.status_code == 400
    assert again.json()["message"] == f"Lease {body['id']} is already cancelled."


def test_api_starts_now_when_no_start_is_given(world, api):
    server("h100-01")
    response = api.as_user(world.operator).post(URL, {
        "server": "h100-01", "tenant": "alpha",
        "ends_at": (timezone.now() + HOUR).isoformat()}, format="json")
    assert response.status_code == 201
    assert response.json()["state"] == "active"


def test_api_refusals_use_the_error_envelope(world, api):
    server("h100-01")
    server("h100-02")
    client = api.as_user(world.operator)
    window = {"starts_at": T0.isoformat(), "ends_at": (T0 + HOUR).isoformat()}
    assert client.post(URL, {"server": "h100-01", "tenant": "alpha", **window},
                       format="json").status_code == 201
    over = client.post(URL, {"server": "h100-02", "tenant": "alpha", **window}, format="json")
    assert over.status_code == 400
    assert over.json() == {
        "code": "invalid",
        "message": f"alpha would lease 16 GPUs at once from {T0.year}-12-01 10:00 UTC; its "
                   "quota is 8.",
        "fields": {"non_field_errors": [
            f"alpha would lease 16 GPUs at once from {T0.year}-12-01 10:00 UTC; its quota "
            "is 8."]},
    }
    unknown = client.post(URL, {"server": "nope", "tenant": "alpha", **window}, format="json")
    assert unknown.status_code == 400 and "server" in unknown.json()["fields"]
    no_end = client.post(URL, {"server": "h100-02", "tenant": "beta"}, format="json")
    assert no_end.status_code == 400 and "ends_at" in no_end.json()["fields"]
    backwards = client.post(URL, {"server": "h100-02", "tenant": "beta",
                                  "starts_at": T0.isoformat(), "ends_at": T0.isoformat()},
                            format="json")
    assert backwards.status_code == 400
    assert backwards.json()["message"].startswith("ends_at: The end ")


def test_api_only_platform_admins_write(world, api):
    server("h100-01")
    payload = {"server": "h100-01", "tenant": "alpha", "starts_at": T0.isoformat(),
               "ends_at": (T0 + HOUR).isoformat()}
    denied = api.as_user(world.alpha_admin).post(URL, payload, format="json")
    assert denied.status_code == 403
    assert denied.json()["message"] == "Only a platform admin can do this."
    made = lease(world, Server.objects.get(name="h100-01"), T0, T0 + HOUR)
    assert api.as_user(world.alpha_admin).post(f"{URL}{made.pk}/end/").status_code == 403
    made.refresh_from_db()
    assert made.state == LeaseState.SCHEDULED


def test_api_isolation(world, api):
    made = lease(world, server(), T0, T0 + HOUR)
    client = api.as_user(world.beta_member)
    assert client.get(URL).json()["count"] == 0
    assert client.get(f"{URL}{made.pk}/").status_code == 404
    assert client.post(f"{URL}{made.pk}/end/").status_code == 404
    assert api.as_user(world.alpha_member).get(f"{URL}{made.pk}/").json()["server"] == "h100-01"


def test_api_list_pins_its_query_count(world, api, django_assert_max_num_queries):
    for number in range(5):
        lease(world, server(f"h{number}", gpus=1), T0, T0 + HOUR)
    client = api.as_user(world.alpha_member)
    client.get(URL)
    with django_assert_max_num_queries(4):
        assert client.get(URL).json()["count"] == 5


# -- concurrency -------------------------------------------------------------------------------


def _race(calls) -> tuple[list, list[BaseException]]:
    """Run the calls at once, each in its own thread and database connection."""
    done: list = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def run(call):
        try:
            start.wait()
            done.append(call())
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done, errors


@pytest.mark.django_db(transaction=True)
def test_overlapping_leases_of_one_server_at_once_one_wins(world):
    srv = server()
    for _ in range(3):  # a race lost by luck once would pass; three in a row would not
        Lease.objects.all().delete()
        done, errors = _race([
            lambda: lease(world, srv, T0, T0 + 10 * HOUR),
            lambda: lease(world, srv, T0 + 5 * HOUR, T0 + 15 * HOUR, tenant=world.beta),
        ])
        assert len(done) == 1, errors
        assert len(errors) == 1 and isinstance(errors[0], ValidationError), errors
        assert "leases of one server cannot overlap" in " ".join(errors[0].messages)
        assert Lease.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_leases_over_the_quota_at_once_one_is_refused(world):
    first, second = server("h1"), server("h2")
    for _ in range(3):
        Lease.objects.all().delete()
        done, errors = _race([
            lambda: lease(world, first, T0, T0 + 10 * HOUR),
            lambda: lease(world, second, T0 + 5 * HOUR, T0 + 15 * HOUR),
        ])
        assert len(done) == 1, errors
        assert len(errors) == 1 and isinstance(errors[0], ValidationError), errors
        assert "its quota is 8" in " ".join(errors[0].messages)
        assert Lease.objects.count() == 1
