"""LoRA adapter versions: merged into their base once (cached by content hash) for
transformers serve; applied by vLLM itself on top of the base."""

import pytest
import torch

from aistation.choices import JobState
from mmodel.choices import DeploymentState, VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Deployment, DeploymentReplica, Model, ModelVersion
from mmodel.selectors.deployments import deployment_state
from mmodel.services.adapters import merge_state, merged_folder
from mmodel.services.deployments import MERGING, deployment_create, deployment_start
from mmodel.tasks.deployments import merge_adapter
from mmodel.tests.tiny import tiny_model


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def lora_adapter(base, folder, seed: int = 1):
    """A LoRA adapter of the tiny model whose update is not zero (peft starts B at zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(folder))
    return folder


@pytest.fixture
def versions(world, data_dir):
    base_folder = tiny_model(data_dir / "models" / "base")
    lora_adapter(base_folder, data_dir / "models" / "lora")
    model = Model.objects.create(tenant=world.alpha, name="tiny")
    base = ModelVersion.objects.create(
        model=model, number=1, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path="models/base", format=WeightsFormat.SAFETENSORS, content_hash="b" * 64)
    adapter = ModelVersion.objects.create(
        model=model, number=2, status=VersionStatus.READY, source=VersionSource.TRAINING,
        artifact_path="models/lora", format=WeightsFormat.ADAPTER, content_hash="a" * 64,
        base_version=base)
    return base, adapter


def replicas_of(deployment):
    return list(DeploymentReplica.objects.filter(deployment=deployment)
                .select_related("job").order_by("index"))


def test_transformers_serves_the_adapter_merged_into_its_base(farm, world, versions,
                                                              data_dir):
    _, adapter = versions
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tuned",
                                   version=adapter, queue=farm.queues["alpha"], replicas=2)
    # No job holds resources while the merge runs.
    assert all(r.job is None and r.message == MERGING for r in replicas_of(deployment))
    assert deployment_state(deployment) == DeploymentState.STARTING

    merge_adapter(version_id=adapter.pk)  # the task, run here
    folder = merged_folder(adapter)
    assert folder == data_dir / "mmodel" / "merged" / adapter.content_hash
    assert merge_state(adapter) == (True, "")
    for replica in replicas_of(deployment):
        assert replica.job.state == JobState.QUEUED
        command = replica.job.command
        assert command[command.index("serve") + 1] == str(folder)
        assert replica.served_model == str(folder)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tokens = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(folder))(tokens).logits
        plain = AutoModelForCausalLM.from_pretrained(str(data_dir / "models" / "base"))
        expected = PeftModel.from_pretrained(plain, str(data_dir / "models" / "lora"))(
            tokens).logits
        unmerged = AutoModelForCausalLM.from_pretrained(
            str(data_dir / "models" / "base"))(tokens).logits
    assert torch.allclose(merged, expected, atol=1e-5)
    assert not torch.allclose(merged, unmerged, atol=1e-3)  # the adapter changed something

    # Cached: a second deployment of the same adapter starts at once, merging nothing.
    again = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tuned-2",
                              version=adapter, queue=farm.queues["alpha"])
    command = replicas_of(again)[0].job.command
    assert command[command.index("serve") + 1] == str(folder)


def test_a_failed_merge_fails_the_deployment_until_started_again(farm, world, versions,
                                                                 data_dir):
    _, adapter = versions
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tuned",
                                   version=adapter, queue=farm.queues["alpha"])
    (data_dir / "models" / "lora" / "adapter_model.safetensors").write_bytes(b"not weights")
    merge_adapter(version_id=adapter.pk)
    replica = replicas_of(deployment)[0]
    assert replica.failed and replica.job is None
    assert replica.message.startswith("merging adapter tiny:v2 into tiny:v1 failed")
    assert deployment_state(Deployment.objects.get(pk=deployment.pk)) == DeploymentState.FAILED

    deployment_start(actor=world.alpha_member, deployment=deployment)  # merges again
    replica = replicas_of(deployment)[0]
    assert not replica.failed and replica.message == MERGING


def test_vllm_applies_the_adapter_on_its_base_itself(farm, world, versions, data_dir):
    _, adapter = versions
    deployment = deployment_create(actor=world.alpha_member, tenant=world.alpha, name="tuned",
                                   version=adapter, queue=farm.queues["alpha"], runtime="vllm",
                                   gpus_per_replica=1)
    replica = replicas_of(deployment)[0]
    command = replica.job.command
    assert command[:3] == ["vllm", "serve", str(data_dir / "models" / "base")]
    assert command[command.index("--lora-modules") + 1] == \
        f"tuned={data_dir / 'models' / 'lora'}"
    assert replica.served_model == "tuned"
    assert not merged_folder(adapter).exists()
