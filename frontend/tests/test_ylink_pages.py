"""The toolchain pages (L3) on a fake cluster: datasets (uploads, statistics, samples), the
pipeline builder, pipeline and training runs; who sees what, and query counts."""

import io
import json
import re
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse
from django.utils import timezone

from aistation.choices import JobState
from ylink import storage
from ylink.choices import VersionFormat
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingMetric, TrainingRun
from ylink.services.datasets import dataset_create, dataset_upload
from ylink.services.demo import DEMO_DATASET
from ylink.services.pipelines import pipeline_run_start
from ylink.services.training import training_run_start
from ylink.steps import DEFAULT_PIPELINE

HTMX = {"HTTP_HX_REQUEST": "true"}


def jsonl(*texts: str) -> bytes:
    return "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()


CORPUS = jsonl(*(f"Document number {number} of the corpus, with a few words in it." * (number + 1)
                 for number in range(12)))


def _upload(actor, tenant, name, content=CORPUS, filename="corpus.jsonl"):
    dataset = dataset_create(actor=actor, tenant=tenant, name=name)
    return dataset_upload(actor=actor, dataset=dataset, upload=ContentFile(content, name=filename))


def _token_version(dataset) -> DatasetVersion:
    """A token-shard version recorded directly: pretraining only reads its figures here."""
    return DatasetVersion.objects.create(
        dataset=dataset, number=dataset.versions.count() + 1, format=VersionFormat.TOKENS,
        path=f"datasets/test/{dataset.pk}-tokens", content_hash="b" * 64, documents=12,
        bytes=4000, tokens=4100, stats={"seq_len": 64, "vocab_size": 257, "eos_id": 256})


def _pretrain(member, queue, version, **extra) -> TrainingRun:
    return training_run_start(
        actor=member, dataset_version=version, queue=queue, kind="pretrain",
        name=extra.pop("name", "tiny-gpt"), model={"preset": "tiny", "architecture": "gpt2"},
        training={"max_steps": 100, "checkpoint_every": 50}, memory_mib=4096, **extra)


@pytest.fixture
def toolchain(farm, settings, tmp_path):
    """A dataset, a pipeline run and a pretraining run in each of alpha and beta."""
    settings.DATA_DIR = tmp_path
    made = {}
    for tenant, member in ((farm.world.alpha, farm.world.alpha_member),
                           (farm.world.beta, farm.world.beta_member)):
        version = _upload(member, tenant, f"{tenant.name}-corpus")
        queue = farm.queues[tenant.name]
        pipeline = pipeline_run_start(actor=member, version=version, steps=DEFAULT_PIPELINE,
                                      queue=queue, name=f"{tenant.name}-clean")
        tokens = _token_version(version.dataset)
        training = _pretrain(member, queue, tokens, name=f"{tenant.name}-tiny-gpt")
        made[tenant.name] = SimpleNamespace(version=version, dataset=version.dataset,
                                            pipeline=pipeline, tokens=tokens, training=training)
    return SimpleNamespace(farm=farm, world=farm.world, alpha=made["alpha"], beta=made["beta"])


def _pages(made) -> dict[str, tuple[str, dict]]:
    return {
        "datasets": (reverse("frontend:datasets"), {}),
        "dataset": (reverse("frontend:dataset", args=[made.dataset.pk]), {}),
        "dataset-samples": (reverse("frontend:dataset", args=[made.dataset.pk]),
                            {"part": "samples", "offset": "2", "limit": "3"}),
        "pipeline-runs": (reverse("frontend:pipeline-runs"), {}),
        "pipeline-run": (reverse("frontend:pipeline-run", args=[made.pipeline.pk]), {}),
        "pipeline-run-status": (reverse("frontend:pipeline-run", args=[made.pipeline.pk]),
                                {"part": "status"}),
        "training-runs": (reverse("frontend:training-runs"), {}),
        "training-run": (reverse("frontend:training-run", args=[made.training.pk]), {}),
        "training-run-status": (reverse("frontend:training-run", args=[made.training.pk]),
                                {"part": "status"}),
    }


WRITE_PAGES = {
    "dataset-create": "frontend:dataset-create",
    "pipeline-builder": "frontend:pipeline-builder",
    "training-run-start": "frontend:training-run-start",
}


# Who may open the pages ---------------------------------------------------------------------

