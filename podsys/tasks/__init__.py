"""PODsys's Celery tasks, one module per concern (Celery autodiscovers this package)."""

from podsys.tasks.deployments import deploy_run, sweep_deployment_runs
from podsys.tasks.health import run_health_checks
from podsys.tasks.metrics import collect_metrics
from podsys.tasks.nodes import sync_nodes

__all__ = ["collect_metrics", "deploy_run", "run_health_checks", "sweep_deployment_runs",
           "sync_nodes"]
