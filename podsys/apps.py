from django.apps import AppConfig


class PodsysConfig(AppConfig):
    name = "podsys"
    verbose_name = "Clusters"
