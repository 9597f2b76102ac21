from celery import shared_task

from podsys.models import DeploymentRun
from podsys.services.deployments import (
    RUN_TIMEOUT_S,
    deployment_artifacts_prune,
    deployment_execute,
    deployment_runs_sweep,
)


# A run lasts as long as Ansible takes (drivers, CUDA, reboots): hours. ansible-runner stops it
# at RUN_TIMEOUT_S; the task's own limits sit above that.
@shared_task(name="podsys.deploy_run", queue="provision", acks_late=True,
             reject_on_worker_lost=True, time_limit=RUN_TIMEOUT_S + 900,
             soft_time_limit=RUN_TIMEOUT_S + 600)
def deploy_run(run_id: int) -> str:
    """Run one queued deployment to its end; returns its state."""
    return deployment_execute(run=DeploymentRun.objects.get(pk=run_id)).state


@shared_task(name="podsys.sweep_deployment_runs", queue="cluster", acks_late=True,
             reject_on_worker_lost=True, time_limit=120, soft_time_limit=100)
def sweep_deployment_runs() -> dict:
    """End running deployment runs whose worker is gone; delete old runs' working folders."""
    return {"ended": deployment_runs_sweep(), "pruned": deployment_artifacts_prune()}
