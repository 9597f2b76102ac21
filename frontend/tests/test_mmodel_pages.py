"""The model pages (L4) with data made through the ORM on a fake cluster: models and versions
with their lineage graph, evaluations (leaderboard, runs, samples, benchmarks), deployments and
the playground; who sees what and may do what."""

import html
import json
import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse
from django.utils import timezone

from aistation.choices import JobState
from mmodel.choices import BenchmarkKind, ImportState, VersionSource, VersionStatus, WeightsFormat
from mmodel.gateway.stats import BUCKET_COUNT, bucket_index
from mmodel.models import (
    Benchmark,
    Deployment,
    DeploymentReplica,
    DeploymentStat,
    EvaluationResult,
    EvaluationRun,
    EvaluationSample,
    Model,
    ModelImport,
    ModelVersion,
)
from mmodel.services.evaluation import benchmark_create
from tests.factories import JobFactory
from ylink.choices import TrainingKind, VersionFormat
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun

HTMX = {"HTTP_HX_REQUEST": "true"}


def _lineage(tenant, member):
    """An upload, a pipeline run that made v2 of it, and a training run on v2."""
    dataset = Dataset.objects.create(tenant=tenant, name=f"{tenant.name}-corpus")
    upload = DatasetVersion.objects.create(dataset=dataset, number=1, format=VersionFormat.JSONL,
                                           path="d/1", content_hash="a" * 64, documents=10)
    pipeline = PipelineRun.objects.create(tenant=tenant, name=f"{tenant.name}-clean",
                                          input_version=upload, steps=[], succeeded=True)
    cleaned = DatasetVersion.objects.create(dataset=dataset, number=2, format=VersionFormat.JSONL,
                                            path="d/2", content_hash="b" * 64, documents=8,
                                            parent=upload, pipeline_run=pipeline)
    training = TrainingRun.objects.create(
        tenant=tenant, name=f"{tenant.name}-tiny", kind=TrainingKind.PRETRAIN,
        dataset_version=cleaned, spec={}, succeeded=True, artifact="model",
        parameters=30_000, created_by=member)
    return SimpleNamespace(dataset=dataset, upload=upload, pipeline=pipeline, cleaned=cleaned,
                           training=training)


def _made(tenant, member, queue):
    lineage = _lineage(tenant, member)
    model = Model.objects.create(tenant=tenant, name=f"{tenant.name}-llama", created_by=member)
    trained = ModelVersion.objects.create(
        model=model, number=1, status=VersionStatus.READY, source=VersionSource.TRAINING,
        format=WeightsFormat.SAFETENSORS, architecture="LlamaForCausalLM", model_type="llama",
        parameters=30_000, context_length=256, dtype="float32", tokenizer="PreTrainedTokenizerFast",
        content_hash="c" * 64, bytes=123_456, artifact_path="models/1",
        files=[{"path": "model.safetensors", "bytes": 120_000},
               {"path": "config.json", "bytes": 700}],
        training_run=lineage.training, created_by=member)
    trained.dataset_versions.add(lineage.cleaned)
    imported = ModelVersion.objects.create(
        model=model, number=2, status=VersionStatus.READY, source=VersionSource.IMPORT,
        format=WeightsFormat.SAFETENSORS, source_path="/imports/llama", bytes=100_000,
        architecture="LlamaForCausalLM", parameters=30_000)
    started = ModelImport.objects.create(tenant=tenant, model=model, version=imported,
                                         source_path="/imports/llama", state=ImportState.RUNNING)
    multiple = Benchmark.objects.create(tenant=tenant, name=f"{tenant.name}-mc",
                                        kind=BenchmarkKind.MULTIPLE_CHOICE, data_path="b/mc",
                                        documents=4, content_hash="d" * 64)
    perplexity = Benchmark.objects.create(tenant=tenant, name=f"{tenant.name}-ppl",
                                          kind=BenchmarkKind.PERPLEXITY, data_path="b/ppl",
                                          documents=4, content_hash="e" * 64)
    runs = []
    # v1 is more accurate, v2 has the lower (better) perplexity.
    for version, acc, ppl in ((trained, 0.75, 31.5), (imported, 0.5, 20.25)):
        run = EvaluationRun.objects.create(tenant=tenant, name=f"eval-{version.number}",
                                           version=version, succeeded=True,
                                           finished_at=timezone.now(), created_by=member)
        run.benchmarks.set([multiple, perplexity])
        EvaluationResult.objects.create(run=run, benchmark=multiple, metric="acc", value=acc,
                                        stderr=0.1, samples=4)
        EvaluationResult.objects.create(run=run, benchmark=multiple, metric="acc_norm",
                                        value=acc / 2, samples=4)
        EvaluationResult.objects.create(run=run, benchmark=perplexity, metric="word_perplexity",
                                        value=ppl, samples=4)
        for index in range(4):
            EvaluationSample.objects.create(
                run=run, benchmark=multiple, index=index, prompt=f"Question {index}?",
                target="B", output=f"answer {index} of v{version.number}",
                correct=index < acc * 4, scores={"acc": float(index < acc * 4)})
        runs.append(run)
    job = JobFactory(queue=queue, state=JobState.RUNNING, service=True, ports=[8000])
    deployment = Deployment.objects.create(tenant=tenant, name=f"{tenant.name}-chat",
                                           version=trained, queue=queue, created_by=member)
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, ready=True,
                                     upstream="http://127.0.0.1:9", served_model="/m",
                                     checked_at=timezone.now())
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=2)
    buckets = [0] * BUCKET_COUNT
    buckets[bucket_index(40)] = 9
    buckets[bucket_index(400)] = 1
    DeploymentStat.objects.create(deployment=deployment, minute=minute, requests=10, errors=1,
                                  prompt_tokens=200, completion_tokens=300,
                                  latency_ms_sum=760, latency_buckets=buckets)
    return SimpleNamespace(lineage=lineage, model=model, trained=trained, imported=imported,
                           started=started, benchmarks=[multiple, perplexity], runs=runs,
                           deployment=deployment)


