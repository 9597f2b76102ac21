"""Pool deployments: what their replicas run, what is refused (by field, in words), and what
the API shows of which replica holds what."""

import itertools
import json
import shutil

import pytest
from django.core.exceptions import ValidationError

from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import DeploymentMember, DeploymentReplica, Model, ModelVersion
from mmodel.services import deployment_watch
from mmodel.services.deployment_watch import deployments_watch
from mmodel.services.deployments import deployment_create
from mmodel.tests.test_deployments_adapters import data_dir, lora_adapter  # noqa: F401
from mmodel.tests.tiny import tiny_model

URL = "/api/v1/mmodel/deployments/"


@pytest.fixture
def family(world, data_dir):  # noqa: F811
    """alpha's base `tiny` v1, two LoRA adapters of it, another whole model, and a LoRA of
    that other model."""
    base_folder = tiny_model(data_dir / "models" / "base")
    other_folder = tiny_model(data_dir / "models" / "other", seed=3, hidden=256)  # ~5 MB
    for name, base in (("a", base_folder), ("b", base_folder), ("foreign", other_folder)):
        lora_adapter(base, data_dir / "models" / name)
    model = Model.objects.create(tenant=world.alpha, name="tiny")

    def version(number, path, base=None):
        return ModelVersion.objects.create(
            model=model, number=number, status=VersionStatus.READY,
            source=VersionSource.TRAINING if base else VersionSource.IMPORT,
            artifact_path=f"models/{path}", content_hash=f"{number}" * 64, base_version=base,
            format=WeightsFormat.ADAPTER if base else WeightsFormat.SAFETENSORS)

    class Family:
        base = version(1, "base")
        a = version(2, "a", base)
        b = version(3, "b", base)
        other = version(4, "other")
        foreign = version(5, "foreign", other)

    return Family


def create(world, farm, family, **options):
    return deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tiny",
                             version=family.base, queue=farm.queues["alpha"], **options)


def test_a_pools_replica_serves_its_base_adapters_and_whole_models(farm, world, family,
                                                                   data_dir):  # noqa: F811
    deployment = create(world, farm, family, replicas=2, memory_mib_per_replica=2048,
                        max_loras=4,
                        pool=[("tune-a", family.a), ("tune-b", family.b),
                              ("other", family.other)])
    assert sorted(DeploymentMember.objects.values_list("name", flat=True)) == \
        ["other", "tune-a", "tune-b"]
    for replica in DeploymentReplica.objects.filter(deployment=deployment):
        command = replica.job.command
        # A cluster of images gets the runner as its source text.
        assert command[:2] == ["python", "-c"] and "class Pool:" in command[2]
        pairs = list(itertools.pairwise(command))
        assert ("--base", f"tiny={data_dir / 'models' / 'base'}") in pairs
        assert ("--adapter", f"tune-a={data_dir / 'models' / 'a'}") in pairs
        assert ("--adapter", f"tune-b={data_dir / 'models' / 'b'}") in pairs
        assert ("--model", f"other={data_dir / 'models' / 'other'}") in pairs
        assert ("--memory-budget-mib", "1024") in pairs  # half the replica's memory
        assert ("--max-loras", "4") in pairs
        assert replica.served_model == "tiny"


def test_vllm_pools_adapters_with_its_own_lora_support(farm, world, family,
                                                       data_dir):  # noqa: F811
    deployment = create(world, farm, family, runtime="vllm", gpus_per_replica=1, max_loras=2,
                        pool=[("tune-a", family.a), ("tune-b", family.b)])
    command = DeploymentReplica.objects.get(deployment=deployment).job.command
    assert command[:3] == ["vllm", "serve", str(data_dir / "models" / "base")]
    assert command[command.index("--served-model-name") + 1] == "tiny"
    assert command[command.index("--max-loras") + 1] == "2"
    assert command[command.index("--max-cpu-loras") + 1] == "2"
    assert command[command.index("--max-lora-rank") + 1] == "16"
    start = command.index("--lora-modules") + 1
    assert command[start:start + 2] == [f"tune-a={data_dir / 'models' / 'a'}",
                                        f"tune-b={data_dir / 'models' / 'b'}"]


