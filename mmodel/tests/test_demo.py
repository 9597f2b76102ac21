"""The demo's last steps: its tiny GPT, once trained, is registered and deployed."""

from datetime import timedelta

import pytest
from django.utils import timezone

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from infra_os.choices import Role
from mmodel.choices import DeploymentState
from mmodel.models import Deployment, ModelVersion
from mmodel.selectors.deployments import deployment_state
from mmodel.services import deployment_watch
from mmodel.services.demo import DEMO_IDLE_TIMEOUT_S
from mmodel.services.deployments import deployment_wake
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


def test_the_demo_deployment_sleeps_when_idle_and_a_request_wakes_it(trained, eager, farm,
                                                                     monkeypatch):
    monkeypatch.setattr(deployment_watch, "probe_health", lambda upstream: (True, "", ()))
    run = trained("demo", DEMO_TRAINING["name"])
    training_run_succeeded.send(TrainingRun, run=run)
    deployment = Deployment.objects.get(tenant=run.tenant)
    assert deployment.idle_timeout_s == DEMO_IDLE_TIMEOUT_S == 300

    def state():
        return deployment_state(Deployment.objects.get(pk=deployment.pk))

    farm.cycle()
    ready_at = timezone.now()
    deployment_watch.deployments_watch(now=ready_at)
    assert state() == DeploymentState.READY
    deployment_watch.deployments_watch(now=ready_at + timedelta(seconds=DEMO_IDLE_TIMEOUT_S - 5))
    assert state() == DeploymentState.READY, "a pause in a conversation"
    deployment_watch.deployments_watch(now=ready_at + timedelta(seconds=DEMO_IDLE_TIMEOUT_S + 5))
    assert state() == DeploymentState.SCALED_TO_ZERO
    assert deployment.replica_set.get().job.state in {"cancelled", "succeeded", "failed"}, \
        "its core is free"

    deployment_wake(deployment_id=deployment.pk)  # what the gateway does on a request
    farm.cycle()
    assert state() != DeploymentState.SCALED_TO_ZERO
    assert deployment.replica_set.get().job.state == "running"
