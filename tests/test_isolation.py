"""The rule of isolation, checked on every registered API route.

A route added later is covered automatically; the test fails until its model has an entry in
OWNED_OBJECTS saying how to make one object owned by a given tenant and user.
"""

from datetime import UTC, date, datetime

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from aistation.models import Job, Notebook, Queue, Workdir
from infra_os.choices import ServerState
from infra_os.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Lease,
    Membership,
    ProvisioningBatch,
    ProvisioningProfile,
    Quota,
    Rack,
    Server,
    Tenant,
)
from infra_os.models.billing import Invoice, PricingPlan, Reservation
from mmodel.models import (
    Benchmark,
    Deployment,
    EvaluationRun,
    Model,
    ModelImport,
    ModelVersion,
)
from podsys.models import (
    Cluster,
    ClusterGroup,
    ClusterUser,
    DeploymentRun,
    Fleet,
    HealthCheckRun,
    Node,
    StackProfile,
)
from tests.api_routes import api_routes
from tests.factories import (
    ApiTokenFactory,
    AuditEventFactory,
    ClusterFactory,
    JobFactory,
    NodeFactory,
    QueueFactory,
)
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun

ALL_VIEWSETS, PLAIN_ROUTES = api_routes()
# Viewsets of a model's rows; the others search (the log store) and are walked below.
VIEWSETS = [r for r in ALL_VIEWSETS if hasattr(r.viewset, "output_serializer_class")]
SEARCH_VIEWSETS = [r for r in ALL_VIEWSETS if r not in VIEWSETS]
# The sign-in, and the two doors of a server being installed: its boot config (by MAC) and its
# callback (its one-time token is the proof); both are tested in infra_os/tests.
OPEN_ROUTES = {"infra_os-api:login", "infra_os-api:provisioning-callback",
               "infra_os-api:provisioning-boot-config"}
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")


def _tenant_cluster(tenant):
    return ClusterFactory(name=f"{tenant.name}-cluster", tenant=tenant)


def _tenant_plan(tenant):
    """A pricing plan only this tenant is billed on (plans belong to no tenant)."""
    plan = PricingPlan.objects.create(name=f"{tenant.name}-plan")
    tenant.pricing_plan = plan
    tenant.save(update_fields=["pricing_plan"])
    return plan


def _tenant_invoice(tenant):
    return Invoice.objects.create(
        tenant=tenant, month=date(2026, 10, 1), time_zone="UTC",
        period_start=datetime(2026, 10, 1, tzinfo=UTC),
        period_end=datetime(2026, 11, 1, tzinfo=UTC),
        plan_name="", currency="USD", rated_at=datetime(2026, 11, 2, tzinfo=UTC))


def _server(tenant):
    return Server.objects.create(name=f"{tenant.name}-server", state=ServerState.PROVISIONED,
                                 expected_gpu_model="H100", expected_gpu_count=8)


def _profile(tenant):
    return ProvisioningProfile.objects.create(name=f"{tenant.name}-profile")


def _lease(tenant):
    start = datetime(2026, 10, 1, tzinfo=UTC)
    return Lease.objects.create(server=_server(tenant), tenant=tenant, starts_at=start,
                                ends_at=datetime(2026, 10, 2, tzinfo=UTC), gpus=8)


def _version(tenant):
    dataset, _ = Dataset.objects.get_or_create(tenant=tenant, name=f"{tenant.name}-data")
    return DatasetVersion.objects.create(dataset=dataset, number=dataset.versions.count() + 1,
                                         format="jsonl", path="missing", content_hash="0" * 64)


def _run_job(tenant, user):
    return JobFactory(queue=QueueFactory(tenant=tenant, cluster=_tenant_cluster(tenant)),
                      owner=user)


def _model_version(tenant):
    model, _ = Model.objects.get_or_create(tenant=tenant, name=f"{tenant.name}-model")
    return ModelVersion.objects.create(model=model, number=model.versions.count() + 1,
                                       source="import", format="safetensors", status="ready")


def _benchmark(tenant):
    return Benchmark.objects.create(tenant=tenant, name=f"{tenant.name}-bench",
                                    kind="generation", data_path="missing",
                                    content_hash="0" * 64)


# The operator's own resources, of no tenant: members of any tenant see none of them.
OPERATOR_ONLY = {Server, Rack, ProvisioningProfile, ProvisioningBatch, ClusterUser, ClusterGroup,
                 DeploymentRun, StackProfile, Fleet}

