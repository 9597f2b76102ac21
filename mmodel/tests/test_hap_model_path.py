"""A YLink pipeline whose `hap` step names a registry model version: the registry's callback
resolves it when the run is submitted, the spec carries the folder and the job may read it."""

import json
from pathlib import Path

import pytest
from django.core.files.base import ContentFile

from aistation.models import Job
from mmodel.models import Model, ModelVersion
from ylink.models import PipelineRun
from ylink.services.datasets import dataset_create, dataset_upload

pytestmark = pytest.mark.django_db


def test_a_pipeline_naming_a_registry_model_gets_its_folder(api, farm, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    world = farm.world
    folder = Path(settings.DATA_DIR) / "models" / "hap-clf" / "v1"
    folder.mkdir(parents=True)
    model = Model.objects.create(tenant=world.alpha, name="hap-clf")
    ModelVersion.objects.create(model=model, number=1, source="import", format="safetensors",
                                status="ready", artifact_path="models/hap-clf/v1")
    ModelVersion.objects.create(model=model, number=2, source="import", format="safetensors",
                                status="importing")
    dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name="corpus")
    version = dataset_upload(actor=world.alpha_member, dataset=dataset, upload=ContentFile(
        b'{"text": "A document, long enough to count."}\n', name="corpus.jsonl"))
    client = api.as_user(world.alpha_member)

    def start_with(reference: str):
        return client.post("/api/v1/ylink/pipeline-runs/", {
            "dataset_version": version.pk, "tenant": "alpha",
            "steps": [{"type": "hap", "params": {"scorer": "model", "model": reference}}]},
            format="json")

    response = start_with("hap-clf:v1")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["job"])
    spec = json.loads(Path(job.command[-1]).read_text())
    assert spec["models"] == {"hap-clf:v1": str(folder)}
    assert next(m for m in job.mounts if m["path"] == str(folder))["read_only"] is True

    for reference, says in (("hap-clf:v2", "is importing, not ready"),
                            ("hap-clf:v9", "has no model version hap-clf:v9"),
                            ("other:v1", "has no model version other:v1")):
        response = start_with(reference)
        assert response.status_code == 400
        assert says in response.json()["fields"]["steps[0].params.model"][0], response.json()
    assert PipelineRun.objects.count() == 1
