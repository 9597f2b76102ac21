"""Bare-metal servers joining and leaving clusters.

Joining records that a provisioned server now serves a cluster (so it can no longer be leased);
it installs nothing. Installing the node software is the PODsys stack deployment (another
issue), and the node itself appears through the cluster driver's node sync, under the server's
name.
"""

from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.choices import ServerAllocation
from infra_os.models import Server
from infra_os.services.servers_allocation import server_set_allocation
from podsys.allocations import gpu_allocations
from podsys.models import Cluster


@transaction.atomic
def server_join_cluster(*, actor, server: Server, cluster: Cluster) -> Server:
    """Make `server` a node of `cluster`. Refused for a server that is not provisioned, is
    leased (or will be), or is a node of another cluster."""
    require_platform_admin(actor)
    if not cluster.is_active:
        raise ValidationError({"cluster": f"Cluster {cluster.name} is inactive; servers join "
                               "active clusters only."})
    return server_set_allocation(actor=actor, server=server,
                                 allocation=ServerAllocation.CLUSTER, allocated_to=cluster.name)


@transaction.atomic
def server_leave_cluster(*, actor, server: Server, cluster: Cluster | None = None) -> Server:
    """Take `server` out of its cluster (when `cluster` is given, it must be that one), after
    which it is free to lease. Refused while work still holds GPUs on its node: cordon the node
    and let its work end first."""
    require_platform_admin(actor)
    server = Server.objects.select_for_update().get(pk=server.pk)
    if server.allocation != ServerAllocation.CLUSTER:
        raise ValidationError({"server": f"{server.name} is not a node of any cluster."})
    if cluster is not None and server.allocated_to != cluster.name:
        raise ValidationError({"server": f"{server.name} is a node of cluster "
                               f"{server.allocated_to}, not of {cluster.name}."})
    current = Cluster.objects.filter(name=server.allocated_to).first()
    if current is not None:
        held = gpu_allocations([current.pk]).get((current.pk, server.name), 0)
        if held:
            raise ValidationError({"server": f"Work on node {server.name} of cluster "
                                   f"{current.name} still holds {held} GPU"
                                   f"{'s' if held != 1 else ''}; cordon the node and let its "
                                   "work end first."})
    return server_set_allocation(actor=actor, server=server, allocation=ServerAllocation.FREE,
                                 allocated_to="")