# model → how to make an object that belongs to (tenant, user)
OWNED_OBJECTS = {
    Tenant: lambda tenant, user: tenant,
    Membership: lambda tenant, user: Membership.objects.get(tenant=tenant, user=user),
    # An invitation of the tenant addressed to the user (who may already belong to it).
    Invitation: lambda tenant, user: Invitation.objects.create(
        tenant=tenant, username=user.username, expires_at=datetime(2100, 1, 1, tzinfo=UTC)),
    Quota: lambda tenant, user: tenant.quota,
    Fleet: lambda tenant, user: Fleet.objects.create(name=f"{tenant.name}-fleet"),
    ApiToken: lambda tenant, user: ApiTokenFactory(user=user),
    AuditEvent: lambda tenant, user: AuditEventFactory(tenant=tenant),
    Cluster: lambda tenant, user: _tenant_cluster(tenant),
    Node: lambda tenant, user: NodeFactory(cluster=_tenant_cluster(tenant)),
    Notebook: lambda tenant, user: Notebook.objects.create(
        tenant=tenant, owner=user, name="explore",
        queue=QueueFactory(tenant=tenant, cluster=_tenant_cluster(tenant))),
    Queue: lambda tenant, user: QueueFactory(tenant=tenant, cluster=_tenant_cluster(tenant)),
    Job: lambda tenant, user: JobFactory(
        queue=QueueFactory(tenant=tenant, cluster=_tenant_cluster(tenant)), owner=user),
    Workdir: lambda tenant, user: Workdir.objects.get_or_create(
        tenant=tenant, sha256=f"{tenant.pk:064x}", defaults={"size_bytes": 1,
                                                            "created_by": user})[0],
    PricingPlan: lambda tenant, user: _tenant_plan(tenant),
    Reservation: lambda tenant, user: Reservation.objects.create(
        tenant=tenant, gpu_model="H100", gpus=1, starts_on=date(2026, 10, 1)),
    Invoice: lambda tenant, user: _tenant_invoice(tenant),
    Lease: lambda tenant, user: _lease(tenant),
    Server: lambda tenant, user: _server(tenant),
    Rack: lambda tenant, user: Rack.objects.create(name=f"{tenant.name}-rack"),
    ProvisioningProfile: lambda tenant, user: _profile(tenant),
    ProvisioningBatch: lambda tenant, user: ProvisioningBatch.objects.create(
        name=f"{tenant.name}-batch", profile=_profile(tenant), boot_method="pxe",
        image_url="http://images.example/os.iso"),
    Dataset: lambda tenant, user: _version(tenant).dataset,
    DatasetVersion: lambda tenant, user: _version(tenant),
    PipelineRun: lambda tenant, user: PipelineRun.objects.create(
        tenant=tenant, created_by=user, name="clean", input_version=_version(tenant), steps=[],
        job=_run_job(tenant, user)),
    TrainingRun: lambda tenant, user: TrainingRun.objects.create(
        tenant=tenant, created_by=user, name="train", kind="pretrain", spec={},
        dataset_version=_version(tenant), job=_run_job(tenant, user)),
    Model: lambda tenant, user: _model_version(tenant).model,
    ModelVersion: lambda tenant, user: _model_version(tenant),
    ModelImport: lambda tenant, user: ModelImport.objects.create(
        tenant=tenant, model=_model_version(tenant).model, source_path="/nowhere"),
    Benchmark: lambda tenant, user: _benchmark(tenant),
    EvaluationRun: lambda tenant, user: EvaluationRun.objects.create(
        tenant=tenant, created_by=user, name="eval", version=_model_version(tenant),
        job=_run_job(tenant, user)),
    ClusterUser: lambda tenant, user: ClusterUser.objects.create(
        cluster=_tenant_cluster(tenant), username=f"{tenant.name}-user", uid=20000),
    ClusterGroup: lambda tenant, user: ClusterGroup.objects.create(
        cluster=_tenant_cluster(tenant), name=f"{tenant.name}-group", gid=20000),
    DeploymentRun: lambda tenant, user: DeploymentRun.objects.create(
        cluster=_tenant_cluster(tenant), kind="stack", playbook="stack.yml"),
    HealthCheckRun: lambda tenant, user: HealthCheckRun.objects.create(
        node=NodeFactory(cluster=_tenant_cluster(tenant)), check_name="gpu-presence",
        severity="fatal"),
    StackProfile: lambda tenant, user: StackProfile.objects.get_or_create(
        name=f"{tenant.name}-stack", defaults={"driver_version": "550.127.05",
                                               "cuda_version": "12.4"})[0],
    Deployment: lambda tenant, user: Deployment.objects.create(
        tenant=tenant, created_by=user, name="chat", version=_model_version(tenant),
        queue=QueueFactory(tenant=tenant, cluster=_tenant_cluster(tenant))),
}
# model → the tenant a row belongs to (None: shared with every tenant); default `row.tenant`
TENANT_OF = {
    Tenant: lambda row: row,
    Node: lambda row: row.cluster.tenant,
    HealthCheckRun: lambda row: row.node.cluster.tenant,
    PricingPlan: lambda row: row.tenants.first(),
    DatasetVersion: lambda row: row.dataset.tenant,
    ModelVersion: lambda row: row.model.tenant,
}


