"""The models' part of the golden path, as a user runs it: a model folder imported into the
registry, deployed twice on this machine with the transformers runtime (real `transformers
serve` processes started by the local driver), and called through the platform's gateway with
the official `openai` client — streaming and not, its tokens recorded as usage, refused to
another tenant and past the rate limit; one replica killed answers 503 while the other
deployment goes on, and the platform restarts it. And an embedding model (all-MiniLM-L6-v2, a
sentence-transformers folder) the same way: its vectors through the gateway are
sentence-transformers' own, and they rank a small query set's documents as it does."""

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from aistation.choices import JobState
from infra_os.models import UsageRecord
from infra_os.services.tokens import api_token_create
from mmodel.choices import DeploymentState, VersionStatus
from mmodel.models import Deployment, DeploymentReplica, GatewayLimit, ModelImport
from mmodel.selectors.deployments import deployment_state
from mmodel.services.deployments import deployment_create, deployment_stop
from mmodel.services.registry import model_import_start
from mmodel.storage import absolute
from mmodel.tests.minilm import minilm_folder
from mmodel.tests.tiny import tiny_model
from podsys.runtime import driver_for
from tests.platform_server import platform_server
from tests.processes import job_processes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _wait(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting until {what}")


def _ready(deployment: Deployment) -> bool:
    return DeploymentReplica.objects.filter(deployment=deployment, ready=True,
                                            job__state=JobState.RUNNING).exists()


@pytest.fixture
def stop_replicas():
    """Model servers are services: they outlive the test unless stopped. Stopped through the
    cluster driver at the end (the worker that would carry out a cancel is gone by then), and
    anything left of their jobs killed."""
    yield
    for deployment in Deployment.objects.filter(active=True).select_related("created_by"):
        # Cancelled first, so that the worker does not restart what is killed below.
        deployment_stop(actor=deployment.created_by, deployment=deployment)
    for replica in DeploymentReplica.objects.select_related("job__cluster"):
        for attempt in replica.job.attempts.all() if replica.job else []:
            with contextlib.suppress(Exception):
                driver_for(replica.job.cluster).cancel(attempt.workload_id)
        for pid in job_processes(replica.job_id) if replica.job_id else []:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def fresh_routing():
    """The gateway's routing table outlives a test's server in this process: each test's
    server starts from none, not from the table of the test before."""
    from mmodel.gateway import routing

    routing.reset()
    yield
    routing.reset()


@pytest.fixture
def import_root(tmp_path, settings, monkeypatch):
    root = tmp_path / "imports"
    root.mkdir()
    settings.OGAI_MODEL_IMPORT_ROOTS = [str(root)]
    # For the worker process started after this fixture.
    monkeypatch.setenv("OGAI_MODEL_IMPORT_ROOTS", str(root))
    monkeypatch.setenv("OGAI_DEPLOYMENT_WATCH_S", "1")
    return root


def _chat(client: openai.OpenAI, model: str, *, max_tokens: int = 8, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a capital."}],
        max_tokens=max_tokens, **kwargs)


def test_import_deploy_and_call_through_the_gateway(world, local_queue, import_root,
                                                    celery_worker_process, stop_replicas, settings):
    member = world.alpha_member
    tiny_model(import_root / "tiny")
    started = model_import_start(actor=member, tenant=world.alpha, model_name="tiny",
                                 source_path=str(import_root / "tiny"))
    imported = _wait(lambda: ModelImport.objects.filter(
        pk=started.pk, version__status=VersionStatus.READY).select_related("version").first(),
        "the import is ready")
    version = imported.version

    chat = deployment_create(actor=member, tenant=world.alpha, name="tiny-chat",
                             version=version, queue=local_queue, cpu_per_replica=0.5,
                             memory_mib_per_replica=1024)
    other = deployment_create(actor=member, tenant=world.alpha, name="tiny-other",
                              version=version, queue=local_queue, cpu_per_replica=0.5,
                              memory_mib_per_replica=1024)
    _wait(lambda: _ready(chat) and _ready(other), "both deployments are ready", timeout=180)
    assert deployment_state(chat) == DeploymentState.READY

    alpha_key = api_token_create(actor=member, name="sdk", expires_at=None).secret
    beta_key = api_token_create(actor=world.beta_member, name="sdk", expires_at=None).secret
    with platform_server() as url:
        alpha = openai.OpenAI(base_url=f"{url}/v1", api_key=alpha_key, max_retries=0)
        beta = openai.OpenAI(base_url=f"{url}/v1", api_key=beta_key, max_retries=0)

        # The gateway reads its routing table from the database every second.
        _wait(lambda: {m.id for m in alpha.models.list()} == {"tiny-chat", "tiny-other"},
              "the gateway lists both deployments", timeout=10)
        answer = _chat(alpha, "tiny-chat")
        assert answer.choices[0].message.content
        assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
        chunks = list(_chat(alpha, "tiny-chat", stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len([c for c in chunks if c.choices]) > 1 and streamed

        def usage_records():
            return list(UsageRecord.objects.filter(
                tenant=world.alpha, kind=UsageRecord.Kind.TOKENS, model_name="tiny-chat"))

        # The two calls' records may be written by different flushes: wait for both.
        _wait(lambda: len(usage_records()) >= 2, "the gateway records the usage", timeout=30)
        records = usage_records()
        assert len(records) == 2
        assert answer.usage.prompt_tokens in {r.prompt_tokens for r in records}
        assert all(r.completion_tokens > 0 for r in records)

        with pytest.raises(openai.NotFoundError):
            _chat(beta, "tiny-chat")
        with pytest.raises(openai.AuthenticationError):
            _chat(openai.OpenAI(base_url=f"{url}/v1", api_key="ogai_wrong", max_retries=0),
                  "tiny-chat")

        # Killed: its model answers 503 while the other deployment goes on, then it is back.
        # (With the gateway's wait for a starting replica off: with it, a request waits for
        # the restart instead, which mmodel/tests/test_gateway.py covers.)
        settings.OGAI_GATEWAY_COLD_START_WAIT_S = 0
        replica = chat.replica_set.get()
        victims = job_processes(replica.job_id)
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

        def refused() -> bool:
            try:
                _chat(alpha, "tiny-chat")
            except openai.APIStatusError as error:
                return error.status_code == 503
            return False

        _wait(refused, "the killed deployment answers 503", timeout=30)
        assert _chat(alpha, "tiny-other").choices[0].message.content
        _wait(lambda: _ready(chat) and chat.replica_set.get().job_id is not None,
              "the killed replica is restarted", timeout=180)
        _wait(lambda: not refused(), "the restarted replica answers", timeout=60)

        # A flood past the tenant's limit is refused with a time to come back.
        GatewayLimit.objects.create(tenant=world.alpha, requests_per_minute=3)

        def limited():
            try:
                _chat(alpha, "tiny-other", max_tokens=1)
            except openai.RateLimitError as error:
                return error
            return None

        error = _wait(limited, "the gateway refuses past the limit", timeout=30)
        assert int(error.response.headers["retry-after"]) > 0


def test_an_embedding_model_imported_deployed_and_called_through_the_gateway(
        world, local_queue, import_root, celery_worker_process, stop_replicas):
    from sentence_transformers import SentenceTransformer

    member = world.alpha_member
    shutil.copytree(minilm_folder(), import_root / "minilm")
    started = model_import_start(actor=member, tenant=world.alpha, model_name="minilm",
                                 source_path=str(import_root / "minilm"))
    version = _wait(lambda: ModelImport.objects.filter(
        pk=started.pk, version__status=VersionStatus.READY).select_related("version").first(),
        "the import is ready").version
    deployment = deployment_create(actor=member, tenant=world.alpha, name="minilm",
                                   version=version, queue=local_queue, cpu_per_replica=1,
                                   memory_mib_per_replica=1024)
    _wait(lambda: _ready(deployment), "the embedding model is ready", timeout=180)
    reference = SentenceTransformer(str(absolute(version.artifact_path)), device="cpu",
                                    local_files_only=True)
    shipped = json.loads((Path(__file__).parents[1] / "mmodel" / "tests" / "data" /
                          "retrieval.json").read_text())
    documents, queries = shipped["documents"], [q["text"] for q in shipped["queries"]]

    key = api_token_create(actor=member, name="sdk", expires_at=None).secret
    with platform_server() as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
        # The client asks for base64 unless told otherwise; both must be the same vectors.
        answer = client.embeddings.create(model="minilm", input=documents)
        found = client.embeddings.create(model="minilm", input=queries,
                                         encoding_format="float")
    assert answer.model == "minilm" and answer.usage.prompt_tokens > len(documents)
    docs = np.array([item.embedding for item in answer.data])
    asked = np.array([item.embedding for item in found.data])
    expected_docs = reference.encode(documents, convert_to_numpy=True)
    expected_asked = reference.encode(queries, convert_to_numpy=True)
    assert np.abs(docs - expected_docs).max() < 1e-5
    assert np.abs(asked - expected_asked).max() < 1e-5
    ranked = np.argsort(-(asked @ docs.T), axis=1)[:, :3]
    assert (ranked == np.argsort(-(expected_asked @ expected_docs.T), axis=1)[:, :3]).all()
    assert list(ranked[:, 0]) == [q["relevant"] for q in shipped["queries"]]

    from mmodel.gateway import app as gateway_app

    gateway_app.flush_sync()
    used = UsageRecord.objects.filter(model_name="minilm")
    assert sum(record.prompt_tokens for record in used) == \
        answer.usage.prompt_tokens + found.usage.prompt_tokens
