from django.apps import AppConfig


class YlinkConfig(AppConfig):
    name = "ylink"
    verbose_name = "Toolchain"
