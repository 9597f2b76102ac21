"""The demo's models: the shipped benchmarks, and the last steps of "Run the demo" — the tiny
GPT it pretrains is registered and deployed with the transformers runtime, so the playground
answers (badly: it has read 180 pages of Python's documentation for 150 steps)."""

from django.db import transaction

from mmodel.models import Deployment, ModelVersion
from mmodel.services.deployments import deployment_create, deployment_delete
from mmodel.services.evaluation import benchmarks_seed_builtin
from mmodel.services.registry import version_register_from_run
from ylink.models import TrainingRun
from ylink.services.demo import DEMO_TENANT, DEMO_TRAINING

DEMO_MODEL = str(DEMO_TRAINING["name"])
# A demo deployment left alone sleeps after this long and wakes on the next request. Five
# minutes: longer than the pauses of a conversation in the playground, and the tiny GPT wakes
# in seconds; on the small machine the demo runs on, the core it holds is what a newcomer's
# next job or deployment waits for, so it is not held for half an hour.
DEMO_IDLE_TIMEOUT_S = 300


def demo_seed(*, stdout) -> None:
    seeded = benchmarks_seed_builtin()
    stdout.write(f"  benchmarks: {', '.join(b.name for b in seeded)}")


def is_demo_training(run: TrainingRun) -> bool:
    return run.tenant.name == DEMO_TENANT and run.name == DEMO_MODEL and run.job is not None


@transaction.atomic
def demo_serve(*, run: TrainingRun) -> Deployment:
    """Register the demo's trained model and deploy it on the queue it trained in (once per
    run; a later demo run replaces the deployment's version)."""
    version = ModelVersion.objects.filter(training_run=run).first() or \
        version_register_from_run(actor=run.created_by, run=run, model_name=DEMO_MODEL,
                                  description="The tiny GPT of the demo.")
    assert run.job is not None  # is_demo_training
    existing = Deployment.objects.filter(tenant=run.tenant, name=DEMO_MODEL).first()
    if existing is not None:
        if existing.version_id == version.pk:
            return existing
        deployment_delete(actor=run.created_by, deployment=existing)
    return deployment_create(
        actor=run.created_by, tenant=run.tenant, name=DEMO_MODEL, version=version,
        queue=run.job.queue, cpu_per_replica=1.0, memory_mib_per_replica=2048,
        idle_timeout_s=DEMO_IDLE_TIMEOUT_S)
