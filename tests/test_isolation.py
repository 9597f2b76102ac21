"""The rule of isolation, checked on every registered API route.

A route added later is covered automatically; the test fails until its model has an entry in
OWNED_OBJECTS saying how to make one object owned by a given tenant and user.
"""

import pytest
from django.urls import reverse

from aistation.models import Job, Notebook, Queue
from infra_os.models import ApiToken, AuditEvent, Membership, Quota, Tenant
from podsys.models import Cluster, Node
from tests.api_routes import api_routes
from tests.factories import (
    ApiTokenFactory,
    AuditEventFactory,
    ClusterFactory,
    JobFactory,
    NodeFactory,
    QueueFactory,
)

VIEWSETS, PLAIN_ROUTES = api_routes()
OPEN_ROUTES = {"infra_os-api:login"}
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")


def _tenant_cluster(tenant):
    return ClusterFactory(name=f"{tenant.name}-cluster", tenant=tenant)


# model → how to make an object that belongs to (tenant, user)
OWNED_OBJECTS = {
    Tenant: lambda tenant, user: tenant,
    Membership: lambda tenant, user: Membership.objects.get(tenant=tenant, user=user),
    Quota: lambda tenant, user: tenant.quota,
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
}
# model → the tenant a row belongs to (None: shared with every tenant); default `row.tenant`
TENANT_OF = {
    Tenant: lambda row: row,
    Node: lambda row: row.cluster.tenant,
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
    lookup = routes.viewset.lookup_field
    return reverse(name, kwargs={lookup: getattr(obj, lookup)})


def _send(client, method, url):
    return getattr(client, method.lower())(url, {}, format="json")


def _ids(ids):
    return [routes.viewset.__name__ for routes in ids]


def test_routes_were_found():
    names = {routes.viewset.__name__ for routes in VIEWSETS}
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
