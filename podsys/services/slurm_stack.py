"""A Slurm stack deployed by PODsys becomes where the cluster's jobs run.

The stack's nodes run configless `slurmd` against the controller named by the run's
`stack_slurm_conf_server`; the platform's Slurm clients need that controller's slurm.conf on
this host (OGAI_SLURM_CONF). Once a stack run succeeds, the cluster it deployed switches to the
`slurm` driver: the same cluster row, its queues, quotas and node rows (matched by name), so
no machine is counted twice. It switches only when the controller answers and no job is
placed on the cluster under its old driver; otherwise the run says what is missing and the
cluster stays as it was."""

import logging

from django.conf import settings
from django.db import transaction

from infra_os.services.audit import audit_record
from podsys.allocations import gpu_allocations
from podsys.choices import DeploymentKind, DeploymentState
from podsys.drivers.base import DriverError
from podsys.drivers.slurm import SlurmDriver
from podsys.models import Cluster, DeploymentRun
from podsys.services.clusters import cluster_sync_nodes

logger = logging.getLogger(__name__)


def deploys_slurm(run: DeploymentRun) -> bool:
    return (run.kind == DeploymentKind.STACK and not run.check_mode
            and run.profile is not None and run.profile.orchestrator == "slurm")


def _options() -> dict:
    options = {"slurm_conf": settings.OGAI_SLURM_CONF}
    if settings.OGAI_SLURM_SHARED_DIR:
        options["shared_dir"] = settings.OGAI_SLURM_SHARED_DIR
    return options


def slurm_stack_register(*, run: DeploymentRun) -> str:
    """After a succeeded Slurm stack run: switch its cluster to the slurm driver (or, already
    there, sync its nodes). What happened, in a sentence for the run's page."""
    cluster = run.cluster
    if cluster.driver == "slurm":
        nodes = cluster_sync_nodes(cluster=cluster)
        return f"Cluster {cluster.name} runs its jobs through Slurm: {len(nodes)} nodes synced."
    if not settings.OGAI_SLURM_CONF:
        return (f"Slurm is on {len(run.hosts)} nodes, but cluster {cluster.name} still runs its "
                f"jobs through the {cluster.driver} driver: set OGAI_SLURM_CONF to the "
                "controller's slurm.conf on the OGAI host and deploy again.")
    options = _options()
    try:
        SlurmDriver.check_options(options)
        driver = SlurmDriver(cluster=cluster.name, options=options)
        report = driver.check_connection()
        reported = {node.name for node in driver.nodes()} if report.ok else set()
    except (ValueError, DriverError) as exc:
        return f"Slurm is deployed, but cluster {cluster.name} stays on {cluster.driver}: {exc}"
    if not report.ok:
        return (f"Slurm is deployed, but cluster {cluster.name} stays on {cluster.driver}: "
                f"{report.message}")
    missing = [host for host in run.hosts if host not in reported]
    if missing:
        return (f"Slurm is deployed, but its controller does not know {', '.join(missing)}: "
                f"cluster {cluster.name} stays on {cluster.driver} until slurm.conf names "
                "every node deployed.")
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        busy = sorted({node for (_, node) in gpu_allocations([cluster.pk])})
        if busy:
            return (f"Slurm is deployed, but cluster {cluster.name} stays on {cluster.driver} "
                    f"while jobs run on {', '.join(busy)}: deploy again once they end.")
        was = cluster.driver
        cluster.driver, cluster.options, cluster.credentials = "slurm", options, ""
        cluster.sync_error = ""
        cluster.save(update_fields=["driver", "options", "credentials", "sync_error",
                                    "updated_at"])
        audit_record(actor=run.created_by, action="cluster.driver_change", obj=cluster,
                     tenant=cluster.tenant, changes={"driver": ["slurm", was],
                                                     "deployment_run": run.pk})
    cluster_sync_nodes(cluster=cluster)
    logger.info("Cluster %s switched from %s to slurm after deployment run %s",
                cluster.name, was, run.pk)
    return f"Cluster {cluster.name} now runs its jobs through Slurm. {report.message}"


def slurm_stack_finished(run: DeploymentRun) -> DeploymentRun:
    """`_finish`'s step for Slurm stack runs: the registration's outcome becomes the run's
    message (a failure to register fails nothing the playbook did)."""
    if run.state != DeploymentState.SUCCEEDED or not deploys_slurm(run):
        return run
    try:
        message = slurm_stack_register(run=run)
    except Exception:  # the deployment itself succeeded: say so and keep it
        logger.exception("Registering the Slurm cluster of deployment run %s failed", run.pk)
        message = ("Slurm is deployed, but registering the cluster failed (see the worker's "
                   "log); it still runs its jobs as before.")
    run.message = message[:2000]
    run.save(update_fields=["message", "updated_at"])
    return run
