from django.apps import AppConfig


class AistationConfig(AppConfig):
    name = "aistation"
    verbose_name = "Jobs"
