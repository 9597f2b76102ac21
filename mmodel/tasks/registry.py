"""Celery tasks of MModel's registry: thin, by id."""

from celery import shared_task

from mmodel.services.registry import model_import_run


# Converting a large GGUF file takes minutes: a time limit well above the default.
@shared_task(name="mmodel.import_model", queue="toolchain", acks_late=True,
             reject_on_worker_lost=True, time_limit=3600, soft_time_limit=3500)
def import_model(import_id: int) -> str:
    """Copy, convert and check one import; returns its state."""
    return model_import_run(import_id=import_id).state


@shared_task(name="mmodel.demo_serve", acks_late=True, reject_on_worker_lost=True,
             time_limit=600, soft_time_limit=540)
def demo_serve(run_id: int) -> int:
    """Register and deploy the demo's trained model; returns the deployment's id."""
    from mmodel.services.demo import demo_serve as serve
    from ylink.models import TrainingRun

    return serve(run=TrainingRun.objects.select_related("tenant", "job__queue").get(pk=run_id)).pk
