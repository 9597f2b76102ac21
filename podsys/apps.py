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

    def platform_stop(self, *, stdout) -> None:
        """`manage.py runplatform` stopped: health checks running on this machine stop too."""
        from podsys.services.health import health_checks_stop_local

        ended = health_checks_stop_local(reason="the platform stopped while it ran")
        if ended:
            stdout.write(f"Stopped {ended} health checks running on this machine.")
