from django.apps import AppConfig


class InfraOsConfig(AppConfig):
    name = "infra_os"
    verbose_name = "Computing centre"

    def seed_demo(self, *, stdout) -> None:
        from infra_os.services.demo import demo_seed

        demo_seed(stdout=stdout)
