"""The gateway in front of a pool: each member is called by its own name, reaches a replica that
holds it when one does (else the least busy, which then keeps it), is answered and recorded
under its name, and stays invisible to other tenants."""

import openai
import pytest

from infra_os.models import UsageRecord
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.gateway import app as gateway_app
from mmodel.gateway import routing
from mmodel.models import DeploymentMember, DeploymentReplica, ModelVersion
from mmodel.tests.test_gateway import (  # noqa: F401 - fixtures
    Stub,
    _serve,
    _stop,
    fresh_gateway,
    gw,
    platform_server,
    stub,
    stub_app,
    stub_server,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def second_stub():
    seen: list = []
    served = _serve(stub_app(seen))
    yield Stub(url=served.url, seen=seen)
    _stop(served)


@pytest.fixture
def pool(gw, stub, second_stub, world, farm):  # noqa: F811
    """alpha's pool `fam`: two replicas (the stub servers), members tune-a (held by replica
    1 at its last health check) and tune-b (held by none)."""
    second_stub.seen.clear()
    deployment = gw.deploy("fam", upstreams=[stub.url, second_stub.url], served_model="fam")
    for name in ("tune-a", "tune-b"):
        version = ModelVersion.objects.create(
            model=deployment.version.model, number=deployment.version.model.versions.count() + 1,
            status=VersionStatus.READY, source=VersionSource.TRAINING,
            format=WeightsFormat.ADAPTER, base_version=deployment.version)
        DeploymentMember.objects.create(deployment=deployment, name=name, version=version)
    DeploymentReplica.objects.filter(deployment=deployment, index=1).update(holds=["tune-a"])
    routing.reload_now()
    return deployment


def test_a_member_is_answered_under_its_name_by_the_replica_that_holds_it(
        gw, pool, stub, second_stub, world):  # noqa: F811
    for _ in range(4):
        answer = gw.client().completions.create(model="tune-a", prompt="Hi")
        assert answer.model == "tune-a"
        assert answer.choices[0].text == "Hello from tune-a"  # the server got the member's name
    assert len(second_stub.seen) == 4 and not stub.seen

    base = gw.client().chat.completions.create(
        model="fam", messages=[{"role": "user", "content": "Hi"}])
    assert base.model == "fam"
    streamed = list(gw.client().chat.completions.create(
        model="tune-a", messages=[{"role": "user", "content": "Hi"}], stream=True))
    assert {chunk.model for chunk in streamed} == {"tune-a"}

    gateway_app.flush_sync()
    used = {record.model_name for record in UsageRecord.objects.filter(tenant=world.alpha)}
    assert used == {"tune-a", "fam"}


def test_a_member_no_replica_holds_goes_to_the_least_busy_and_stays_there(
        gw, pool, stub, second_stub):  # noqa: F811
    for _ in range(5):
        gw.client().completions.create(model="tune-b", prompt="Hi")
    sent = [len(stub.seen), len(second_stub.seen)]
    assert sorted(sent) == [0, 5]  # loaded once, by one replica, which keeps answering it


def test_members_are_listed_to_their_tenant_and_hidden_from_others(gw, pool, world):  # noqa: F811
    assert {"fam", "tune-a", "tune-b"} <= {m.id for m in gw.client().models.list()}
    assert gw.client().models.retrieve("tune-a").owned_by == "alpha"
    assert not {"tune-a", "tune-b"} & {m.id for m in gw.client(gw.beta).models.list()}
    for name in ("tune-a", "alpha/tune-a"):
        with pytest.raises(openai.NotFoundError) as hidden:
            gw.client(gw.beta).completions.create(model=name, prompt="Hi")
        assert hidden.value.body["code"] == "model_not_found"


def test_a_busy_holder_spreads_its_model_to_the_least_busy_replica():
    route = routing.Route(
        deployment_id=1, tenant_id=1, tenant_name="t", name="fam", active=True,
        scaled_to_zero=False, created=0, limits=routing.Limits(0, 0, 0, 0),
        replicas=[routing.Replica(id=10, upstream="a", served_model="fam",
                                  holds=frozenset({"tune-a"})),
                  routing.Replica(id=11, upstream="b", served_model="fam")],
        members={"tune-a": ""})
    routing.reset()
    assert routing.pick(route, member="tune-a").id == 10
    for _ in range(routing.SPREAD_AT - 1):
        routing.begin(route.replicas[0])
    assert routing.pick(route, member="tune-a").id == 10  # busier, not yet by SPREAD_AT
    routing.begin(route.replicas[0])
    assert routing.pick(route, member="tune-a").id == 11
    routing.reset()
