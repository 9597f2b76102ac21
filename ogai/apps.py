from django.apps import AppConfig


class OgaiConfig(AppConfig):
    name = "ogai"
    verbose_name = "OGAI platform"
