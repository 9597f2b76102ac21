"""Thin tasks: load by id, call a service. BMC work runs on the `provision` queue, so a
dedicated worker (threads or many processes) can drive hundreds of servers at once."""

import logging

from celery import shared_task
from django.utils import timezone

from infra_os.drivers import BmcError
from infra_os.models import Server
from infra_os.services.leases import lease_sweep
from infra_os.services.provisioning import (
    LONGEST_COUNTDOWN_S,
    provisioning_sweep,
    run_advance,
)
from infra_os.services.servers import server_power_now, server_refresh_inventory

logger = logging.getLogger(__name__)


@shared_task(name="infra_os.advance_run", queue="provision", time_limit=300,
             soft_time_limit=280)
def advance_run(run_id: int) -> float | None:
    """One step of a server's provisioning, then the next step is enqueued when it is due
    soon; longer waits are picked up by the sweep."""
    delay = run_advance(run_id=run_id)
    if delay is not None and delay <= LONGEST_COUNTDOWN_S:
        advance_run.apply_async(kwargs={"run_id": run_id}, countdown=delay)
    return delay


@shared_task(name="infra_os.sweep_provisioning", queue="provision", time_limit=120,
             soft_time_limit=100)
def sweep_provisioning() -> int:
    return provisioning_sweep()


@shared_task(name="infra_os.refresh_inventory", queue="provision", time_limit=300,
             soft_time_limit=280)
def refresh_inventory(server_id: int) -> bool:
    server = Server.objects.select_related("bmc").filter(pk=server_id).first()
    return server is not None and server_refresh_inventory(server=server) is not None


@shared_task(name="infra_os.power_server", queue="provision", time_limit=300,
             soft_time_limit=280)
def power_server(server_id: int, action: str) -> str:
    server = Server.objects.select_related("bmc").filter(pk=server_id).first()
    if server is None:
        return ""
    try:
        return server_power_now(server=server, action=action)
    except BmcError:  # kept on the server, in the BMC's words
        return ""


@shared_task(name="infra_os.sweep_leases", queue="default", time_limit=120,
             soft_time_limit=100)
def sweep_leases() -> dict:
    return lease_sweep(now=timezone.now())._asdict()
