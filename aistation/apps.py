from django.apps import AppConfig


class AistationConfig(AppConfig):
    name = "aistation"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from aistation.selectors import gpu_allocations
        from podsys.allocations import register_allocation_provider

        register_allocation_provider(gpu_allocations)

        from aistation.selectors import queue_tenants_run_there
        from podsys.cluster_tenants import register_runs_there_provider

        register_runs_there_provider(queue_tenants_run_there)

        from aistation.metrics import JobsCollector, LogStoreCollector
        from ogai.metrics import register_collector

        register_collector(JobsCollector())
        register_collector(LogStoreCollector())

        from aistation.services.evictions import on_node_out_of_service
        from podsys.signals import node_out_of_service

        node_out_of_service.connect(on_node_out_of_service, dispatch_uid="aistation.evictions")

    def seed_demo(self, *, stdout) -> None:
        from aistation.services.demo import demo_seed

        demo_seed(stdout=stdout)

    def platform_stop(self, *, stdout) -> None:
        """`manage.py runplatform` stopped: the work on this machine's clusters stops too."""
        from aistation.services.platform_stop import local_work_stop

        queued = local_work_stop()
        if queued:
            stdout.write(f"Stopped the work on this machine; jobs {', '.join(map(str, queued))} "
                         "queue again and start when OGAI does.")