def _model(routes):
    return routes.viewset.output_serializer_class.Meta.model


def _owned(routes, tenant, user):
    model = _model(routes)
    assert model in OWNED_OBJECTS, (
        f"{routes.viewset.__name__}: add {model.__name__} to OWNED_OBJECTS in {__name__} so its "
        "routes are checked for isolation."
    )
    return OWNED_OBJECTS[model](tenant, user)


def _detail_url(routes, name, obj):
    """The route for `obj`; any other value it takes (a pool member's name) a made-up one."""
    lookup = routes.viewset.lookup_field
    kwargs = {key: "x" for key in routes.detail_kwargs.get(name, [])}
    return reverse(name, kwargs={**kwargs, lookup: getattr(obj, lookup)})


def _send(client, method, url):
    return getattr(client, method.lower())(url, {}, format="json")


def _ids(ids):
    return [routes.viewset.__name__ for routes in ids]


def test_routes_were_found():
    names = {routes.viewset.__name__ for routes in ALL_VIEWSETS}
    assert {"TenantViewSet", "MembershipViewSet", "ApiTokenViewSet"} <= names


@pytest.mark.parametrize("routes", VIEWSETS, ids=_ids(VIEWSETS))
def test_anonymous_requests_are_refused(routes, api, world):
    obj = _owned(routes, world.alpha, world.alpha_member)
    if routes.list_name:
        for method in routes.list_methods:
            response = _send(api, method, reverse(routes.list_name))
            assert response.status_code == 401, (method, routes.list_name)
            assert response.json()["code"] == "not_authenticated"
    for name, methods in routes.detail_routes.items():
        for method in methods:
            response = _send(api, method, _detail_url(routes, name, obj))
            assert response.status_code == 401, (method, name)


@pytest.mark.parametrize("routes", VIEWSETS, ids=_ids(VIEWSETS))
def test_lists_show_only_the_callers_tenant(routes, api, world):
    mine = _owned(routes, world.alpha, world.alpha_member)
    theirs = _owned(routes, world.beta, world.beta_member)
    response = api.as_user(world.alpha_member).get(reverse(routes.list_name), {"limit": 500})
    assert response.status_code == 200
    ids = {row["id"] for row in response.json()["results"]}
    if _model(routes) in OPERATOR_ONLY:
        assert ids == set()
        listed = api.as_user(world.operator).get(reverse(routes.list_name), {"limit": 500})
        assert {mine.pk, theirs.pk} <= {row["id"] for row in listed.json()["results"]}
        return
    assert mine.pk in ids
    assert theirs.pk not in ids
    visible = _model(routes).objects.filter(pk__in=ids)
    tenant_of = TENANT_OF.get(_model(routes), lambda row: row.tenant)
    for row in visible:
        if isinstance(row, ApiToken):
            assert row.user == world.alpha_member, f"{row!r} leaked to alpha-member"
            continue
        owner = tenant_of(row)
        assert owner in (world.alpha, None), f"{row!r} of {owner} leaked to a member of alpha"


@pytest.mark.parametrize("routes", VIEWSETS, ids=_ids(VIEWSETS))
def test_other_tenants_objects_are_not_found(routes, api, world):
    theirs = _owned(routes, world.beta, world.beta_member)
    before = _model(routes).objects.filter(pk=theirs.pk).values().first()
    client = api.as_user(world.alpha_admin)
    for name, methods in routes.detail_routes.items():
        for method in methods:
            response = _send(client, method, _detail_url(routes, name, theirs))
            assert response.status_code == 404, (method, name, response.content)
            assert response.json()["code"] == "not_found"
    assert _model(routes).objects.filter(pk=theirs.pk).values().first() == before


