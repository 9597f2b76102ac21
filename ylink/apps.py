from django.apps import AppConfig


class YlinkConfig(AppConfig):
    name = "ylink"
    verbose_name = "Toolchain"

    def seed_demo(self, *, stdout) -> None:
        from ylink.services.demo import demo_seed

        demo_seed(stdout=stdout)