@pytest.fixture
def catalog(farm, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    world = farm.world
    return SimpleNamespace(
        world=world, farm=farm,
        alpha=_made(world.alpha, world.alpha_member, farm.queues["alpha"]),
        beta=_made(world.beta, world.beta_member, farm.queues["beta"]))


def _pages(made) -> dict[str, tuple[str, dict]]:
    run = made.runs[0]
    return {
        "models": (reverse("frontend:models"), {}),
        "model": (reverse("frontend:model", args=[made.model.pk]), {}),
        "version": (reverse("frontend:model-version", args=[made.trained.pk]), {}),
        "import": (reverse("frontend:model-import-detail", args=[made.started.pk]), {}),
        "import-status": (reverse("frontend:model-import-detail", args=[made.started.pk]),
                          {"part": "status"}),
        "evaluations": (reverse("frontend:evaluations"), {}),
        "evaluation-run": (reverse("frontend:evaluation-run", args=[run.pk]), {}),
        "evaluation-run-status": (reverse("frontend:evaluation-run", args=[run.pk]),
                                  {"part": "status"}),
        "samples": (reverse("frontend:evaluation-samples", args=[run.pk]), {}),
        "samples-page": (reverse("frontend:evaluation-samples", args=[run.pk]),
                         {"part": "samples", "correct": "no"}),
        "samples-paired": (reverse("frontend:evaluation-samples", args=[run.pk]),
                           {"compare": made.runs[1].pk, "benchmark": made.benchmarks[0].pk}),
        "benchmarks": (reverse("frontend:benchmarks"), {}),
        "deployments": (reverse("frontend:deployments"), {}),
        "deployment": (reverse("frontend:deployment", args=[made.deployment.pk]), {}),
        "deployment-status": (reverse("frontend:deployment", args=[made.deployment.pk]),
                              {"part": "status"}),
        "playground": (reverse("frontend:playground"), {}),
    }


WRITE_PAGES = ("frontend:model-register", "frontend:model-import", "frontend:evaluation-start",
               "frontend:deployment-create")
LIST_PAGES = ("models", "evaluations", "benchmarks", "deployments", "playground")


def test_every_page_renders_for_a_member(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    for name, (url, params) in _pages(catalog.alpha).items():
        response = client.get(url, params)
        assert response.status_code == 200, name
    for url_name in WRITE_PAGES:
        response = client.get(reverse(url_name))
        assert response.status_code == 200, url_name
        assert 'class="sidebar"' in response.content.decode()


def test_the_models_section_of_the_navigation(signed_in, catalog):
    response = signed_in(catalog.world.alpha_member).get(
        reverse("frontend:deployment", args=[catalog.alpha.deployment.pk]))
    sections = {section.label: [(link.label, link.active) for link in section.links]
                for section in response.context["nav_sections"]}
    assert sections["Models"] == [("Models", False), ("Evaluations", False),
                                  ("Deployments", True), ("Playground", False)]


def test_viewers_see_every_page_but_change_nothing(signed_in, catalog):
    client = signed_in(catalog.world.alpha_viewer)
    made = catalog.alpha
    for name, (url, params) in _pages(made).items():
        assert client.get(url, params).status_code == 200, name
    for url_name in WRITE_PAGES:
        assert client.get(reverse(url_name)).status_code == 403, url_name
    deployment = made.deployment
    page = client.get(reverse("frontend:deployment", args=[deployment.pk])).content.decode()
    assert "data-scale-form" not in page and ">Delete<" not in page
    for action in ("stop", "delete"):
        client.post(reverse(f"frontend:deployment-{action}", args=[deployment.pk]))
    client.post(reverse("frontend:deployment-scale", args=[deployment.pk]), {"replicas": 3})
    deployment.refresh_from_db()
    assert deployment.active and deployment.replicas == 1
    upload = client.post(reverse("frontend:benchmarks"), {
        "name": "sneaky", "kind": "perplexity", "text_field": "text", "few_shot": 0,
        "file": ContentFile(b'{"text": "x"}\n', name="b.jsonl")})
    assert upload.status_code == 403
    assert not Benchmark.objects.filter(name="sneaky").exists()
    playground = client.get(reverse("frontend:playground")).content.decode()
    assert "data-vote" not in playground.replace("data-vote-url", "")
    assert "Evaluate a version" not in client.get(reverse("frontend:evaluations")).content.decode()


def test_nothing_of_another_tenant_shows_or_can_be_touched(signed_in, catalog):
    client = signed_in(catalog.world.beta_member)
    alpha = catalog.alpha
    for name, (url, params) in _pages(alpha).items():
        response = client.get(url, params)
        if name.split("-")[0] in LIST_PAGES and name in LIST_PAGES:
            content = response.content.decode()
            assert "alpha-" not in content, name
            assert "beta-" in content, name
        else:
            assert response.status_code == 404, name
    deployment = alpha.deployment
    for action in ("stop", "start", "delete"):
        response = client.post(reverse(f"frontend:deployment-{action}", args=[deployment.pk]))
        assert response.status_code == 404, action
    assert client.post(reverse("frontend:deployment-scale", args=[deployment.pk]),
                       {"replicas": 2}).status_code == 404
    deployment.refresh_from_db()
    assert deployment.active and deployment.replicas == 1
    # Another tenant's run is no choice beside one's own.
    own = catalog.beta.runs[0]
    response = client.get(reverse("frontend:evaluation-samples", args=[own.pk]),
                          {"compare": alpha.runs[0].pk})
    assert response.status_code == 404


def test_the_model_list_and_model_page(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    listing = client.get(reverse("frontend:models")).content.decode()
    row = re.search(r'<tr[^>]*data-model="alpha-llama".*?</tr>', listing, re.S).group(0)
    # Two versions, the newest v2, 123,456 + 100,000 bytes in all.
    assert '<td class="num">2</td>' in row and ">v2</a>" in row and "218.2\xa0KB" in row
    page = client.get(reverse("frontend:model", args=[catalog.alpha.model.pk])).content.decode()
    assert 'data-version="1"' in page and 'data-version="2"' in page
    assert "LlamaForCausalLM" in page and "30,000" in page
    assert reverse("frontend:training-run", args=[catalog.alpha.lineage.training.pk]) in page
    assert f'data-import="{catalog.alpha.started.pk}"' in page


def test_the_version_page_draws_its_lineage_with_links(signed_in, catalog):
    made = catalog.alpha
    lineage = made.lineage
    page = signed_in(catalog.world.alpha_member).get(
        reverse("frontend:model-version", args=[made.trained.pk])).content.decode()
    svg = re.search(r'<svg class="chart lineage".*?</svg>', page, re.S).group(0)
    dataset_url = reverse("frontend:dataset", args=[lineage.dataset.pk])
    for url, node in (
            (f"{dataset_url}?version=1", f"dataset_version:{lineage.upload.pk}"),
            (f"{dataset_url}?version=2", f"dataset_version:{lineage.cleaned.pk}"),
            (reverse("frontend:pipeline-run", args=[lineage.pipeline.pk]),
             f"pipeline_run:{lineage.pipeline.pk}"),
            (reverse("frontend:training-run", args=[lineage.training.pk]),
             f"training_run:{lineage.training.pk}")):
        assert re.search(rf'<a href="{re.escape(url)}"><g class="lineage-node" '
                         rf'data-node="{node}"', svg), node
    # The version itself is drawn, highlighted, without a link to the page it is on.
    assert f'data-node="model_version:{made.trained.pk}"' in svg
    assert f'href="{reverse("frontend:model-version", args=[made.trained.pk])}"' not in svg
    for source, target in (
            (f"dataset_version:{lineage.upload.pk}", f"pipeline_run:{lineage.pipeline.pk}"),
            (f"training_run:{lineage.training.pk}", f"model_version:{made.trained.pk}")):
        assert f'data-from="{source}" data-to="{target}"' in svg, source
    # Columns left to right: upload, pipeline, cleaned version, training, model version.
    xs = [float(re.search(rf'data-node="{node}".*?<rect x="([\d.]+)"', svg, re.S).group(1))
          for node in (f"dataset_version:{lineage.upload.pk}",
                       f"pipeline_run:{lineage.pipeline.pk}",
                       f"dataset_version:{lineage.cleaned.pk}",
                       f"training_run:{lineage.training.pk}",
                       f"model_version:{made.trained.pk}")]
    assert xs == sorted(xs) and len(set(xs)) == 5
    assert "model.safetensors" in page and "cccccccccccccccc…" in page
    assert f'data-run="{made.runs[0].pk}"' in page
    assert 'data-deployment="alpha-chat"' in page


def test_the_leaderboard_marks_the_best_of_each_column(signed_in, catalog):
    page = signed_in(catalog.world.alpha_member).get(reverse("frontend:evaluations")) \
        .content.decode()
    rows = {label: row for label, row in re.findall(
        r'<tr data-version="([^"]+)">(.*?)</tr>', page, re.S)}
    assert set(rows) == {"alpha-llama:v1", "alpha-llama:v2"}

    def cells(label):
        return re.findall(r'<td class="num( best)?"[^>]*>(.*?)</td>', rows[label], re.S)

    # Columns by benchmark name: alpha-mc (acc, higher is better), then alpha-ppl (lower).
    assert [(best, re.sub(r"<.*?>|★", "", text).strip()) for best, text in cells(
        "alpha-llama:v1")] == [(" best", "0.7500"), ("", "31.5000")]
    assert [(best, re.sub(r"<.*?>|★", "", text).strip()) for best, text in cells(
        "alpha-llama:v2")] == [("", "0.5000"), (" best", "20.2500")]
    assert page.count('data-best="true"') == 2
    assert "word_perplexity ↓ lower is better" in page
    chart = re.search(r'<svg class="chart".*?</svg>', page, re.S).group(0)
    # Normalised: the best bar of each benchmark is the full 180 px, v2's accuracy half of it.
    bars = dict(re.findall(r'data-version="([^"]+)" data-benchmark="alpha-mc" x="[\d.]+" '
                           r'y="[\d.]+" width="[\d.]+" height="([\d.]+)"', chart))
    assert bars == {"alpha-llama:v1": "180.0", "alpha-llama:v2": "120.0"}
    ppl = dict(re.findall(r'data-version="([^"]+)" data-benchmark="alpha-ppl" x="[\d.]+" '
                          r'y="[\d.]+" width="[\d.]+" height="([\d.]+)"', chart))
    assert ppl["alpha-llama:v2"] == "180.0" and float(ppl["alpha-llama:v1"]) < 180


def test_the_leaderboard_stars_only_runs_on_the_same_documents(signed_in, catalog):
    """A quick run limited to 2 of alpha-mc's 4 documents scores higher than the full runs:
    it is marked as limited and starred against no one; the best full run keeps its star."""
    made = catalog.alpha
    quick = ModelVersion.objects.create(
        model=made.model, number=3, status=VersionStatus.READY, source=VersionSource.IMPORT,
        format=WeightsFormat.SAFETENSORS, source_path="/imports/quick", bytes=100_000)
    multiple, _ = made.benchmarks
    run = EvaluationRun.objects.create(tenant=catalog.world.alpha, name="quick", version=quick,
                                       succeeded=True, finished_at=timezone.now(), limit=2)
    run.benchmarks.set([multiple])
    EvaluationResult.objects.create(run=run, benchmark=multiple, metric="acc", value=1.0,
                                    samples=2)
    page = signed_in(catalog.world.alpha_member).get(reverse("frontend:evaluations")) \
        .content.decode()
    rows = {label: row for label, row in re.findall(
        r'<tr data-version="([^"]+)">(.*?)</tr>', page, re.S)}
    mc_cells = {label: re.findall(r'<td class="num[^"]*"[^>]*>.*?</td>', row, re.S)[0]
                for label, row in rows.items()}
    assert 'data-documents="2"' in mc_cells["alpha-llama:v3"]
    assert "2 docs (limit)" in mc_cells["alpha-llama:v3"]
    assert "data-best" not in mc_cells["alpha-llama:v3"]
    assert 'data-best="true"' in mc_cells["alpha-llama:v1"]
    assert "among runs on the same 4 documents" in mc_cells["alpha-llama:v1"]
    assert "4 docs" in mc_cells["alpha-llama:v1"] and "(limit)" not in mc_cells["alpha-llama:v1"]
    assert "data-best" not in mc_cells["alpha-llama:v2"]
    # The perplexity column has full runs only: marked as before, no document counts shown.
    assert page.count('data-best="true"') == 2
    assert "docs" not in re.findall(r'<td class="num[^"]*"[^>]*>.*?</td>',
                                    rows["alpha-llama:v2"], re.S)[1]


def test_the_sample_viewer_filters_and_pairs(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    first, second = catalog.alpha.runs
    url = reverse("frontend:evaluation-samples", args=[first.pk])
    wrong = client.get(url, {"part": "samples", "correct": "no"}, **HTMX).content.decode()
    assert re.findall(r'data-sample="(\d+)"', wrong) == ["3"]
    assert "<html" not in wrong
    right = client.get(url, {"correct": "yes"}).content.decode()
    assert re.findall(r'data-sample="(\d+)"', right) == ["0", "1", "2"]
    paired = client.get(url, {"compare": second.pk, "correct": "differ"}).content.decode()
    # v1 answered 3 of 4, v2 2 of 4: they differ on document 2 only.
    assert re.findall(r'data-sample="(\d+)" data-run="(\d+)"', paired) == [
        ("2", str(first.pk)), ("2", str(second.pk))]
    assert "answer 2 of v1" in paired and "answer 2 of v2" in paired


def test_the_run_page_shows_results_and_its_job(signed_in, catalog):
    run = catalog.alpha.runs[0]
    page = signed_in(catalog.world.alpha_member).get(
        reverse("frontend:evaluation-run", args=[run.pk])).content.decode()
    assert 'data-result="alpha-mc:acc"' in page and 'data-result="alpha-ppl:word_perplexity"' \
        in page
    # The leaderboard's metric first.
    assert page.index('data-result="alpha-mc:acc"') < page.index('data-result="alpha-mc:acc_norm"')
    assert 'data-state="succeeded"' in page
    assert "hx-trigger" not in page.split('id="run-status"')[1].split(">")[0]


def test_the_deployment_page(signed_in, catalog):
    deployment = catalog.alpha.deployment
    page = html.unescape(signed_in(catalog.world.alpha_member).get(
        reverse("frontend:deployment", args=[deployment.pk])).content.decode())
    assert 'data-state="ready"' in page
    assert 'data-replica="0" data-ready="true"' in page
    assert reverse("frontend:job", args=[deployment.replica_set.get().job_id]) in page
    assert "curl http://testserver/v1/chat/completions" in page
    assert 'base_url="http://testserver/v1"' in page and "alpha-chat" in page
    # Counts are lines over the hour (zero where nothing came); latencies exist only for the
    # one minute with requests: a dot, no line.
    for series in ("requests", "errors", "prompt", "completion"):
        assert f'data-series="{series}"' in page, series
    for series in ("p50", "p99", "mean"):
        assert f'data-series="{series}"' not in page, series
    assert "· 10 in all" in page and "· 500 in all" in page
    # The minute's percentiles from the histogram: 9 of 10 requests in the 25-50 ms bucket
    # (the 5th of them at 25 + 25 * 5/9 ms), one in 250-500 ms (the 99th percentile 90% into it).
    assert "p50: 38.89 latency (ms)" in page
    assert "p99: 475 latency (ms)" in page
    assert "mean: 76 latency (ms)" in page
    assert "hx-trigger" not in page.split('id="deployment-status"')[1].split(">")[0]
    assert "No request has waited for a replica to start." in page


def test_the_deployment_page_shows_its_cold_starts(signed_in, catalog):
    deployment = catalog.alpha.deployment
    DeploymentStat.objects.filter(deployment=deployment).update(cold_starts=2,
                                                                 cold_start_ms_max=8421.6)
    page = html.unescape(signed_in(catalog.world.alpha_member).get(
        reverse("frontend:deployment", args=[deployment.pk])).content.decode())
    assert "· 2 in the last hour" in page
    assert "Last cold start: a request waited 8,422 ms for a replica, 2" in page
    assert "longest wait: 8,422 wait (ms)" in page


def test_the_playground_lists_ready_deployments(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    page = client.get(reverse("frontend:playground")).content.decode()
    assert f'value="alpha/alpha-chat" data-version="{catalog.alpha.trained.pk}"' in page
    assert 'data-endpoint="/v1/chat/completions"' in page
    assert "frontend/playground.js" in page and "data-vote" in page
    replica = catalog.alpha.deployment.replica_set.get()
    replica.ready = False
    replica.save()
    assert "No model is deployed" in client.get(reverse("frontend:playground")).content.decode()


def test_an_embedding_deployment_shows_how_to_embed_and_stays_out_of_the_playground(
        signed_in, catalog, tmp_path):
    folder = tmp_path / "minilm"
    folder.mkdir()
    (folder / "modules.json").write_text("[]")  # a sentence-transformers folder
    ModelVersion.objects.filter(pk=catalog.alpha.trained.pk).update(artifact_path=str(folder))
    client = signed_in(catalog.world.alpha_member)
    page = html.unescape(client.get(
        reverse("frontend:deployment", args=[catalog.alpha.deployment.pk])).content.decode())
    assert "curl http://testserver/v1/embeddings" in page
    assert 'client.embeddings.create(model="alpha-chat"' in page
    assert "chat/completions" not in page
    assert "No model is deployed" in client.get(reverse("frontend:playground")).content.decode()


def test_a_deployment_is_created_scaled_and_stopped_from_its_pages(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    made = catalog.alpha
    response = client.post(reverse("frontend:deployment-create"), {
        "version": made.imported.pk, "name": "second", "queue": catalog.farm.queues["alpha"].pk,
        "runtime": "transformers", "replicas": 2, "gpus_per_replica": 0, "cpu_per_replica": 1,
        "memory_mib_per_replica": 2048, "idle_timeout_s": 0})
    deployment = Deployment.objects.get(tenant=catalog.world.alpha, name="second")
    assert response.status_code == 302
    assert response["Location"] == reverse("frontend:deployment", args=[deployment.pk])
    assert deployment.replicas == 2 and deployment.version == made.imported
    taken = client.post(reverse("frontend:deployment-create"), {
        "version": made.imported.pk, "name": "second", "queue": catalog.farm.queues["alpha"].pk,
        "runtime": "transformers", "replicas": 1, "gpus_per_replica": 0, "cpu_per_replica": 1,
        "memory_mib_per_replica": 2048, "idle_timeout_s": 0})
    assert taken.status_code == 400
    assert "second" in str(taken.context["form"].errors["name"])
    client.post(reverse("frontend:deployment-scale", args=[deployment.pk]), {"replicas": 1})
    deployment.refresh_from_db()
    assert deployment.replicas == 1
    client.post(reverse("frontend:deployment-stop", args=[deployment.pk]))
    deployment.refresh_from_db()
    assert not deployment.active
    client.post(reverse("frontend:deployment-delete", args=[deployment.pk]))
    assert not Deployment.objects.filter(pk=deployment.pk).exists()


def test_a_pool_is_made_from_the_form_and_its_page_lists_its_models(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    made = catalog.alpha
    form = {"version": made.imported.pk, "name": "family",
            "queue": catalog.farm.queues["alpha"].pk, "runtime": "transformers", "replicas": 1,
            "gpus_per_replica": 0, "cpu_per_replica": 1, "memory_mib_per_replica": 2048,
            "idle_timeout_s": 0, "max_loras": 4}
    for pool, words in (("other", "write NAME=VERSION"),
                        # Another tenant's version is not offered: not found, like a missing one.
                        ("theirs=beta-llama:v1", "no ready version beta-llama:v1"),
                        ("first=alpha-llama:v1\nfirst=alpha-llama:v1", "used twice")):
        refused = client.post(reverse("frontend:deployment-create"), {**form, "pool": pool})
        assert refused.status_code == 400
        assert words in str(refused.context["form"].errors["pool"])
    assert not Deployment.objects.filter(name="family").exists()

    response = client.post(reverse("frontend:deployment-create"),
                           {**form, "pool": "first=alpha-llama:v1\n"})
    assert response.status_code == 302
    deployment = Deployment.objects.get(name="family")
    assert [(m.name, m.version) for m in deployment.members.all()] == [("first", made.trained)]
    assert deployment.max_loras == 4
    page = client.get(reverse("frontend:deployment", args=[deployment.pk])).content.decode()
    assert 'data-member="family"' in page and 'data-member="first"' in page
    assert "no replica yet: the next request loads it" in page


def test_an_import_outside_the_allowed_roots_is_refused_on_the_form(signed_in, catalog,
                                                                     tmp_path):
    response = signed_in(catalog.world.alpha_member).post(reverse("frontend:model-import"), {
        "model_name": "elsewhere", "source_path": str(tmp_path / "nowhere")})
    assert response.status_code == 400
    assert response.context["form"].errors["source_path"]
    assert not ModelImport.objects.filter(model__name="elsewhere").exists()


def test_a_benchmark_is_uploaded_from_its_page(signed_in, catalog):
    client = signed_in(catalog.world.alpha_member)
    lines = b"".join(json.dumps({"text": f"Some held-out text number {n}."}).encode() + b"\n"
                     for n in range(5))
    response = client.post(reverse("frontend:benchmarks"), {
        "name": "held-out", "kind": "perplexity", "text_field": "text", "few_shot": 0,
        "file": ContentFile(lines, name="held-out.jsonl")})
    assert response.status_code == 302, response.content.decode()[:2000]
    benchmark = Benchmark.objects.get(tenant=catalog.world.alpha, name="held-out")
    assert benchmark.documents == 5
    listing = client.get(reverse("frontend:benchmarks")).content.decode()
    assert 'data-benchmark="held-out"' in listing


def test_an_evaluation_is_started_from_its_form(signed_in, catalog, tmp_path):
    client = signed_in(catalog.world.alpha_member)
    made = catalog.alpha
    # The service looks for the version's config; the job itself runs on the fake cluster.
    folder = tmp_path / made.trained.artifact_path
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    questions = b"".join(json.dumps({"question": f"{n}+1?", "choices": [str(n), str(n + 1)],
                                     "label": 1}).encode() + b"\n" for n in range(4))
    arithmetic = benchmark_create(actor=catalog.world.alpha_member, tenant=catalog.world.alpha,
                                  name="arithmetic", kind=BenchmarkKind.MULTIPLE_CHOICE,
                                  data=questions, prompt_template="{{question}}",
                                  choices_template="{{choices}}", target_template="{{label}}")
    response = client.post(reverse("frontend:evaluation-start"), {
        "version": made.trained.pk, "benchmarks": [arithmetic.pk],
        "queue": catalog.farm.queues["alpha"].pk, "limit": 2, "gpus": 0})
    assert response.status_code == 302, response.context["form"].errors
    run = EvaluationRun.objects.filter(tenant=catalog.world.alpha) \
        .exclude(pk__in=[run.pk for run in made.runs]).get()
    assert response.status_code == 302
    assert response["Location"] == reverse("frontend:evaluation-run", args=[run.pk])
    assert run.version == made.trained and run.limit == 2
    page = client.get(response["Location"]).content.decode()
    assert f'href="{reverse("frontend:job", args=[run.job_id])}"' in page
    assert 'hx-trigger="every 2s"' in page
