from django.apps import AppConfig


class PodsysConfig(AppConfig):
    name = "podsys"
    verbose_name = "Clusters"

    def ready(self) -> None:
        from ogai.metrics import register_collector
        from podsys.metrics import NodesCollector

        register_collector(NodesCollector())

    def seed_demo(self, *, stdout) -> None:
        from podsys.services.demo import demo_seed

        demo_seed(stdout=stdout)
