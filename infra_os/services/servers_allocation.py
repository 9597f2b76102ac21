"""What a provisioned server is used for: free (it may be leased) or a node of a cluster. The
cluster side lives in podsys (`podsys.services.servers`), which calls this; infra_os knows a
cluster only by its name."""

from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.choices import ACTIVE_RUN_STATES, LIVE_LEASE_STATES, ServerAllocation, ServerState
from infra_os.models import Lease, Server
from infra_os.services.audit import audit_record
from infra_os.services.leases import utc_text


@transaction.atomic
def server_set_allocation(*, actor, server: Server, allocation: str,
                          allocated_to: str = "") -> Server:
    """Make a server a cluster node (`allocated_to` names the cluster) or free it again.
    The server's row is locked, as `lease_create` locks it, so a lease and a cluster cannot
    take one server at the same time. Setting what is already set changes nothing."""
    require_platform_admin(actor)
    if allocation not in ServerAllocation.values:
        choices = ", ".join(ServerAllocation.values)
        raise ValidationError({"allocation": f"Choose one of: {choices}."})
    allocated_to = allocated_to.strip()
    server = Server.objects.select_for_update().get(pk=server.pk)
    if allocation == ServerAllocation.CLUSTER:
        if not allocated_to:
            raise ValidationError({"allocated_to": "Name the cluster the server joins."})
        if server.allocation == ServerAllocation.CLUSTER:
            if server.allocated_to == allocated_to:
                return server
            raise ValidationError({"server": f"{server.name} is already a node of cluster "
                                   f"{server.allocated_to}; take it out of that cluster first."})
        if server.provisioning_runs.filter(state__in=ACTIVE_RUN_STATES).exists():
            raise ValidationError({"server": f"{server.name} is in a provisioning batch; wait "
                                   "for it to finish first."})
        if server.state != ServerState.PROVISIONED:
            raise ValidationError({"server": f"{server.name} is "
                                   f"{server.get_state_display().lower()}; only a provisioned "
                                   "server can join a cluster."})
        lease = (Lease.objects.filter(server=server, state__in=LIVE_LEASE_STATES)
                 .select_related("tenant").order_by("starts_at").first())
        if lease is not None:
            raise ValidationError({"server": f"{server.name} is leased to {lease.tenant.name} "
                                   f"from {utc_text(lease.starts_at)} to {utc_text(lease.ends_at)} "
                                   f"(lease {lease.pk}, {lease.get_state_display().lower()}); "
                                   "end or cancel the lease first."})
    else:
        if allocated_to:
            raise ValidationError({"allocated_to": "A free server is allocated to nothing."})
        if server.allocation == ServerAllocation.FREE:
            return server
    previous = {"allocation": server.allocation, "allocated_to": server.allocated_to}
    server.allocation, server.allocated_to = allocation, allocated_to
    server.save(update_fields=["allocation", "allocated_to", "updated_at"])
    audit_record(actor=actor, action="server.allocation", obj=server, changes={
        "allocation": {"from": previous["allocation"], "to": allocation},
        "allocated_to": {"from": previous["allocated_to"], "to": allocated_to},
    })
    return server
