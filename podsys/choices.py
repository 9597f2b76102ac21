from django.db import models


class NodeHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    NOT_READY = "not_ready", "Not ready"
    LOST = "lost", "Lost"
