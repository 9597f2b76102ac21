"""A pool as a user runs it: a base model and four LoRA fine-tunes of it deployed as one pool
of one replica on this machine (a real `mmodel.runners.serve_pool` process started by the
local driver), called through the platform's gateway with the official `openai` client, each
fine-tune under its own name, the calls interleaved: every answer is what that adapter alone
gives (PEFT on the base in this process), the usage is recorded under each name, and the
deployment's page says which replica holds what."""

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from django.test import Client
from django.urls import reverse

from infra_os.models import UsageRecord
from infra_os.services.tokens import api_token_create
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import DeploymentReplica, Model, ModelVersion
from mmodel.services.deployments import deployment_create
from mmodel.tests.test_deployments_adapters import lora_adapter
from mmodel.tests.test_serve_pool import alone
from mmodel.tests.tiny import tiny_model
from tests.platform_server import platform_server
from tests.test_golden_path_models import _ready, _wait, fresh_routing, stop_replicas  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROMPTS = ["Paris is the capital of", "The quick brown fox", "1 2 3 4 5"]


@pytest.fixture
def watch_often(monkeypatch):
    """For the worker started after it: replicas' health read every second."""
    monkeypatch.setenv("OGAI_DEPLOYMENT_WATCH_S", "1")


def test_four_fine_tunes_served_by_one_pool_replica_through_the_gateway(
        world, local_queue, settings, watch_often, celery_worker_process,
        stop_replicas):  # noqa: F811
    member = world.alpha_member
    root = settings.DATA_DIR / "models" / "pool-test"
    base_folder = tiny_model(root / "base")
    model = Model.objects.create(tenant=world.alpha, name="tiny")
    base = ModelVersion.objects.create(
        model=model, number=1, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path="models/pool-test/base", format=WeightsFormat.SAFETENSORS,
        content_hash="b" * 64)
    tunes = {}
    for index in range(4):
        lora_adapter(base_folder, root / f"tune-{index}", seed=index)
        tunes[f"tune-{index}"] = ModelVersion.objects.create(
            model=model, number=2 + index, status=VersionStatus.READY,
            source=VersionSource.TRAINING, artifact_path=f"models/pool-test/tune-{index}",
            format=WeightsFormat.ADAPTER, content_hash=f"{index}" * 64, base_version=base)
    for path in root.rglob("*"):  # as the registry stores a version (save_pretrained: 0600)
        path.chmod(0o755 if path.is_dir() else 0o644)
    deployment = deployment_create(
        actor=member, tenant=world.alpha, name="tiny", version=base, queue=local_queue,
        cpu_per_replica=1, memory_mib_per_replica=1024,
        pool=[(name, version) for name, version in tunes.items()])
    _wait(lambda: _ready(deployment), "the pool's replica is ready", timeout=180)
    expected = {(name, prompt): alone(str(base_folder),
                                      None if name == "tiny" else str(root / name), prompt, 10)
                for name in ["tiny", *tunes] for prompt in PROMPTS}
    assert len({expected[(name, PROMPTS[0])] for name in ["tiny", *tunes]}) > 1

    key = api_token_create(actor=member, name="sdk", expires_at=None).secret
    asks = [(name, prompt) for prompt in PROMPTS for name in [*tunes, "tiny"]]
    with platform_server() as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        listed = {item.id for item in client.models.list().data}

        def ask(item):
            name, prompt = item
            return client.completions.create(model=name, prompt=prompt, max_tokens=10,
                                             temperature=0)

        with ThreadPoolExecutor(len(asks)) as workers:
            answers = list(workers.map(ask, asks))
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="tune-2", prompt=PROMPTS[0], max_tokens=10, temperature=0, stream=True)
            if chunk.choices)
    assert listed >= {"tiny", *tunes}
    for (name, prompt), answer in zip(asks, answers, strict=True):
        assert answer.model == name
        assert answer.choices[0].text == expected[(name, prompt)], (name, prompt)
    assert streamed == expected[("tune-2", PROMPTS[0])]

    from mmodel.gateway import app as gateway_app

    gateway_app.flush_sync()
    used = {record.model_name for record in UsageRecord.objects.filter(tenant=world.alpha)}
    assert used >= {"tiny", *tunes}

    # The watch reads what the replica holds; the page and the API show it.
    _wait(lambda: set(DeploymentReplica.objects.get(deployment=deployment).holds)
          >= {"tiny", *tunes}, "the watch records what the replica holds", timeout=30)
    browser = Client()
    browser.force_login(member)
    shown = json.loads(browser.get(f"/api/v1/mmodel/deployments/{deployment.pk}/").content)
    assert {row["name"]: row["held_by"] for row in shown["pool"]} == \
        {"tiny": [0], **{name: [0] for name in tunes}}
    page = browser.get(reverse("frontend:deployment", args=[deployment.pk])).content.decode()
    assert "Models in this pool" in page and 'data-member="tune-3"' in page
