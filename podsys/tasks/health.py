from celery import shared_task

from podsys.services.health import health_checks_tick


@shared_task(name="podsys.run_health_checks", queue="cluster", acks_late=True,
             reject_on_worker_lost=True, time_limit=240, soft_time_limit=200)
def run_health_checks(cluster_id: int | None = None) -> dict[str, int]:
    """Judge the health checks that finished and start those that are due, on every active
    cluster (or one: after an operator asked for a check)."""
    return health_checks_tick(cluster_id=cluster_id)
