"""The Celery app. Tasks live in each app's `tasks.py`, named `<app>.<verb>`, and are enqueued
through `transaction.on_commit` by services."""

import os

from celery import Celery
from kombu import Exchange, Queue

from ogai.log_context import connect_celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")

QUEUES = ("default", "cluster", "provision", "toolchain")

app = Celery("ogai")
app.config_from_object("django.conf:settings", namespace="CELERY")
# One direct exchange per queue, so a task routed to one queue lands in that queue only.
app.conf.task_queues = [
    Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES
]
app.conf.task_default_exchange = "default"
app.conf.task_default_routing_key = "default"
app.autodiscover_tasks()
connect_celery()
