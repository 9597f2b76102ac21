from django.apps import AppConfig


class MmodelConfig(AppConfig):
    name = "mmodel"
    verbose_name = "Models"

    def ready(self) -> None:
        from ylink.signals import training_run_succeeded

        training_run_succeeded.connect(_serve_demo_model, dispatch_uid="mmodel.demo_serve")
        # YLink's pipeline steps that name a registry model (hap) find its folder here.
        from mmodel.selectors.registry import model_version_path
        from ylink.callbacks import model_path_resolver_set

        model_path_resolver_set(model_version_path)

    def seed_demo(self, *, stdout) -> None:
        from mmodel.services.demo import demo_seed

        demo_seed(stdout=stdout)


def _serve_demo_model(sender, *, run, **kwargs) -> None:
    """The demo's tiny GPT, once trained, is registered and deployed (by a task)."""
    from mmodel.services.demo import is_demo_training
    from mmodel.tasks.registry import demo_serve

    if is_demo_training(run):
        demo_serve.delay(run.pk)