@pytest.mark.parametrize(("options", "field", "words"), [
    ({"pool": [("tune", "foreign")]}, "pool", "adapter of another base"),
    ({"pool": [("other", "other")], "runtime": "vllm", "gpus_per_replica": 1}, "pool",
     "vLLM pools LoRA adapters"),
    ({"pool": [("tune-a", "a"), ("tune-a", "b")]}, "pool", "used twice"),
    ({"pool": [("tiny", "a")]}, "pool", "used twice"),
    ({"pool": [("bad name!", "a")]}, "pool", "bad name!"),
    ({"pool": [("other", "other")], "pool_memory_mib": 1}, "pool_memory_mib",
     "more than the pool's budget"),
    ({"pool": [("tune-a", "a")], "max_loras": 0}, "max_loras", "1 to"),
])
def test_a_pool_that_cannot_serve_is_refused_in_words(farm, world, family, options, field,
                                                      words):
    options = dict(options)
    options["pool"] = [(name, getattr(family, version)) for name, version in options["pool"]]
    with pytest.raises(ValidationError) as refused:
        create(world, farm, family, **options)
    assert words in " ".join(refused.value.message_dict[field])
    assert not DeploymentMember.objects.exists()


def test_an_adapter_cannot_be_a_pools_base_and_names_are_one_namespace(farm, world, family):
    with pytest.raises(ValidationError) as refused:
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="x",
                          version=family.a, queue=farm.queues["alpha"],
                          pool=[("tune-b", family.b)])
    assert "cannot be a pool's base" in refused.value.message_dict["version"][0]
    create(world, farm, family, pool=[("tune-a", family.a)])
    with pytest.raises(ValidationError) as taken:  # a deployment named like a member
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tune-a",
                          version=family.other, queue=farm.queues["alpha"])
    assert "already serves a model 'tune-a'" in taken.value.message_dict["name"][0]
    with pytest.raises(ValidationError) as again:  # a member named like a member
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="two",
                          version=family.base, queue=farm.queues["alpha"],
                          pool=[("tune-a", family.b)])
    assert "already serves a model named 'tune-a'" in again.value.message_dict["pool"][0]