def test_every_page_renders_for_a_member(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    for name, (url, params) in _pages(toolchain.alpha).items():
        response = client.get(url, params)
        assert response.status_code == 200, name
    for name, url_name in WRITE_PAGES.items():
        response = client.get(reverse(url_name))
        assert response.status_code == 200, name
        assert 'class="sidebar"' in response.content.decode()


def test_viewers_read_but_cannot_start_anything(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_viewer)
    for name, (url, params) in _pages(toolchain.alpha).items():
        assert client.get(url, params).status_code == 200, name
    for name, url_name in WRITE_PAGES.items():
        assert client.get(reverse(url_name)).status_code == 403, name
    dataset = toolchain.alpha.dataset
    upload = client.post(reverse("frontend:dataset-upload", args=[dataset.pk]),
                         {"file": ContentFile(CORPUS, name="more.jsonl")})
    assert upload.status_code == 403
    assert dataset.versions.count() == 2
    page = client.get(reverse("frontend:dataset", args=[dataset.pk])).content.decode()
    assert "data-upload" not in page and "data-run-pipeline" not in page
    run_page = client.get(reverse("frontend:pipeline-run", args=[toolchain.alpha.pipeline.pk]))
    assert b"Cancel run" not in run_page.content


def test_navigation_has_the_toolchain_pages(signed_in, toolchain):
    response = signed_in(toolchain.world.alpha_member).get(
        reverse("frontend:pipeline-run", args=[toolchain.alpha.pipeline.pk]))
    sections = {section.label: [(link.label, link.active) for link in section.links]
                for section in response.context["nav_sections"]}
    assert sections["Toolchain"] == [("Datasets", False), ("Pipelines", True),
                                     ("Training", False)]
    assert [section.layer for section in response.context["nav_sections"]].count("L3") == 1


def test_nothing_of_another_tenant_shows_or_can_be_touched(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    beta = toolchain.beta
    for name, (url, params) in _pages(beta).items():
        if name in ("datasets", "pipeline-runs", "training-runs"):
            content = client.get(url, {**params, "tenant": "beta"}).content.decode()
            assert "beta-" not in content, name
            assert "alpha-" in content, name
        else:
            assert client.get(url, params).status_code == 404, name
    posts = [
        (reverse("frontend:dataset-upload", args=[beta.dataset.pk]),
         {"file": ContentFile(CORPUS, name="x.jsonl")}),
        (reverse("frontend:pipeline-run-cancel", args=[beta.pipeline.pk]), {}),
        (reverse("frontend:training-run-cancel", args=[beta.training.pk]), {}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code == 404, url
    for url, params in [
        (reverse("frontend:pipeline-builder"), {"version": beta.version.pk}),
        (reverse("frontend:pipeline-builder"), {"from": beta.pipeline.pk}),
        (reverse("frontend:training-run-start"), {"version": beta.tokens.pk}),
        (reverse("frontend:training-run-start"), {"base": beta.training.pk}),
    ]:
        assert client.get(url, params).status_code == 404, params
    assert beta.dataset.versions.count() == 2
    beta.pipeline.job.refresh_from_db()
    assert beta.pipeline.job.state != JobState.CANCELLED
    # Nor through the builder's choices: beta's version is not one of them.
    response = client.post(reverse("frontend:pipeline-builder"), {
        "action": "run", "version": beta.version.pk, "queue": toolchain.farm.queues["alpha"].pk,
        "replicas": 1, "cpu": 1, "memory_mib": 2048, "steps-count": 1,
        "steps-0-type": "normalize"})
    assert response.status_code == 400
    assert "version" in response.context["form"].errors
    assert PipelineRun.objects.filter(input_version=beta.version).count() == 1


# Datasets ----------------------------------------------------------------------------------

def test_creating_a_dataset_then_uploading_makes_a_version(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    response = client.post(reverse("frontend:dataset-create"),
                           {"name": "notes", "kind": "text", "description": "Field notes"})
    dataset = Dataset.objects.get(tenant=toolchain.world.alpha, name="notes")
    assert response.status_code == 302
    assert response.url == reverse("frontend:dataset", args=[dataset.pk])
    taken = client.post(reverse("frontend:dataset-create"), {"name": "notes", "kind": "text"})
    assert taken.status_code == 200
    assert "already has a dataset" in " ".join(taken.context["form"].errors["name"])

    text = "A plain text file becomes one document of the version. " * 5
    response = client.post(reverse("frontend:dataset-upload", args=[dataset.pk]),
                           {"file": ContentFile(text.encode(), name="notes.txt")})
    version = dataset.versions.get()
    assert response.status_code == 302
    assert response.url == f"{reverse('frontend:dataset', args=[dataset.pk])}?version=1"
    assert (version.documents, version.source) == (1, "notes.txt")
    page = client.get(response.url).content.decode()
    row = page.split('data-version="1"')[1].split("</tr>")[0]
    assert "notes.txt" in row and version.content_hash[:12] in row
    assert "v1: 1 documents from notes.txt" in page
    assert text.strip()[:40] in page  # the sample browser


def test_a_bad_upload_shows_why_and_keeps_nothing(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    dataset = toolchain.alpha.dataset
    staging = storage.data_root() / "datasets" / ".staging"
    for name, content, message in [
        ("broken.zip", b"this is not a zip", "broken.zip: not a zip file."),
        ("lines.jsonl", b'{"text": "fine"}\n{"body": "no text"}\n',
         "lines.jsonl line 2: no string field 'text'."),
    ]:
        response = client.post(reverse("frontend:dataset-upload", args=[dataset.pk]),
                               {"file": ContentFile(content, name=name)})
        assert response.status_code == 400
        assert response.context["upload_form"].errors["file"] == [message]
        upload_card = response.content.decode().split("data-upload")[1].split("</form>")[0]
        assert f'<p class="field-error">{message}' in upload_card.replace("&#x27;", "'")
    assert dataset.versions.count() == 2
    assert not staging.exists() or not any(staging.iterdir())


def test_an_escaping_zip_is_refused(signed_in, toolchain):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../evil.txt", "A document that wants to live elsewhere.")
    response = signed_in(toolchain.world.alpha_member).post(
        reverse("frontend:dataset-upload", args=[toolchain.alpha.dataset.pk]),
        {"file": ContentFile(buffer.getvalue(), name="evil.zip")})
    assert response.status_code == 400
    assert response.context["upload_form"].errors["file"]
    assert toolchain.alpha.dataset.versions.count() == 2


def test_the_dataset_page_shows_statistics_histogram_and_pages_samples(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    version = toolchain.alpha.version
    url = reverse("frontend:dataset", args=[version.dataset_id])
    page = client.get(url, {"version": version.number}).content.decode()
    facts = page.split("data-version-facts")[1].split("</section>")[0]
    assert "12" in facts and version.content_hash[:16] in facts
    chart = page.split('data-chart="length-histogram"')[1].split("</svg>")[0]
    bins = [item for item in version.stats["length_histogram"] if item["documents"]]
    bars = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', chart)
    assert [title.split(":")[1] for title in bars] == \
        [f" {item['documents']} documents" for item in bins]
    assert sum(item["documents"] for item in bins) == 12
    assert f"?version={version.number}&amp;part=samples&amp;offset=5" in page  # next page
    assert 'hx-target="#samples"' in page
    assert f'href="{reverse("frontend:pipeline-builder")}?version={version.pk}"' in page

    part = client.get(url, {"version": version.number, "part": "samples", "offset": "10",
                            "limit": "5"}, **HTMX).content.decode()
    assert part.startswith("{#") is False and 'id="samples"' in part
    assert "<html" not in part
    assert re.findall(r'data-sample="(\d+)"', part) == ["10", "11"]
    assert "11\N{EN DASH}12 of 12" in part
    assert 'rel="next"' not in part and 'rel="prev"' in part  # the last page


def test_the_token_version_links_to_training_not_pipelines(signed_in, toolchain):
    tokens = toolchain.alpha.tokens
    page = signed_in(toolchain.world.alpha_member).get(
        reverse("frontend:dataset", args=[tokens.dataset_id]), {"version": tokens.number})
    content = page.content.decode()
    assert "data-run-pipeline" not in content
    assert f"{reverse('frontend:training-run-start')}?version={tokens.pk}" in content


def test_the_demo_button_runs_the_demo_pipeline(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    assert b"data-demo" not in client.get(reverse("frontend:datasets")).content
    _upload(toolchain.world.alpha_member, toolchain.world.alpha, DEMO_DATASET)
    assert b"data-demo" in client.get(reverse("frontend:datasets")).content
    response = client.post(reverse("frontend:dataset-demo"))
    run = PipelineRun.objects.get(name="demo-pipeline")
    assert response.status_code == 302
    assert response.url == reverse("frontend:pipeline-run", args=[run.pk])
    assert run.tenant == toolchain.world.alpha and run.then_train["kind"] == "pretrain"
    assert [step["type"] for step in run.steps] == [step["type"] for step in DEFAULT_PIPELINE]


# The pipeline builder ------------------------------------------------------------------------

def _builder_post(toolchain, steps: list[tuple[str, dict]], action="run", **extra):
    data = {"action": action, "version": toolchain.alpha.version.pk,
            "queue": toolchain.farm.queues["alpha"].pk, "replicas": 1, "cpu": 1,
            "memory_mib": 2048, "steps-count": len(steps), **extra}
    for index, (step_type, params) in enumerate(steps):
        data[f"steps-{index}-type"] = step_type
        data |= {f"steps-{index}-{name}": value for name, value in params.items()}
    return data


def test_the_builder_starts_from_the_default_pipeline_with_every_parameter(signed_in, toolchain):
    response = signed_in(toolchain.world.alpha_member).get(
        reverse("frontend:pipeline-builder"), {"version": toolchain.alpha.version.pk})
    cards = response.context["cards"]
    assert [card.type for card in cards] == [step["type"] for step in DEFAULT_PIPELINE]
    content = response.content.decode()
    minhash = content.split('data-type="minhash_dedup"')[1].split("</li>")[0]
    assert 'name="steps-7-num_buckets" value="20"' in minhash
    assert "LSH bands." in minhash and "Default 20." in minhash
    assert response.context["form"].initial["version"] == toolchain.alpha.version.pk


def test_the_builder_shows_each_step_error_beside_its_field(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    runs = PipelineRun.objects.count()
    response = client.post(reverse("frontend:pipeline-builder"), _builder_post(toolchain, [
        ("normalize", {}),
        ("length_filter", {"min_chars": "500", "max_chars": "100"}),
        ("minhash_dedup", {"num_buckets": "999", "n_grams": "four"}),
    ]))
    assert response.status_code == 400
    assert PipelineRun.objects.count() == runs
    content = response.content.decode()
    step = content.split('data-step="2"')[1].split("</li>")[0]
    buckets = step.split('data-param="num_buckets"')[1].split('data-param=')[0]
    assert "Must be between 1 and 256" in buckets and "has-error" in step
    grams = step.split('data-param="n_grams"')[1].split('data-param=')[0]
    assert "Must be an integer" in grams and 'value="four"' in grams
    lengths = content.split('data-step="1"')[1].split("</li>")[0]
    assert "Must be at least min_chars (500)" in \
        lengths.split('data-param="max_chars"')[1].split("</div>")[0]
    assert 'value="500"' in lengths  # what was typed stays
    first = content.split('data-step="0"')[1].split("</li>")[0]
    assert "field-error" not in first


def test_step_order_errors_show_on_the_step(signed_in, toolchain):
    response = signed_in(toolchain.world.alpha_member).post(
        reverse("frontend:pipeline-builder"),
        _builder_post(toolchain, [("tokenize", {}), ("normalize", {})], action="check"))
    assert response.status_code == 400
    step = response.content.decode().split('data-step="0"')[1].split("</li>")[0]
    assert "Tokenize must be the last step" in step


def test_the_step_buttons_add_move_and_remove(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    url = reverse("frontend:pipeline-builder")
    steps = [("normalize", {"unicode_form": "NFKC"}), ("pii", {}), ("tokenize", {})]

    def types(response):
        assert response.status_code == 200
        return [card.type for card in response.context["cards"]]

    added = client.post(url, _builder_post(toolchain, steps, action="add",
                                           add_type="exact_dedup"))
    assert types(added) == ["normalize", "pii", "exact_dedup", "tokenize"]
    assert added.context["cards"][0].params[0].value == "NFKC"  # kept as typed
    assert not added.context["form"].errors
    assert types(client.post(url, _builder_post(toolchain, steps, action="up:1"))) == \
        ["pii", "normalize", "tokenize"]
    assert types(client.post(url, _builder_post(toolchain, steps, action="down:0"))) == \
        ["pii", "normalize", "tokenize"]
    assert types(client.post(url, _builder_post(toolchain, steps, action="remove:1"))) == \
        ["normalize", "tokenize"]
    assert types(client.post(url, _builder_post(toolchain, steps, action="defaults"))) == \
        [step["type"] for step in DEFAULT_PIPELINE]
    assert PipelineRun.objects.filter(tenant=toolchain.world.alpha).count() == 1


def test_the_builder_starts_a_run_with_typed_parameters(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    checked = client.post(reverse("frontend:pipeline-builder"), _builder_post(
        toolchain, [("length_filter", {"min_chars": "50"}), ("pii", {"emails": "false"})],
        action="check"))
    assert checked.status_code == 200 and b"data-checked" in checked.content
    response = client.post(reverse("frontend:pipeline-builder"), _builder_post(
        toolchain, [("length_filter", {"min_chars": "50"}),
                    ("pii", {"emails": ["false"], "phones": ["false", "true"]})],
        name="short-ones", replicas=2))
    run = PipelineRun.objects.get(name="short-ones")
    assert response.status_code == 302
    assert response.url == reverse("frontend:pipeline-run", args=[run.pk])
    assert run.steps[0]["params"]["min_chars"] == 50
    assert run.steps[0]["params"]["max_chars"] == 1_000_000  # the default, filled in
    assert (run.steps[1]["params"]["emails"], run.steps[1]["params"]["phones"]) == (False, True)
    assert run.replicas == 2 and run.job.replicas == 2
    again = client.get(reverse("frontend:pipeline-builder"), {"from": run.pk})
    assert [card.type for card in again.context["cards"]] == ["length_filter", "pii"]
    assert again.context["form"].initial["replicas"] == 2


# Pipeline runs -------------------------------------------------------------------------------

STEP_RESULTS = [
    {"index": 0, "type": "normalize", "docs_in": 12, "docs_out": 12, "bytes_in": 9000,
     "bytes_out": 8800, "dropped": {}, "samples": [], "seconds": 0.4},
    {"index": 1, "type": "length_filter", "docs_in": 12, "docs_out": 9, "bytes_in": 8800,
     "bytes_out": 8500, "dropped": {"too_short": 3}, "seconds": 0.2,
     "samples": [{"reason": "too_short", "text": "tiny <b>doc</b>"}]},
    {"index": 6, "type": "exact_dedup", "docs_in": 9, "docs_out": 7, "bytes_in": 8500,
     "bytes_out": 7000, "dropped": {"duplicate": 2}, "samples": [], "seconds": 1.5},
]


def test_the_run_page_shows_counts_funnel_and_samples_per_step(signed_in, toolchain):
    run = toolchain.alpha.pipeline
    run.step_results = STEP_RESULTS
    run.save()
    client = signed_in(toolchain.world.alpha_member)
    content = client.get(reverse("frontend:pipeline-run", args=[run.pk])).content.decode()
    table = content.split("data-step-results")[1].split("</table>")[0]
    row = table.split('<tr data-step="1">')[1].split("</tr>")[0]
    assert re.search(r"data-docs-in>12<", row) and re.search(r"data-docs-out>9<", row)
    assert 'data-reason="too_short">too_short: 3<' in row
    dedup = table.split('<tr data-step="6">')[1].split("</tr>")[0]
    assert "data-docs-out>7<" in dedup and "duplicate: 2" in dedup
    waiting = table.split('<tr data-step="2">')[1].split("</tr>")[0]
    assert "not reported yet" in waiting
    assert "<details" in table and "tiny &lt;b&gt;doc&lt;/b&gt;" in table  # escaped
    funnel = content.split('data-chart="funnel"')[1].split("</svg>")[0]
    assert funnel.count('class="funnel-step"') == 3
    assert "12 → 9 (3 dropped)" in funnel
    assert "Documents kept" not in content  # not every step has reported
    assert 'hx-trigger="every 2s"' in content  # still running: it polls
    assert f'href="/jobs/{run.job_id}/"' in content


def test_a_finished_run_links_its_output_and_stops_polling(signed_in, toolchain):
    run = toolchain.alpha.pipeline
    output = DatasetVersion.objects.create(
        dataset=run.input_version.dataset, number=9, format=VersionFormat.JSONL,
        path="datasets/x", content_hash="c" * 64, documents=7, bytes=7000,
        parent=run.input_version, pipeline_run=run)
    run.output_version, run.succeeded, run.finished_at = output, True, timezone.now()
    run.step_results = [
        {"index": index, "type": step["type"], "docs_in": 12 - min(index, 5),
         "docs_out": 12 - min(index + 1, 5), "bytes_in": 1000, "bytes_out": 900,
         "dropped": {"some_reason": 1} if index < 5 else {}, "samples": [], "seconds": 0.1}
        for index, step in enumerate(run.steps)]
    run.save()
    client = signed_in(toolchain.world.alpha_member)
    status = client.get(reverse("frontend:pipeline-run", args=[run.pk]), {"part": "status"},
                        **HTMX).content.decode()
    assert "<html" not in status and "every 2s" not in status
    assert '?version=9" data-lineage="output"' in status
    assert "Cancel run" not in status
    assert "Documents kept</dt><dd>7 of 12" in status
    dataset_page = client.get(reverse("frontend:dataset", args=[output.dataset_id]),
                              {"version": 9}).content.decode()
    row = dataset_page.split('data-version="9"')[1].split("</tr>")[0]
    assert f"pipeline run {run.pk}" in row and f"?version={run.input_version.number}" in row


def test_cancelling_a_pipeline_run_stops_its_job(signed_in, toolchain):
    run = toolchain.alpha.pipeline
    response = signed_in(toolchain.world.alpha_member).post(
        reverse("frontend:pipeline-run-cancel", args=[run.pk]), follow=True)
    run.job.refresh_from_db()
    assert run.job.state == JobState.CANCELLED
    assert b'data-state="cancelled"' in response.content
    assert b"cancelled; its job is being stopped" in response.content


# Training ------------------------------------------------------------------------------------

def test_the_run_page_draws_the_loss_curve_from_metrics(signed_in, toolchain):
    run = toolchain.alpha.training
    now = timezone.now()
    for number in range(1, 21):
        TrainingMetric.objects.create(run=run, step=number * 5, loss=6.0 - number * 0.2,
                                      lr=3e-4, tokens=number * 4096,
                                      tokens_per_s=1000.0 + number, reported_at=now)
    run.step, run.loss, run.lr, run.tokens, run.tokens_per_s, run.eta_s = \
        100, 2.0, 3e-4, 81920, 1020.0, 0.0
    run.step, run.total_steps, run.eta_s = 50, 100, 125.0
    run.resumed_from_step = 50
    run.save()
    client = signed_in(toolchain.world.alpha_member)
    content = client.get(reverse("frontend:training-run", args=[run.pk])).content.decode()
    chart = content.split('data-chart="loss"')[1].split("</svg>")[0]
    points = re.search(r'<polyline class="line" points="([^"]+)"', chart)[1].split()
    assert len(points) == 20
    heights = [float(point.split(",")[1]) for point in points]
    assert heights == sorted(heights)  # the loss falls, so the line goes down the chart
    assert ">2<" in chart  # the last reading
    assert "20 logged steps" in content
    assert '<polyline class="line"' in content.split('data-chart="throughput"')[1]
    assert "resumed from the checkpoint at step 50" in content
    assert 'aria-valuenow="50"' in content and "(50%)" in content
    assert "2m 05s" in content  # the ETA
    assert 'hx-trigger="every 2s"' in content


def test_the_status_part_has_checkpoints_and_the_result(signed_in, toolchain, tmp_path):
    run = toolchain.alpha.training
    (tmp_path / "step-50").mkdir()
    for step in (40, 50):  # the runner deleted step 40's folder: it is no longer listed
        run.checkpoints.create(step=step, path=str(tmp_path / f"step-{step}"),
                               bytes=3 * 2**20, created_at=timezone.now())
    run.succeeded, run.artifact, run.output_path, run.parameters = \
        True, "model", "/out/model", 612_345
    run.finished_at = timezone.now()
    run.save()
    client = signed_in(toolchain.world.alpha_member)
    status = client.get(reverse("frontend:training-run", args=[run.pk]), {"part": "status"},
                        **HTMX).content.decode()
    assert "<html" not in status and "every 2s" not in status
    assert '<tr data-checkpoint="50">' in status and "3.0\xa0MB" in status
    assert 'data-checkpoint="40"' not in status
    assert "/out/model" in status and "612,345" in status
    link = f'{reverse("frontend:training-run-start")}?base={run.pk}'
    assert link in status and "Fine-tune this model" in status
    start = client.get(reverse("frontend:training-run-start"), {"base": run.pk})
    assert start.context["form"].initial["base_run"] == run.pk
    assert start.context["form"].initial["kind"] == "lora"


def test_the_training_form_starts_a_run(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    response = client.post(reverse("frontend:training-run-start"), {
        **_training_form(toolchain), "name": "from-the-form", "max_steps": 30, "lr": "0.001"})
    run = TrainingRun.objects.get(name="from-the-form")
    assert response.status_code == 302
    assert response.url == reverse("frontend:training-run", args=[run.pk])
    assert run.spec["training"]["max_steps"] == 30 and run.spec["training"]["lr"] == 0.001
    assert run.spec["model"]["preset"] == "tiny" and run.total_steps == 30


def _training_form(toolchain, **changes) -> dict:
    form = {
        "kind": "pretrain", "name": "", "dataset_version": toolchain.alpha.tokens.pk,
        "preset": "tiny", "architecture": "gpt2", "vocab_size": 4096, "min_frequency": 2,
        "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "max_steps": 100,
        "batch_size": 8, "grad_accum": 1, "lr": "0.0003", "warmup_steps": 10,
        "checkpoint_every": 50, "log_every": 10, "precision": "auto", "distributed": "auto",
        "queue": toolchain.farm.queues["alpha"].pk, "gpus": 0, "gpu_model": "", "replicas": 1,
        "cpu": 1, "memory_mib": 4096, "max_restarts": 3,
    }
    return form | changes


def test_the_training_form_shows_service_errors_beside_fields(signed_in, toolchain):
    client = signed_in(toolchain.world.alpha_member)
    runs = TrainingRun.objects.count()
    too_big = client.post(reverse("frontend:training-run-start"),
                          _training_form(toolchain, preset="7b", gpus=1))
    assert too_big.status_code == 400
    errors = too_big.context["form"].errors
    assert list(errors) == ["gpus"]
    assert "preset 7b" in errors["gpus"][0] and "ask for at least 2 GPUs" in errors["gpus"][0]
    block = too_big.content.decode().split('for="id_gpus"')[1].split('<div class="field')[0]
    assert '<p class="field-error">preset 7b' in block
    wrong_data = client.post(reverse("frontend:training-run-start"),
                             _training_form(toolchain, dataset_version=toolchain.alpha.version.pk))
    assert "token shards" in " ".join(wrong_data.context["form"].errors["dataset_version"])
    lora = client.post(reverse("frontend:training-run-start"),
                       _training_form(toolchain, kind="lora",
                                      dataset_version=toolchain.alpha.version.pk))
    assert "needs an instruction dataset" in lora.context["form"].errors["dataset_version"][0]
    assert TrainingRun.objects.count() == runs


def test_cancelling_a_training_run_stops_its_job(signed_in, toolchain):
    run = toolchain.alpha.training
    signed_in(toolchain.world.alpha_member).post(
        reverse("frontend:training-run-cancel", args=[run.pk]))
    run.job.refresh_from_db()
    assert run.job.state == JobState.CANCELLED


# Query counts --------------------------------------------------------------------------------

@pytest.mark.parametrize(("page", "most"), [
    ("datasets", 8), ("pipeline-runs", 7), ("training-runs", 7),
])
def test_list_pages_pin_their_query_counts(signed_in, toolchain, django_assert_max_num_queries,
                                           page, most):
    member, tenant = toolchain.world.alpha_member, toolchain.world.alpha
    queue = toolchain.farm.queues["alpha"]
    version, tokens = toolchain.alpha.version, toolchain.alpha.tokens
    for number in range(26):
        if page == "datasets":
            dataset_create(actor=member, tenant=tenant, name=f"set-{number}")
        elif page == "pipeline-runs":
            pipeline_run_start(actor=member, version=version, steps=[{"type": "normalize"}],
                               queue=queue, name=f"run-{number}")
        else:
            _pretrain(member, queue, tokens, name=f"run-{number}")
    client = signed_in(member)
    with django_assert_max_num_queries(most):
        response = client.get(reverse(f"frontend:{page}"))
    content = response.content.decode()
    assert len(re.findall(r'data-(?:dataset|run)="\d+"', content)) == 25
    with django_assert_max_num_queries(most - 2):
        client.get(reverse(f"frontend:{page}"), {"page": "2"}, **HTMX)


@pytest.mark.parametrize(("page", "most"), [
    ("dataset", 9), ("pipeline-run", 6), ("training-run", 8),
])
def test_detail_pages_pin_their_query_counts(signed_in, toolchain, django_assert_max_num_queries,
                                             page, most):
    urls = {"dataset": reverse("frontend:dataset", args=[toolchain.alpha.dataset.pk]),
            "pipeline-run": reverse("frontend:pipeline-run", args=[toolchain.alpha.pipeline.pk]),
            "training-run": reverse("frontend:training-run", args=[toolchain.alpha.training.pk])}
    client = signed_in(toolchain.world.alpha_member)
    with django_assert_max_num_queries(most):
        assert client.get(urls[page]).status_code == 200


def test_the_builder_runs_a_pipeline_on_ray_and_says_where_a_cluster_cannot(
        signed_in, toolchain, monkeypatch):
    from podsys.drivers.fake import FakeDriver

    client = signed_in(toolchain.world.alpha_member)
    page = client.get(reverse("frontend:pipeline-builder"), {"version": toolchain.alpha.version.pk})
    assert 'name="executor"' in page.content.decode()
    response = client.post(reverse("frontend:pipeline-builder"), _builder_post(
        toolchain, [("length_filter", {})], name="on-ray", replicas=2, executor="ray"))
    assert response.status_code == 302, response.context["form"].errors
    run = PipelineRun.objects.get(name="on-ray")
    assert run.job.ray["workers"] == 2 and run.job.replicas == 3  # a head and 2 workers
    page = client.get(reverse("frontend:pipeline-run", args=[run.pk])).content.decode()
    assert "Ray workers" in page
    monkeypatch.setattr(FakeDriver, "unsupported", {"ray": "no Ray here"})
    refused = client.post(reverse("frontend:pipeline-builder"), _builder_post(
        toolchain, [("length_filter", {})], name="no-ray", executor="ray"))
    assert refused.status_code == 400
    assert "no Ray here" in refused.context["form"].errors["executor"][0]
    assert not PipelineRun.objects.filter(name="no-ray").exists()


def test_the_training_form_starts_prompt_tuning_with_its_settings(signed_in, toolchain):
    world = toolchain.world
    dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name="asks",
                             kind="instruction")
    rows = "".join(json.dumps({"prompt": "q", "response": "a", "task": task}) + "\n"
                   for task in ("a", "b"))
    version = dataset_upload(actor=world.alpha_member, dataset=dataset,
                             upload=ContentFile(rows.encode(), name="asks.jsonl"))
    base = TrainingRun.objects.filter(pk=toolchain.alpha.training.pk)
    Path(toolchain.alpha.training.spec["output_dir"]).mkdir(parents=True, exist_ok=True)
    base.update(succeeded=True, artifact="model", parameters=100_000,
                output_path=toolchain.alpha.training.spec["output_dir"])
    client = signed_in(world.alpha_member)
    response = client.post(reverse("frontend:training-run-start"), _training_form(
        toolchain, kind="multitask_prompt_tuning", dataset_version=version.pk,
        base_run=toolchain.alpha.training.pk, name="tuned", num_virtual_tokens=6,
        prompt_init="text", init_text="say the answer", num_ranks=2))
    assert response.status_code == 302, response.context["form"].errors
    run = TrainingRun.objects.get(name="tuned")
    settings = run.spec["prompt_tuning"]
    assert (settings["num_virtual_tokens"], settings["init"], settings["init_text"],
            settings["num_ranks"]) == (6, "text", "say the answer", 2)
    bad = client.post(reverse("frontend:training-run-start"), _training_form(
        toolchain, kind="prompt_tuning", dataset_version=version.pk,
        base_run=toolchain.alpha.training.pk, name="bad", num_virtual_tokens=0))
    assert bad.status_code == 400 and "num_virtual_tokens" in bad.context["form"].errors
    assert not TrainingRun.objects.filter(name="bad").exists()
