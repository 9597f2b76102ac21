"""Making fleets of clusters and their elastic pools (platform admins only)."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.services.audit import audit_record
from podsys.models import Cluster, ElasticPool, Fleet
from podsys.providers.base import ProviderError, provider_for


@transaction.atomic
def fleet_create(*, actor, name: str, clusters: list[Cluster], display_name: str = "") -> Fleet:
    """A fleet of `clusters`; a cluster is in one fleet at most."""
    require_platform_admin(actor)
    taken = [c.name for c in clusters if c.fleet_id]
    if taken:
        raise ValidationError({"clusters": f"Already in a fleet: {', '.join(taken)}."})
    owners = {c.tenant_id for c in clusters}
    if len(owners) > 1:
        raise ValidationError({"clusters": "A fleet's clusters are all shared or all the same "
                               "tenant's."})
    fleet = Fleet(name=name, display_name=display_name)
    fleet.full_clean()
    fleet.save()
    Cluster.objects.filter(pk__in=[c.pk for c in clusters]).update(fleet=fleet)
    for cluster in clusters:
        cluster.fleet = fleet
    audit_record(actor=actor, action="fleet.create", obj=fleet,
                 changes={"clusters": [c.name for c in clusters]})
    return fleet


@transaction.atomic
def pool_create(*, actor, fleet: Fleet, name: str, cluster: Cluster, provider: str,
                node_type: str, max_nodes: int, provider_options: dict | None = None,
                max_spend_per_month: Decimal | int = 0, cool_down_s: int = 600) -> ElasticPool:
    """An elastic pool whose nodes join `cluster`; the provider must answer and sell
    `node_type`."""
    require_platform_admin(actor)
    if cluster.fleet_id != fleet.pk:
        raise ValidationError({"cluster": f"Cluster {cluster.name} is not in fleet {fleet.name}."})
    try:
        provider_for(provider, name=name, options=provider_options).node_type(node_type)
    except ProviderError as exc:
        raise ValidationError({"provider": str(exc)}) from exc
    pool = ElasticPool(fleet=fleet, name=name, cluster=cluster, provider=provider,
                       provider_options=dict(provider_options or {}), node_type=node_type,
                       max_nodes=max_nodes, max_spend_per_month=max_spend_per_month,
                       cool_down_s=cool_down_s)
    pool.full_clean()
    pool.save()
    audit_record(actor=actor, action="pool.create", obj=pool,
                 changes={"cluster": cluster.name, "node_type": node_type,
                          "max_nodes": max_nodes})
    return pool
