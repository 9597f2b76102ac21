"""Versions registered from YLink training runs (rows whose output folders are tiny models
made here, no training), their lineage, and deleting versions."""

import json
import shutil
from pathlib import Path

import pytest
from django.core.files.base import ContentFile

from mmodel.models import Deployment, ModelVersion
from mmodel.selectors.registry import version_lineage
from mmodel.tests import registry_fixtures
from mmodel.tests.tiny import tiny_model
from ylink.models import DatasetVersion, PipelineRun, TrainingRun
from ylink.services.datasets import dataset_create, dataset_upload

roots = registry_fixtures.roots
tiny_source = registry_fixtures.tiny_source
tiny_copy = registry_fixtures.tiny_copy

BASE = "/api/v1/mmodel"


@pytest.fixture
def corpus(world, roots):
    """A dataset of alpha (v1 uploaded) and v2 made from it by a pipeline run."""
    dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name="corpus")
    first = dataset_upload(actor=world.alpha_member, dataset=dataset, upload=ContentFile(
        b'{"text": "The first document, long enough to count."}\n', name="c.jsonl"))
    pipeline = PipelineRun.objects.create(tenant=world.alpha, name="clean", folder="p",
                                          input_version=first, steps=[], succeeded=True)
    return DatasetVersion.objects.create(dataset=dataset, number=2, format="jsonl", path="x",
                                         content_hash="0" * 64, parent=first,
                                         pipeline_run=pipeline)


@pytest.fixture
def make_run(world, corpus, tmp_path, tiny_copy):
    """`make_run(kind, output=folder or None, ...)`: a TrainingRun row of alpha."""

    def make(kind="pretrain", *, output=None, artifact="model", succeeded=True, base_run=None):
        if output is None and succeeded and artifact != "tokenizer":
            output = tiny_copy(tmp_path / "runs" / f"{kind}-{TrainingRun.objects.count()}")
        return TrainingRun.objects.create(
            tenant=world.alpha, created_by=world.alpha_member, name=f"demo-{kind}", kind=kind,
            dataset_version=corpus, base_run=base_run, spec={}, folder="r",
            succeeded=succeeded, artifact=artifact if succeeded else "",
            output_path=str(output or ""), parameters=30880)

    return make


def lora_output(base: Path, target: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(str(target))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(target))
    return target


def register(api, user, run, model="tiny"):
    return api.as_user(user).post(f"{BASE}/model-versions/register/",
                                  {"training_run": run.pk, "model": model}, format="json")


def test_a_pretraining_run_registers_with_its_lineage(api, world, make_run, corpus, settings):
    run = make_run("pretrain")
    response = register(api, world.alpha_member, run)
    assert response.status_code == 201, response.content
    version = response.json()
    assert (version["label"], version["status"], version["source"], version["format"]) == \
        ("tiny:v1", "ready", "training", "safetensors")
    assert version["training_run"] == run.pk and version["dataset_versions"] == [corpus.pk]
    assert version["architecture"] == "LlamaForCausalLM" and version["parameters"] == 30880
    artifact = Path(settings.DATA_DIR) / version["artifact_path"]
    assert (artifact / "model.safetensors").is_file()
    assert artifact != Path(run.output_path)

    lineage = version["lineage"]
    ids = {node["id"]: node for node in lineage["nodes"]}
    first = corpus.parent
    assert set(ids) == {f"dataset_version:{first.pk}", f"pipeline_run:{corpus.pipeline_run_id}",
                        f"dataset_version:{corpus.pk}", f"training_run:{run.pk}",
                        f"model_version:{version['id']}"}
    assert ids[f"training_run:{run.pk}"]["label"] == "demo-pretrain (pretrain)"
    assert sorted(lineage["edges"]) == sorted([
        [f"dataset_version:{first.pk}", f"pipeline_run:{corpus.pipeline_run_id}"],
        [f"pipeline_run:{corpus.pipeline_run_id}", f"dataset_version:{corpus.pk}"],
        [f"dataset_version:{corpus.pk}", f"training_run:{run.pk}"],
        [f"training_run:{run.pk}", f"model_version:{version['id']}"],
    ])
    again = register(api, world.alpha_member, run)
    assert again.json()["fields"]["training_run"] == [
        f"Training run {run.pk} is already registered as tiny:v1."]


