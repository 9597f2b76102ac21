"""MModel's Celery tasks, by area (Celery's autodiscovery imports this package)."""

from mmodel.tasks import deployments, evaluation, registry  # noqa: F401
