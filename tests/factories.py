"""Factories for tests of every layer. Each builds rows directly (no audit events): tests that
exercise a service call the service."""

import itertools
from datetime import UTC, datetime

import factory
from django.contrib.auth import get_user_model

from infra_os.choices import Role
from infra_os.models import ApiToken, AuditEvent, Membership, Quota, Tenant, UsageRecord

PASSWORD = "Correct-horse-42"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def saved(self, create, extracted, **kwargs):
        if create:
            self.save()


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("name",)
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"tenant-{n}")
    display_name = factory.LazyAttribute(lambda tenant: tenant.name.title())
    quota = factory.RelatedFactory("tests.factories.QuotaFactory", factory_related_name="tenant")


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota
        django_get_or_create = ("tenant",)

    tenant = factory.SubFactory(TenantFactory, quota=None)
    gpus = 8
    cpu_cores = 64
    memory_gib = 512
    storage_gib = 1024


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    tenant = factory.SubFactory(TenantFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class AuditEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AuditEvent

    tenant = factory.SubFactory(TenantFactory)
    tenant_name = factory.LazyAttribute(lambda event: event.tenant.name if event.tenant else "")
    actor_name = "someone"
    action = "test.event"
    object_repr = "something"


class ApiTokenFactory(factory.django.DjangoModelFactory):
    """A token row without a usable secret; tests that authenticate use api_token_create."""

    class Meta:
        model = ApiToken

    user = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"token-{n}")
    prefix = factory.Sequence(lambda n: f"{n:012x}")
    key_hash = "0" * 64


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "podsys.Cluster"
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"cluster-{n}")
    driver = "fake"
    options = factory.LazyFunction(lambda: {"nodes": 4, "gpus_per_node": 8})


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "podsys.Node"

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node-{n:03d}")
    gpus = 8
    gpu_model = "H100"
    cpu_cores = 64
    memory_mib = 512 * 1024


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "aistation.Queue"

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"queue-{n}")
    cluster = factory.SubFactory(ClusterFactory)


class JobFactory(factory.django.DjangoModelFactory):
    """A queued job row; tests of the lifecycle submit through job_submit instead."""

    class Meta:
        model = "aistation.Job"

    queue = factory.SubFactory(QueueFactory)
    tenant = factory.SelfAttribute("queue.tenant")
    cluster = factory.SelfAttribute("queue.cluster")
    name = factory.Sequence(lambda n: f"job-{n}")
    command = factory.LazyFunction(lambda: ["python", "-c", "print('hello')"])
    state = "queued"


_usage_sources = itertools.count(1)


def at(text: str) -> datetime:
    """An ISO time without zone, in UTC: `at("2026-10-01T12:00")`."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def job_usage(tenant, gpus: int, model: str, start: str, end: str) -> UsageRecord:
    """What a job attempt of `gpus` GPUs of `model` used from `start` to `end` (UTC)."""
    return UsageRecord.objects.create(
        tenant=tenant, kind=UsageRecord.Kind.JOB, source=f"job {next(_usage_sources)}",
        gpus=gpus, gpu_model=model, started_at=at(start), ended_at=at(end))