def test_a_lora_run_registers_its_base_run_first(api, world, make_run, tiny_source, tmp_path,
                                                 settings):
    base_run = make_run("pretrain")
    adapter = lora_output(Path(base_run.output_path), tmp_path / "lora-out")
    lora = make_run("lora", output=adapter, artifact="adapter", base_run=base_run)
    response = register(api, world.alpha_member, lora)
    assert response.status_code == 201, response.content
    version = response.json()
    base = ModelVersion.objects.get(training_run=base_run)
    assert base.label == "tiny:v1" and version["label"] == "tiny:v2"
    assert version["format"] == "adapter" and version["base_version"] == base.pk
    assert f"Its base run {base_run.pk} had no version: registered it first as tiny:v1." in \
        version["message"]
    # The adapter's own parameters: LoRA A (4x32) and B (32x4 for q, 16x4 for v) in 2 layers.
    assert version["parameters"] == 2 * ((4 * 32 + 32 * 4) + (4 * 32 + 16 * 4)) == 896
    config = json.loads((Path(settings.DATA_DIR) / version["artifact_path"]
                         / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(Path(settings.DATA_DIR) / base.artifact_path)

    edges = version["lineage"]["edges"]
    assert [f"model_version:{base.pk}", f"training_run:{lora.pk}"] in edges
    assert [f"training_run:{base_run.pk}", f"model_version:{base.pk}"] in edges
    # The base's lineage shows what was built on it.
    derived = version_lineage(base)
    assert [f"training_run:{lora.pk}", f"model_version:{version['id']}"] in derived["edges"]

    # A second fine-tune of the same base reuses its version.
    sft = make_run("sft", base_run=base_run)
    second = register(api, world.alpha_member, sft, model="tiny-sft").json()
    assert second["base_version"] == base.pk and "registered it first" not in second["message"]


def test_runs_without_a_model_are_refused(api, world, make_run, tmp_path):
    tokenizer = make_run("tokenizer", artifact="tokenizer", output=tmp_path)
    assert register(api, world.alpha_member, tokenizer).json()["fields"]["training_run"] == [
        f"Training run {tokenizer.pk} trained a tokenizer, not a model: there are no weights "
        "to register."]
    unfinished = make_run("pretrain", succeeded=False)
    assert register(api, world.alpha_member, unfinished).json()["fields"]["training_run"] == [
        f"Training run {unfinished.pk} is failed: only a finished run's model can be "
        "registered."]
    orphan = make_run("lora", artifact="adapter",
                      output=lora_output(Path(make_run().output_path), tmp_path / "a"))
    message = register(api, world.alpha_member, orphan).json()["fields"]["training_run"][0]
    assert "A LoRA adapter needs its base model" in message
    assert not ModelVersion.objects.exists()
    other = api.as_user(world.beta_member).post(
        f"{BASE}/model-versions/register/", {"training_run": make_run().pk, "model": "x"},
        format="json")
    assert other.json()["fields"]["training_run"] == ["No such training run."]


def test_a_run_output_linked_to_another_tenants_model_is_not_registered(
        api, world, make_run, tmp_path, tiny_copy):
    """The job writes its output folder: a link there to a model of beta's must not become
    a version of alpha's."""
    beta_model = tiny_copy(tmp_path / "beta-models" / "secret")
    planted = tmp_path / "runs" / "planted"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(beta_model, target_is_directory=True)
    run = make_run(output=planted)
    response = register(api, world.alpha_member, run)
    assert response.status_code == 400
    assert response.json()["fields"]["training_run"] == [
        f"The output folder of training run {run.pk} is a link, not a folder the run wrote: "
        "it is not registered."]
    assert not ModelVersion.objects.exists() and (beta_model / "config.json").is_file()


def test_a_run_output_without_tokenizer_gets_the_datasets(api, world, make_run, tmp_path,
                                                          tiny_source, corpus, settings):
    from ylink import storage as ylink_storage

    output = tmp_path / "bare"
    output.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(tiny_source / name, output / name)
    data = ylink_storage.absolute(corpus.path)
    data.mkdir(parents=True)
    shutil.copyfile(tiny_source / "tokenizer.json", data / "tokenizer.json")
    version = register(api, world.alpha_member, make_run(output=output)).json()
    assert version["status"] == "ready"
    assert f"The run saved no tokenizer: copied the one of {corpus}." in version["message"]
    assert "given a plain one" in version["message"]


def test_a_deployed_version_is_not_deleted(api, world, make_run, local_queue, settings,
                                           django_capture_on_commit_callbacks):
    version = ModelVersion.objects.get(pk=register(api, world.alpha_member,
                                                   make_run()).json()["id"])
    folder = Path(settings.DATA_DIR) / version.artifact_path
    deployment = Deployment.objects.create(tenant=world.alpha, name="tiny-chat",
                                           version=version, queue=local_queue)
    client = api.as_user(world.alpha_member)
    response = client.delete(f"{BASE}/model-versions/{version.pk}/")
    assert response.status_code == 400
    assert response.json()["fields"]["version"] == [
        "tiny:v1 is deployed as tiny-chat: delete those deployments first."]
    assert api.as_user(world.alpha_viewer).delete(
        f"{BASE}/model-versions/{version.pk}/").status_code == 403
    deployment.delete()
    client = api.as_user(world.alpha_member)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"{BASE}/model-versions/{version.pk}/").status_code == 204
    assert not ModelVersion.objects.exists() and not folder.exists()


def test_a_base_version_is_kept_while_versions_build_on_it(api, world, make_run, tmp_path):
    base_run = make_run()
    sft = make_run("sft", base_run=base_run,
                   output=tiny_model(tmp_path / "sft-out", seed=3))
    derived = register(api, world.alpha_member, sft).json()
    base = ModelVersion.objects.get(training_run=base_run)
    response = api.delete(f"{BASE}/model-versions/{base.pk}/")
    assert response.json()["fields"]["version"] == [
        f"tiny:v1 is the base of {derived['label']}: delete those versions first."]
