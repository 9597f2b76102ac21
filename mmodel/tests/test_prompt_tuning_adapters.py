"""Prompt-tuning adapter versions: registered as adapters of their base (the registry's checks
accept them), never merged; the transformers runtime serves them attached and vLLM is refused
in words; an evaluation scores them on their base with the prompt applied, a multi-task prompt
as one of its tasks."""

import json

import pytest
import torch
from django.core.exceptions import ValidationError

from mmodel import importing
from mmodel.choices import Runtime, VersionSource, VersionStatus, WeightsFormat
from mmodel.models import DeploymentReplica, Model, ModelVersion
from mmodel.runners import serve_transformers
from mmodel.selectors.deployments import deployment_serving
from mmodel.services.adapters import PROMPT_SERVING, merged_folder, single_task_prompt
from mmodel.services.deployments import deployment_create
from mmodel.tests.tiny import tiny_model

TASKS = ["animal", "colour"]


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def prompt_adapter(base, folder):
    """A trained-looking multi-task prompt of the tiny model, as the runner saves it."""
    from peft import MultitaskPromptTuningConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_model = get_peft_model(model, MultitaskPromptTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=3, num_tasks=2, num_ranks=2))
    encoder = peft_model.prompt_encoder["default"]
    with torch.no_grad():  # as after training: factors far from their tiny start
        encoder.prefix_task_cols.normal_(std=1.0)
        encoder.prefix_task_rows.normal_(std=1.0)
    peft_model.save_pretrained(str(folder))
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(base)  # as the registry points it
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "prompt_tasks.json").write_text(json.dumps({"tasks": TASKS}))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(folder))
    return folder


@pytest.fixture
def versions(world, data_dir):
    base_folder = tiny_model(data_dir / "models" / "base")
    prompt_adapter(base_folder, data_dir / "models" / "prompt")
    model = Model.objects.create(tenant=world.alpha, name="tiny")
    base = ModelVersion.objects.create(
        model=model, number=1, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path="models/base", format=WeightsFormat.SAFETENSORS, content_hash="b" * 64)
    adapter = ModelVersion.objects.create(
        model=model, number=2, status=VersionStatus.READY, source=VersionSource.TRAINING,
        artifact_path="models/prompt", format=WeightsFormat.ADAPTER, content_hash="p" * 64,
        base_version=base)
    return base, adapter


def test_the_registry_checks_a_prompt_adapter_against_its_base(data_dir, versions):
    tensors = importing.check_adapter(data_dir / "models" / "prompt", data_dir / "models" / "base")
    assert set(tensors) == {"prompt_embeddings", "prefix_task_cols", "prefix_task_rows"}


def test_transformers_serves_a_prompt_attached_never_merged(farm, world, versions, data_dir):
    _, adapter = versions
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="prompted",
                                   version=adapter, queue=farm.queues["alpha"])
    replica = DeploymentReplica.objects.select_related("job").get(deployment=deployment)
    command = replica.job.command  # no merge to wait for
    assert command[command.index("serve") + 1] == str(data_dir / "models" / "prompt")
    assert serve_transformers.ATTACH_FLAG in command
    assert "--continuous-batching" not in command
    assert not merged_folder(adapter).exists()
    assert deployment_serving(deployment) == PROMPT_SERVING
    assert "served attached by the transformers runtime" in PROMPT_SERVING
    assert "vLLM cannot serve prompt-tuning adapters" in PROMPT_SERVING


def test_vllm_is_refused_for_a_prompt_adapter_in_words(farm, world, versions, settings):
    settings.OGAI_VLLM_IMAGE = "vllm/vllm-openai"
    _, adapter = versions
    with pytest.raises(ValidationError) as raised:
        deployment_create(actor=world.alpha_member, tenant=world.alpha, name="prompted",
                          version=adapter, queue=farm.queues["alpha"], runtime=Runtime.VLLM,
                          gpus_per_replica=1)
    assert "vLLM cannot serve prompt-tuning adapters" in str(raised.value.message_dict)


def test_one_task_of_a_multitask_prompt_answers_as_its_task_id_does(data_dir, versions):
    """What the server attaches (and the evaluation scores) for a task is the multi-task
    model's output for that task id."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_folder, folder = data_dir / "models" / "base", data_dir / "models" / "prompt"
    _, adapter = versions
    ids = torch.tensor([[5, 17, 42, 7]])
    multitask = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_folder)),
                                          str(folder)).eval()
    with torch.no_grad():
        expected = {task: multitask(input_ids=ids, task_ids=torch.tensor([index])).logits
                    for index, task in enumerate(TASKS)}
        for task in TASKS:
            served = serve_transformers.attach_prompt(
                AutoModelForCausalLM.from_pretrained(str(base_folder)), str(folder), task)
            assert torch.allclose(served(input_ids=ids).logits, expected[task], atol=1e-5)
        plain = single_task_prompt(adapter, "colour")
        scored = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_folder)),
                                           str(plain)).eval()
        assert torch.allclose(scored(input_ids=ids).logits, expected["colour"], atol=1e-5)
    assert not torch.allclose(expected["animal"], expected["colour"])
    assert single_task_prompt(adapter) == plain.with_name(plain.name.replace("task1", "task0"))
