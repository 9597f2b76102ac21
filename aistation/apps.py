from django.apps import AppConfig


class AistationConfig(AppConfig):
    name = "aistation"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from aistation.selectors import gpu_allocations
        from podsys.allocations import register_allocation_provider

        register_allocation_provider(gpu_allocations)

    def seed_demo(self, *, stdout) -> None:
        from aistation.services.demo import demo_seed

        demo_seed(stdout=stdout)
