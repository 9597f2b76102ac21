"""The routing table: every deployment by name, with its ready replicas and its tenant's rate
limits, loaded from the database every `REFRESH_S` seconds off the request path (the first
load waits). Replicas are picked by least outstanding requests in this process; a request for
a pool's member goes to a replica that holds it when one does (see `pick`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field

from django.conf import settings

from mmodel.gateway.db import run_db
from mmodel.gateway.errors import GatewayError, bad_request, model_not_found

logger = logging.getLogger("mmodel.gateway")

REFRESH_S = 1.0
# A table this old was not refreshed in the background (its loop stopped, or the database
# was slow): the next request loads one itself.
STALE_S = 10 * REFRESH_S
# A replica that refused a connection stays out of this process's table this long, even if
# the database still calls it ready (its unready mark is written in the background).
SUSPECT_S = 10.0
# A pool's member goes to the least busy replica that holds it, unless every holder has this
# many more requests in flight than the least busy replica: then that one loads it too.
SPREAD_AT = 4


@dataclass(slots=True)
class Replica:
    id: int
    upstream: str
    served_model: str
    # A pool's replica: the members it held at its last health check.
    holds: frozenset[str] = frozenset()


@dataclass(slots=True)
class Limits:
    tenant_rpm: int
    tenant_tpm: int
    token_rpm: int
    token_tpm: int


@dataclass(slots=True)
class Route:
    deployment_id: int
    tenant_id: int
    tenant_name: str
    name: str
    active: bool
    scaled_to_zero: bool
    created: int
    limits: Limits
    replicas: list[Replica] = field(default_factory=list)
    # What every request to its replicas carries: their key (they answer nothing without it).
    headers: dict[str, str] = field(default_factory=lambda: dict(UPSTREAM_HEADERS))
    # The folder with the served weights' config and tokenizer ("": unknown), for the context
    # check.
    folder: str = ""
    # A pool's members: their model names and folders (as `folder`).
    members: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Table:
    by_name: dict[str, list[Route]]
    loaded_at: float


UPSTREAM_HEADERS = {"Content-Type": "application/json"}

_table: Table | None = None
_refreshing: asyncio.Future | None = None
# Bumped by reload_now(), so a background load begun before it never replaces its table.
_generation = 0
_outstanding: dict[int, int] = {}
_suspect: dict[int, float] = {}
_turn = itertools.count()
# Where this process last sent each pool member: (deployment id, member) -> replica id.
_placed: dict[tuple[int, str], int] = {}
# Deployment keys by their stored (encrypted) form: decrypted once, not on every refresh.
_keys: dict[str, str] = {}


def load_table() -> Table:
    """Read the table from the database (in a worker thread, or a test's thread)."""
    from aistation.choices import JobState
    from mmodel.models import Deployment, DeploymentMember, DeploymentReplica, GatewayLimit

    routes: dict[int, Route] = {}
    overrides = {row.tenant_id: row for row in GatewayLimit.objects.all()}
    deployments = Deployment.objects.filter(tenant__is_active=True).select_related(
        "tenant", "version__base_version")
    for dep in deployments:
        row = overrides.get(dep.tenant_id)
        limits = Limits(
            tenant_rpm=_pick(row, "requests_per_minute", settings.OGAI_GATEWAY_TENANT_RPM),
            tenant_tpm=_pick(row, "tokens_per_minute", settings.OGAI_GATEWAY_TENANT_TPM),
            token_rpm=_pick(row, "token_requests_per_minute", settings.OGAI_GATEWAY_TOKEN_RPM),
            token_tpm=_pick(row, "token_tokens_per_minute", settings.OGAI_GATEWAY_TOKEN_TPM),
        )
        routes[dep.pk] = Route(
            deployment_id=dep.pk, tenant_id=dep.tenant_id, tenant_name=dep.tenant.name,
            name=dep.name, active=dep.active, scaled_to_zero=dep.scaled_to_zero,
            created=int(dep.created_at.timestamp()), limits=limits,
            headers=_headers(dep.api_key), folder=_folder(dep.version))
    members = DeploymentMember.objects.filter(deployment_id__in=list(routes)) \
        .select_related("version__base_version")
    for member in members:
        routes[member.deployment_id].members[member.name] = _folder(member.version)
    replicas = (DeploymentReplica.objects
                .filter(deployment_id__in=list(routes), ready=True, job__state=JobState.RUNNING)
                .exclude(upstream="").order_by("deployment_id", "index")
                .values_list("pk", "deployment_id", "upstream", "served_model", "holds"))
    now = time.monotonic()
    for pk, deployment_id, upstream, served_model, holds in replicas:
        if _suspect.get(pk, 0.0) > now:
            continue
        routes[deployment_id].replicas.append(
            Replica(id=pk, upstream=upstream.rstrip("/"), served_model=served_model,
                    holds=frozenset(holds or ())))
    by_name: dict[str, list[Route]] = {}
    for route in routes.values():
        for name in (route.name, *route.members):
            by_name.setdefault(name, []).append(route)
            by_name.setdefault(f"{route.tenant_name}/{name}", []).append(route)
    return Table(by_name=by_name, loaded_at=time.monotonic())


def _headers(stored_key: str) -> dict[str, str]:
    if not stored_key:  # made before deployments had keys: its replicas ask for none
        return dict(UPSTREAM_HEADERS)
    key = _keys.get(stored_key)
    if key is None:
        from ogai.crypto import DecryptionError, decrypt

        try:
            key = decrypt(stored_key)
        except DecryptionError:
            logger.exception("gateway: a deployment's key cannot be decrypted")
            key = ""
        if len(_keys) > 10_000:
            _keys.clear()
        _keys[stored_key] = key
    return {**UPSTREAM_HEADERS, "Authorization": f"Bearer {key}"}


def _folder(version) -> str:
    """Where the served weights' config and tokenizer are: an adapter's are its base's."""
    from mmodel.services.adapters import is_adapter
    from mmodel.storage import absolute

    source = version.base_version if is_adapter(version) else version
    if source is None or not source.artifact_path:
        return ""
    return str(absolute(source.artifact_path))


def _pick(row, name: str, default: int) -> int:
    value = getattr(row, name, None) if row is not None else None
    return default if value is None else value


def reload_now() -> Table:
    """Load the table in this thread and put it in place (tests, after changing deployments)."""
    global _table, _generation
    _generation += 1
    _table = load_table()
    return _table


async def refresh() -> Table:
    """Load the table in a worker thread; concurrent callers share one load."""
    global _table, _refreshing
    loop = asyncio.get_running_loop()
    if _refreshing is not None and _refreshing.get_loop() is loop and not _refreshing.done():
        return await asyncio.shield(_refreshing)
    _refreshing = future = loop.create_future()
    generation = _generation
    try:
        table = await run_db(load_table)
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()
        raise
    if generation == _generation or _table is None:
        _table = table
    else:
        table = _table
    future.set_result(table)
    return table


async def table() -> Table:
    current = _table
    if current is None or time.monotonic() - current.loaded_at > STALE_S:
        current = await refresh()
    return current


def visible_routes(tab: Table, tenant_ids: frozenset[int]) -> list[Route]:
    """The caller's deployments, once each."""
    seen: dict[int, Route] = {}
    for name, routes in tab.by_name.items():
        if "/" in name:
            continue
        for route in routes:
            if route.tenant_id in tenant_ids:
                seen.setdefault(route.deployment_id, route)
    return list(seen.values())


def member_of(route: Route, model: str) -> str:
    """The pool member `model` (`name` or `tenant/name`) names in `route`; "" for its base."""
    name = model.rsplit("/", 1)[-1]
    return name if name in route.members else ""


def resolve(tab: Table, model: str, tenant_ids: frozenset[int]) -> Route:
    """The deployment `model` names among the caller's tenants (`name` or `tenant/name`)."""
    routes = tab.by_name.get(model)
    if routes is None:
        raise model_not_found(model)
    if len(routes) == 1:
        route = routes[0]
        if route.tenant_id in tenant_ids:
            return route
        raise model_not_found(model)
    mine = [route for route in routes if route.tenant_id in tenant_ids]
    if not mine:
        raise model_not_found(model)
    if len(mine) > 1:
        names = ", ".join(sorted(f"{r.tenant_name}/{r.name}" for r in mine))
        raise bad_request(f"`{model}` is a model of more than one of your tenants: name it as "
                          f"tenant/model ({names}).", param="model", code="ambiguous_model")
    return mine[0]


def pick(route: Route, exclude: set[int] | None = None, member: str = "") -> Replica | None:
    """The ready replica with the fewest requests in flight from this process (ties rotate).
    For a pool's `member`: the least busy replica that holds it (by its last health check, or
    because this process sent it there last), unless all holders are SPREAD_AT requests busier
    than the least busy replica; that one then loads it."""
    replicas = route.replicas
    count = len(replicas)
    if count == 1:
        replica = replicas[0]
        return None if exclude and replica.id in exclude else replica
    best = _least_busy(replicas, exclude)
    if not member or best is None:
        return best
    placed = _placed.get((route.deployment_id, member))
    holder = _least_busy([r for r in replicas if member in r.holds or r.id == placed], exclude)
    if holder is not None and \
            _outstanding.get(holder.id, 0) - _outstanding.get(best.id, 0) < SPREAD_AT:
        best = holder
    if len(_placed) > 100_000:
        _placed.clear()
    _placed[(route.deployment_id, member)] = best.id
    return best


def _least_busy(replicas: list[Replica], exclude: set[int] | None) -> Replica | None:
    count = len(replicas)
    best: Replica | None = None
    best_load = 0
    start = next(_turn)
    for i in range(count):
        replica = replicas[(start + i) % count]
        if exclude and replica.id in exclude:
            continue
        load = _outstanding.get(replica.id, 0)
        if best is None or load < best_load:
            best, best_load = replica, load
    return best


def begin(replica: Replica) -> None:
    _outstanding[replica.id] = _outstanding.get(replica.id, 0) + 1


def end(replica: Replica) -> None:
    left = _outstanding.get(replica.id, 1) - 1
    if left > 0:
        _outstanding[replica.id] = left
    else:
        _outstanding.pop(replica.id, None)


def drop(route: Route, replica: Replica) -> None:
    """Take a replica that does not answer out of this process's table at once."""
    _suspect[replica.id] = time.monotonic() + SUSPECT_S
    route.replicas = [r for r in route.replicas if r.id != replica.id]
    if len(_suspect) > 10_000:
        now = time.monotonic()
        for key in [k for k, until in _suspect.items() if until <= now]:
            _suspect.pop(key, None)


def state_error(route: Route) -> GatewayError | None:
    """Why the deployment cannot take a request now (None: it can)."""
    if route.replicas:
        return None
    from mmodel.gateway.errors import unavailable

    if not route.active:
        return unavailable(f"The model `{route.name}` is stopped: start its deployment first.",
                           "model_stopped", None)
    if route.scaled_to_zero:
        return unavailable(f"The model `{route.name}` is starting (it was scaled to zero); "
                           "retry shortly.", "model_starting", WAKE_RETRY_AFTER_S)
    return unavailable(f"The model `{route.name}` has no ready replica yet; retry shortly.",
                       "no_ready_replica", STARTING_RETRY_AFTER_S)


WAKE_RETRY_AFTER_S = 10
STARTING_RETRY_AFTER_S = 5


def reset() -> None:
    """Forget the table and the in-flight counts (tests)."""
    global _table, _refreshing
    _table = None
    _refreshing = None
    _outstanding.clear()
    _suspect.clear()
    _placed.clear()
