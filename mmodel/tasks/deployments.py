"""Celery tasks of MModel's deployments: thin, they call services."""

import logging

from celery import shared_task
from django.core.cache import cache

from mmodel.models import Deployment, ModelVersion
from mmodel.services.adapters import adapter_merge
from mmodel.services.deployment_watch import deployments_watch

logger = logging.getLogger(__name__)
WATCH_LOCK = "mmodel:watch-deployments"


@shared_task(name="mmodel.watch_deployments", queue="default", time_limit=120,
             soft_time_limit=100)
def watch_deployments() -> int:
    """Beat runs it every few seconds; a run still going makes the next one skip. Returns the
    replicas found ready."""
    if not cache.add(WATCH_LOCK, 1, timeout=120):
        return 0
    try:
        return deployments_watch().ready
    finally:
        cache.delete(WATCH_LOCK)


@shared_task(name="mmodel.merge_adapter", queue="toolchain", time_limit=3600,
             soft_time_limit=3500)
def merge_adapter(version_id: int) -> str:
    """Merge an adapter version into its base, then start the replicas that waited for it."""
    version = ModelVersion.objects.select_related("base_version", "model").get(pk=version_id)
    try:
        folder = adapter_merge(version=version)
    except Exception:  # the reason is kept beside the folder; the watch marks replicas failed
        logger.exception("Merging adapter version %s failed", version_id)
        folder = None
    waiting = list(Deployment.objects.filter(version=version, active=True)
                   .values_list("pk", flat=True))
    deployments_watch(deployment_ids=waiting)
    return str(folder or "")
