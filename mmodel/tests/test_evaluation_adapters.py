"""A LoRA version is scored on its base model's weights with the adapter applied, as lm-eval's
`hf` model does it (`pretrained=` the base, `peft=` the adapter)."""

import json
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager

from mmodel import storage
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import ModelVersion
from mmodel.services.evaluation import evaluation_start
from mmodel.tests import evaluation_fixtures
from mmodel.tests.test_registry_runs import lora_output

_own_data_dir = evaluation_fixtures._own_data_dir
tiny_weights = evaluation_fixtures.tiny_weights
tiny_version = evaluation_fixtures.tiny_version
suites = evaluation_fixtures.suites


def test_an_adapter_is_evaluated_on_its_base(world, farm, settings, tiny_version, suites):
    base = tiny_version(world.alpha)
    folder = lora_output(storage.artifact_folder(base),
                         Path(settings.DATA_DIR) / "models" / "alpha" / "tiny-lora")
    adapter = ModelVersion.objects.create(
        model=base.model, number=2, status=VersionStatus.READY, source=VersionSource.TRAINING,
        artifact_path=storage.relative(folder), format=WeightsFormat.ADAPTER,
        content_hash=storage.content_hash(folder), base_version=base)
    sums = suites()[1]

    run = evaluation_start(actor=world.alpha_member, tenant=world.alpha, version=adapter,
                           benchmarks=[sums], queue=farm.queues["alpha"], limit=2)

    spec = json.loads((storage.absolute(run.folder) / "spec.json").read_text())
    assert spec["model_args"]["pretrained"] == str(storage.artifact_folder(base))
    assert spec["model_args"]["peft"] == str(folder)
    # lm-eval takes these arguments as they are: the adapter's model answers.
    results = lm_eval.simple_evaluate(
        model="hf", model_args=spec["model_args"], tasks=[spec["tasks"][0]["task"]],
        task_manager=TaskManager(include_path=spec["tasks_dir"]), limit=2)
    scores = results["results"][spec["tasks"][0]["task"]]
    assert any(key.startswith("exact_match") for key in scores), scores
    assert results["config"]["model_args"]["peft"] == str(folder)