@pytest.mark.parametrize("routes", VIEWSETS, ids=_ids(VIEWSETS))
def test_viewers_cannot_write(routes, api, world):
    own = _owned(routes, world.alpha, world.alpha_viewer)
    before = _model(routes).objects.filter(pk=own.pk).values().first()
    client = api.as_user(world.alpha_viewer)
    viewer_actions = getattr(routes.viewset, "viewer_actions", ())
    for name, methods in routes.detail_routes.items():
        if name.rsplit("-", 1)[-1] in viewer_actions:
            continue
        for method in set(methods) & set(UNSAFE):
            response = _send(client, method, _detail_url(routes, name, own))
            assert response.status_code == 403, (method, name, response.content)
            assert response.json()["code"] == "permission_denied"
    if "POST" in routes.list_methods and "create" not in viewer_actions:
        response = _send(client, "POST", reverse(routes.list_name))
        assert response.status_code == 403
    for name, methods in routes.list_actions.items():
        for method in set(methods) & set(UNSAFE):
            response = _send(client, method, reverse(name))
            assert response.status_code == 403, (method, name, response.content)
    assert _model(routes).objects.filter(pk=own.pk).values().first() == before


CLOSED_PLAIN_ROUTES = [route for route in PLAIN_ROUTES if route.name not in OPEN_ROUTES]


@pytest.mark.parametrize(
    "route", CLOSED_PLAIN_ROUTES, ids=[route.name for route in CLOSED_PLAIN_ROUTES]
)
def test_plain_routes_need_authentication(route, api, db):
    view = route.view
    methods = [m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)]
    for method in methods:
        response = _send(api, method, reverse(route.name))
        assert response.status_code == 401, (method, route.name)


# Search routes ------------------------------------------------------------------------------


def _log_lines(tenant, user, store):
    """A job of the tenant with a line in the log store; the query that finds it."""
    from datetime import timedelta

    from django.utils import timezone

    from aistation.logstore.base import LogLine

    job = JobFactory(queue=QueueFactory(tenant=tenant), owner=user)
    store.append([LogLine(ts=timezone.now() - timedelta(minutes=1),
                          message=f"NCCL WARN {tenant.name} secret-{job.pk}",
                          tenant_id=tenant.pk, job_id=job.pk, attempt=1, replica=0,
                          line_no=1)])
    return {"q": f"secret-{job.pk}", "job": job.pk, "attempt": 1, "line": 1}


# viewset → plants one object of a tenant where the viewset searches; returns the query
# parameters that find it for its owner.
SEARCHED = {"LogViewSet": _log_lines}


def _found(response) -> bool:
    if response.status_code == 404:
        return False
    assert response.status_code == 200, response.content
    body = response.json()
    return bool(body.get("results") or body.get("lines") or body.get("total"))


def _search_urls(routes):
    return [routes.list_name, *routes.list_actions]


@pytest.mark.parametrize("routes", SEARCH_VIEWSETS, ids=_ids(SEARCH_VIEWSETS))
def test_searches_never_cross_tenants(routes, api, world, log_store):
    name = routes.viewset.__name__
    assert name in SEARCHED, f"{name}: add it to SEARCHED in {__name__} to walk it."
    theirs = SEARCHED[name](world.beta, world.beta_member, log_store)
    mine = SEARCHED[name](world.alpha, world.alpha_member, log_store)
    for url_name in _search_urls(routes):
        url = reverse(url_name)
        assert _send(APIClient(), "GET", url).status_code == 401, url_name
        owner = api.as_user(world.beta_member).get(url, theirs)
        assert _found(owner), (url_name, owner.content)
        for attacker in (world.alpha_member, world.alpha_admin, world.alpha_viewer):
            client = api.as_user(attacker)
            # Their exact query, the same without the job, and every job id nearby.
            assert not _found(client.get(url, theirs)), url_name
            without_job = {k: v for k, v in theirs.items() if k not in ("job", "attempt")}
            if url_name == routes.list_name or "histogram" in url_name:
                assert not _found(client.get(url, without_job)), url_name
            for job in range(max(1, theirs["job"] - 2), theirs["job"] + 3):
                probe = client.get(url, {**theirs, "job": job, "q": "secret"})
                if job != mine["job"]:
                    assert not _found(probe), (url_name, job)
