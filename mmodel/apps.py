from django.apps import AppConfig


class MmodelConfig(AppConfig):
    name = "mmodel"
    verbose_name = "Models"