def test_the_api_makes_a_pool_and_shows_which_replica_holds_what(api, farm, world, family,
                                                                 monkeypatch):
    held = {}
    monkeypatch.setattr(deployment_watch, "probe_health",
                        lambda upstream: (True, "", held.get(upstream, ())))
    response = api.as_user(world.alpha_member).post(URL, {
        "tenant": "alpha", "name": "tiny", "version": family.base.pk, "replicas": 2,
        "pool": [{"name": "tune-a", "version": family.a.pk},
                 {"name": "other", "version": family.other.pk}],
        "pool_memory_mib": 64}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert [(row["name"], row["kind"], row["held_by"]) for row in body["pool"]] == \
        [("tiny", "base", []), ("other", "model", []), ("tune-a", "adapter", [])]
    assert body["pool_memory_mib"] == 64

    farm.cycle()
    deployments_watch()  # learns where the replicas answer
    for index, holds in enumerate([("tiny", "tune-a"), ("other",)]):
        # The fake cluster answers every replica at one address: each its own here.
        DeploymentReplica.objects.filter(index=index).update(upstream=f"http://replica-{index}")
        held[f"http://replica-{index}"] = holds
    deployments_watch()
    body = api.as_user(world.alpha_member).get(f"{URL}{body['id']}/").json()
    assert {row["name"]: row["held_by"] for row in body["pool"]} == \
        {"tiny": [0], "tune-a": [0], "other": [1]}
    assert [r["holds"] for r in body["replica_set"]] == [["tiny", "tune-a"], ["other"]]


def test_another_tenants_version_cannot_join_a_pool(api, farm, world, family):
    theirs = Model.objects.create(tenant=world.beta, name="theirs")
    version = ModelVersion.objects.create(
        model=theirs, number=1, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path="models/other", format=WeightsFormat.SAFETENSORS)
    response = api.as_user(world.alpha_member).post(URL, {
        "tenant": "alpha", "name": "tiny", "version": family.base.pk,
        "pool": [{"name": "stolen", "version": version.pk}]}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["pool"] == [f"No model version {version.pk} in alpha."]
    with pytest.raises(ValidationError):  # nor through the service
        create(world, farm, family, pool=[("stolen", version)])
    assert not DeploymentMember.objects.exists()


def test_a_version_a_pool_serves_is_not_deleted(farm, world, family):
    from mmodel.services.registry import version_delete

    create(world, farm, family, pool=[("tune-a", family.a)])
    with pytest.raises(ValidationError) as refused:
        version_delete(actor=world.alpha_member, version=family.a)
    assert refused.value.message_dict["version"] == \
        ["tiny:v2 is deployed as tiny: delete those deployments first."]
    assert ModelVersion.objects.filter(pk=family.a.pk).exists()


def test_members_are_added_and_removed_and_the_running_replicas_start_again(api, farm, world,
                                                                           family):
    deployment = create(world, farm, family, pool=[("tune-a", family.a)])
    farm.cycle()
    first = DeploymentReplica.objects.get(deployment=deployment).job
    member = api.as_user(world.alpha_member)
    response = member.post(f"{URL}{deployment.pk}/pool/", {"name": "tune-b",
                                                            "version": family.b.pk},
                           format="json")
    assert response.status_code == 202, response.json()
    assert [row["name"] for row in response.json()["pool"]] == ["tiny", "tune-a", "tune-b"]
    replica = DeploymentReplica.objects.select_related("job").get(deployment=deployment)
    first.refresh_from_db()
    assert first.state in ("cancelled", "cancelling")
    assert replica.job != first and "tune-b=" in " ".join(replica.job.command)

    taken = member.post(f"{URL}{deployment.pk}/pool/", {"name": "tune-a",
                                                         "version": family.b.pk},
                        format="json")
    assert taken.status_code == 400 and "used twice" in taken.json()["fields"]["pool"][0]
    theirs = ModelVersion.objects.create(
        model=Model.objects.create(tenant=world.beta, name="theirs"), number=1,
        status=VersionStatus.READY, source=VersionSource.IMPORT, artifact_path="models/other",
        format=WeightsFormat.SAFETENSORS)
    stolen = member.post(f"{URL}{deployment.pk}/pool/", {"name": "stolen",
                                                          "version": theirs.pk}, format="json")
    assert stolen.status_code == 400 and "version" in stolen.json()["fields"]
    viewer = api.as_user(world.alpha_viewer).post(
        f"{URL}{deployment.pk}/pool/", {"name": "x", "version": family.b.pk}, format="json")
    assert viewer.status_code == 403
    outsider = api.as_user(world.beta_member).delete(f"{URL}{deployment.pk}/pool/tune-a/")
    assert outsider.status_code == 404

    member = api.as_user(world.alpha_member)  # one client, signed in as each in turn
    removed = member.delete(f"{URL}{deployment.pk}/pool/tune-a/")
    assert removed.status_code == 202
    assert [row["name"] for row in removed.json()["pool"]] == ["tiny", "tune-b"]
    command = " ".join(DeploymentReplica.objects.get(deployment=deployment).job.command)
    assert "tune-a=" not in command and "tune-b=" in command
    assert member.delete(f"{URL}{deployment.pk}/pool/tune-a/").status_code == 400


def test_an_adapter_a_pool_cannot_apply_per_request_is_refused(farm, world, family,
                                                                data_dir):  # noqa: F811
    shutil.copytree(data_dir / "models" / "a", data_dir / "models" / "dora")
    settings = data_dir / "models" / "dora" / "adapter_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "use_dora": True}))
    dora = ModelVersion.objects.create(
        model=family.base.model, number=9, status=VersionStatus.READY,
        source=VersionSource.TRAINING, artifact_path="models/dora", content_hash="9" * 64,
        base_version=family.base, format=WeightsFormat.ADAPTER)
    with pytest.raises(ValidationError) as refused:
        create(world, farm, family, pool=[("tune-a", family.a), ("tune-dora", dora)])
    assert "uses DoRA" in " ".join(refused.value.message_dict["pool"])
    assert not DeploymentMember.objects.exists()
