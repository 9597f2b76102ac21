"""The OGAI Django project: settings, URLs, the Celery app and helpers every layer shares."""

from ogai.celery import app as celery_app

__all__ = ["celery_app"]
