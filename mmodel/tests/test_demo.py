"""The demo's last steps: its tiny GPT, once trained, is registered and deployed."""

import pytest

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from infra_os.choices import Role
from mmodel.models import Deployment, ModelVersion
from mmodel.tests import registry_fixtures
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from ylink.models import Dataset, DatasetVersion, TrainingRun
from ylink.services.demo import DEMO_TRAINING
from ylink.signals import training_run_succeeded

roots = registry_fixtures.roots
tiny_source = registry_fixtures.tiny_source
tiny_copy = registry_fixtures.tiny_copy
eager = registry_fixtures.eager


@pytest.fixture
def trained(farm, roots, tmp_path, tiny_copy):
    """`trained(tenant_name, run_name)`: a succeeded pretraining run in that tenant."""

    def make(tenant_name: str, run_name: str) -> TrainingRun:
        tenant = TenantFactory(name=tenant_name)
        user = UserFactory(username=f"{tenant_name}-user")
        MembershipFactory(tenant=tenant, user=user, role=Role.MEMBER)
        queue = queue_create(actor=farm.world.operator, tenant=tenant, name="default",
                             cluster=farm.cluster)
        job = job_submit(actor=user, tenant=tenant, queue=queue, name="train",
                         command=["python", "-m", "ylink.runners.train"])
        dataset = Dataset.objects.create(tenant=tenant, name="docs")
        tokens = DatasetVersion.objects.create(dataset=dataset, number=1, format="tokens",
                                               path="x", content_hash="0" * 64)
        return TrainingRun.objects.create(
            tenant=tenant, created_by=user, name=run_name, kind="pretrain", spec={},
            dataset_version=tokens, folder="r", job=job, succeeded=True, artifact="model",
            output_path=str(tiny_copy(tmp_path / tenant_name)), parameters=30880)

    return make


def test_the_demo_model_is_registered_and_deployed_when_its_training_succeeds(trained, eager):
    run = trained("demo", DEMO_TRAINING["name"])
    training_run_succeeded.send(TrainingRun, run=run)

    version = ModelVersion.objects.get(training_run=run)
    assert version.status == "ready" and version.model.name == DEMO_TRAINING["name"]
    deployment = Deployment.objects.get(tenant=run.tenant)
    assert deployment.name == DEMO_TRAINING["name"] and deployment.version == version
    assert deployment.runtime == "transformers" and deployment.idle_timeout_s > 0
    replica = deployment.replica_set.get()
    assert replica.job.queue == run.job.queue and replica.job.service

    # Told twice (a re-delivered report), nothing more happens.
    training_run_succeeded.send(TrainingRun, run=run)
    assert ModelVersion.objects.filter(training_run=run).count() == 1
    assert Deployment.objects.filter(tenant=run.tenant).count() == 1


def test_other_training_runs_are_left_to_their_owners(trained, eager):
    for tenant, name in (("demo", "my-own-gpt"), ("acme", DEMO_TRAINING["name"])):
        training_run_succeeded.send(TrainingRun, run=trained(tenant, name))
    assert not ModelVersion.objects.exists() and not Deployment.objects.exists()
