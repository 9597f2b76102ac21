"""`ogai dataset`, `ogai pipeline` and `ogai train` against the real API, served by `live_server`.

The CLI runs in-process (`main([...])`) with its URL and token from the environment. Runs are
jobs on the fake driver and no runner runs: between two polls of `-f` the test plays the runner
(its reports applied with `runner_events_apply`, its output files written) and moves the job
on (scheduling, the fake workload's exit, reconcile), in the test's thread, so nothing races.
"""

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from rich.console import Console

from aistation.choices import JobState
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from infra_os.services.tokens import api_token_create
from ogai_client import OgaiClient, cli
from ogai_client.ylink import train_argv
from podsys.drivers.fake import fake_cluster
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes
from ylink import storage
from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun
from ylink.services.runner_events import runner_events_apply

pytestmark = pytest.mark.django_db(transaction=True)

CLUSTER = "fake-ylink"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path, settings):
    """No real config or environment; the platform's files under tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)
    settings.DATA_DIR = str(tmp_path / "data")
    settings.OGAI_RETRY_BACKOFF_S = 0


@pytest.fixture
def cluster(world):
    cluster = Cluster.objects.create(name=CLUSTER, driver="fake",
                                     options={"nodes": 1, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    queue_create(actor=world.alpha_admin, tenant=world.alpha, name="default", cluster=cluster)
    return cluster


@pytest.fixture
def as_member(world, live_server, monkeypatch):
    monkeypatch.setenv("OGAI_URL", live_server.url)
    token = api_token_create(actor=world.alpha_member, name="test",
                             expires_at=timezone.now() + timedelta(days=1)).secret
    monkeypatch.setenv("OGAI_TOKEN", token)
    return world.alpha_member


def ogai(capsys, *argv, failure_is_an_error=True):
    """Run the CLI; returns (exit code, stdout, stderr). Every error is one stderr line."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0 and failure_is_an_error:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def write_corpus(path, documents):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    return path


DOCUMENTS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i} times."
             for i in range(25)]


@pytest.fixture
def corpus(as_member, cluster, capsys, tmp_path):
    """A dataset `corpus` with one version of 25 documents, uploaded through the CLI."""
    code, _, err = ogai(capsys, "dataset", "upload", write_corpus(tmp_path / "corpus.jsonl",
                                                                   DOCUMENTS), "--create")
    assert code == 0, err
    return DatasetVersion.objects.get()


# -- datasets -----------------------------------------------------------------------------------

def test_upload_creates_a_version_with_its_documents(as_member, cluster, capsys, tmp_path):
    path = write_corpus(tmp_path / "My Corpus.jsonl", DOCUMENTS)
    code, _, err = ogai(capsys, "dataset", "upload", path)
    assert code == 1
    assert "no dataset my-corpus" in err and "--create" in err
    assert not Dataset.objects.exists()

    code, out, err = ogai(capsys, "dataset", "upload", path, "--create")
    assert code == 0, err
    version = DatasetVersion.objects.get()
    assert version.dataset.name == "my-corpus"
    assert version.dataset.tenant.name == "alpha"
    assert version.documents == 25
    assert version.bytes == sum(len(text.encode()) for text in DOCUMENTS)
    assert f"uploaded my-corpus v1 (version {version.pk}): 25 documents" in out
    assert "created dataset my-corpus in alpha (text)" in err

    # A second upload is the next version of the same dataset.
    code, out, err = ogai(capsys, "dataset", "upload", write_corpus(tmp_path / "more.jsonl",
                                                                     DOCUMENTS[:3]),
                          "--dataset", "my-corpus", "--json")
    assert code == 0, err
    second = json.loads(out)
    assert (second["number"], second["documents"]) == (2, 3)

    code, out, err = ogai(capsys, "dataset", "show", "my-corpus")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("v1 ", "v2 "))}
    assert rows["v1"][1:4] == [str(version.pk), "jsonl", "25"]
    assert rows["v2"][3] == "3"
    assert "upload My Corpus.jsonl" in out
    assert "document lengths of my-corpus v2" in out
    # By id too.
    code, out2, _ = ogai(capsys, "dataset", "show", version.dataset_id)
    assert code == 0 and out2 == out

    code, out, err = ogai(capsys, "dataset", "list")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if "my-corpus" in line)
    assert row[2:5] == ["text", "2", "v2"]

    code, out, err = ogai(capsys, "dataset", "samples", version.pk, "--offset", 3, "-n", 2)
    assert code == 0, err
    assert DOCUMENTS[3] in out and DOCUMENTS[4] in out and DOCUMENTS[5] not in out
    assert "documents 3 to 4 of 25; --offset 5 for more" in err


def test_upload_shows_a_progress_bar_on_a_terminal(as_member, cluster, capsys, tmp_path,
                                                   monkeypatch):
    terminal = io.StringIO()

    class OnATerminal(cli.Context):
        def __init__(self):
            super().__init__()
            self.err = Console(file=terminal, force_terminal=True, width=120)

    monkeypatch.setattr(cli, "Context", OnATerminal)
    path = write_corpus(tmp_path / "corpus.jsonl", DOCUMENTS * 200)
    code, out, err = ogai(capsys, "dataset", "upload", path, "--create")
    assert code == 0, err
    assert "5,000 documents" in out
    assert "corpus.jsonl" in terminal.getvalue()
    assert "created dataset corpus" in terminal.getvalue()
    code, out, _ = ogai(capsys, "dataset", "upload", path, "--json")
    assert json.loads(out)["number"] == 2  # --json: no bar, the API's JSON alone


def test_the_sdk_streams_an_upload_and_reports_its_progress(as_member, cluster, tmp_path):
    path = write_corpus(tmp_path / "big.jsonl", [f"line {i} " * 40 for i in range(2000)])
    seen = []
    with OgaiClient.from_config() as client:
        dataset = client.create_dataset("big", description="progress")
        version = client.upload_dataset(dataset.id, path,
                                        on_progress=lambda sent, total: seen.append((sent,
                                                                                     total)))
        assert version.documents == 2000
        assert client.dataset_version(version.id).content_hash == version.content_hash
        assert client.find_dataset("big").versions == 1
        page = client.dataset_samples(version.id, offset=1999, limit=5)
        assert page.count == 2000 and [s.index for s in page.results] == [1999]
    size = path.stat().st_size
    assert size > 3 * 64 * 1024  # sent in several pieces
    assert len(seen) > 3
    assert seen[-1] == (size, size)
    assert [sent for sent, _ in seen] == sorted(sent for sent, _ in seen)


def test_a_bad_file_is_one_line_and_leaves_no_version(as_member, cluster, capsys, tmp_path):
    code, _, err = ogai(capsys, "dataset", "upload", tmp_path / "missing.jsonl", "--create")
    assert code == 1
    assert "cannot read" in err and "missing.jsonl" in err
    assert not Dataset.objects.exists()  # nothing created for a file that is not there

    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    code, out, err = ogai(capsys, "dataset", "upload", bad, "--create")
    assert code == 1 and not out
    assert err.startswith("error: file: corpus.jsonl line 2: not JSON"), err
    assert not DatasetVersion.objects.exists()
    assert not Dataset.objects.exists(), "a refused upload leaves no empty dataset behind"

    code, _, err = ogai(capsys, "dataset", "create", "corpus")
    assert code == 0, err
    code, _, err = ogai(capsys, "dataset", "upload", tmp_path / "corpus.jsonl", "--kind",
                        "instruction")
    assert code == 1 and "holds text data, not instruction" in err

    code, _, err = ogai(capsys, "dataset", "samples", 999999)
    assert code == 1 and "dataset version 999999 not found" in err
    code, _, err = ogai(capsys, "dataset", "show", "nope")
    assert code == 1 and "dataset nope not found" in err


# -- pipelines ----------------------------------------------------------------------------------

class Runner:
    """Plays a run's runner and its cluster, one scripted turn per pause of the CLI's `-f`:
    each turn is a list of events to report, or a callable."""

    def __init__(self, cluster, find_run, turns):
        self.cluster = cluster
        self.find_run = find_run
        self.turns = list(turns)
        self.pauses = 0

    def pause(self, seconds):
        self.pauses += 1
        assert self.pauses < 20, "the CLI did not stop following"
        run = self.find_run()
        turn = self.turns.pop(0) if self.turns else []
        if callable(turn):
            turn(run)
        elif turn:
            runner_events_apply(job=run.job, events=turn)
        reconcile_cluster(cluster=self.cluster)
        schedule_cluster(cluster_id=self.cluster.pk)



def job_exits(code):
    """A turn: the run's workload exits with `code` (reconcile then ends its job)."""
    def end(run):
        attempt = run.job.attempts.order_by("-number").first()
        fake_cluster(CLUSTER).crash(attempt.workload_id, exit_code=code)
    return end


def event(kind, **data):
    return {"kind": kind, "data": data}


def write_output(run):
    """What the data runner leaves in the run's output folder."""
    folder = storage.absolute(run.folder) / "output"
    folder.mkdir(parents=True, exist_ok=True)
    kept = DOCUMENTS[:20]
    (folder / "00000_00000.jsonl").write_text("".join(
        json.dumps({"id": str(i), "text": text, "metadata": {}}) + "\n"
        for i, text in enumerate(kept)))


def pipeline_spec(tmp_path, name="pipeline.yaml", **changes):
    spec = {"dataset": "corpus", "name": "clean",
            "steps": ["normalize", {"type": "exact_dedup"},
                      {"type": "length_filter", "params": {"min_chars": 10}}],
            "resources": {"cpu": 1, "memory": "1Gi"}}
    spec.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_pipeline_run_follow_prints_the_step_table_and_exits_0(corpus, cluster, capsys,
                                                                tmp_path, monkeypatch):
    steps = [
        event("data_step", index=0, type="normalize", docs_in=25, docs_out=25, bytes_in=1700,
              bytes_out=1650, dropped={}, samples=[], seconds=0.2),
        event("data_step", index=1, type="exact_dedup", docs_in=25, docs_out=22,
              bytes_in=1650, bytes_out=1450, dropped={"duplicate": 3},
              samples=[{"reason": "duplicate", "text": DOCUMENTS[0]}], seconds=0.1),
        event("data_step", index=2, type="length_filter", docs_in=22, docs_out=20,
              bytes_in=1450, bytes_out=1320, dropped={"too_short": 2}, samples=[],
              seconds=0.1),
    ]

    def finish(run):
        write_output(run)
        runner_events_apply(job=run.job, events=[
            *steps, event("done", output={"path": "x", "format": "jsonl", "documents": 20})])

    runner = Runner(cluster, lambda: PipelineRun.objects.get(), [
        [],  # the first pause schedules the job
        [event("started", attempt=1, world_size=1)],
        finish,
        job_exits(0),
    ])
    monkeypatch.setattr(cli, "_pause", runner.pause)
    code, out, err = ogai(capsys, "pipeline", "run", pipeline_spec(tmp_path), "-f")
    assert code == 0, err
    run = PipelineRun.objects.get()
    assert run.input_version == corpus
    assert [step["type"] for step in run.steps] == ["normalize", "exact_dedup",
                                                    "length_filter"]
    assert run.steps[2]["params"]["min_chars"] == 10
    assert run.job.memory_mib_per_replica == 1024
    assert out.startswith(f"pipeline run {run.pk} started: corpus v1 through 3 steps "
                          "(normalize, exact_dedup, length_filter)")
    assert f"pipeline run {run.pk}: queued" in err and f"pipeline run {run.pk}: running" in err
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["0"], ["1"], ["2"])}
    assert rows["normalize"][2:5] == ["25", "25", "100.0%"]
    assert rows["exact_dedup"][2:5] == ["25", "22", "88.0%"]
    assert "duplicate 3" in " ".join(rows["exact_dedup"])
    assert "too_short 2" in " ".join(rows["length_filter"])
    output = DatasetVersion.objects.get(number=2)
    assert output.parent == corpus and output.documents == 20
    assert out.splitlines()[-1] == (f"output: corpus v2 (version {output.pk}, jsonl): "
                                    f"20 documents, {output.bytes / 1024:.1f} KiB")

    code, out, err = ogai(capsys, "pipeline", "show", run.pk)
    assert code == 0, err
    assert "succeeded" in out and f"corpus v2 (version {output.pk})" in out
    assert "min_chars=10" in out
    assert "exact_dedup dropped (duplicate)" in out
    code, out, _ = ogai(capsys, "pipeline", "list", "--dataset", "corpus")
    assert "clean" in out and "corpus v1" in out and "corpus v2" in out
    code, out, _ = ogai(capsys, "pipeline", "list", "--json")
    assert json.loads(out)[0]["id"] == run.pk


def test_a_pipeline_that_fails_exits_1_saying_why(corpus, cluster, capsys, tmp_path,
                                                  monkeypatch):
    runner = Runner(cluster, lambda: PipelineRun.objects.get(), [
        [], [event("failed", message="replica 0: disk full under /work")],
        # The job is restarted twice (max_restarts 2) before it fails.
        job_exits(1), job_exits(1), job_exits(1)])
    monkeypatch.setattr(cli, "_pause", runner.pause)
    code, _, err = ogai(capsys, "pipeline", "run", pipeline_spec(tmp_path), "--follow",
                        failure_is_an_error=False)
    assert code == 1
    run = PipelineRun.objects.get()
    assert err.splitlines()[-1] == (f"error: pipeline run {run.pk} failed: replica 0: disk "
                                    "full under /work")
    assert run.job.attempts.count() == 3


def test_a_cancelled_pipeline_exits_1(corpus, cluster, capsys, tmp_path, monkeypatch):
    code, out, err = ogai(capsys, "pipeline", "run", pipeline_spec(tmp_path), "-q")
    assert code == 0, err
    run = PipelineRun.objects.get()
    assert out == f"{run.pk}\n"
    code, out, err = ogai(capsys, "pipeline", "cancel", run.pk)
    assert code == 0, err
    assert f"pipeline run {run.pk} cancelled" in out
    run.job.refresh_from_db()
    assert run.job.state == JobState.CANCELLED
    code, _, err = ogai(capsys, "pipeline", "cancel", run.pk)
    assert code == 1 and "already cancelled" in err
    code, _, err = ogai(capsys, "pipeline", "show", 999999)
    assert code == 1 and "pipeline run 999999 not found" in err


def test_follow_gives_up_on_a_run_whose_runner_never_reported_its_result(
        corpus, cluster, capsys, tmp_path, monkeypatch):
    runner = Runner(cluster, lambda: PipelineRun.objects.get(), [[], job_exits(0)])
    monkeypatch.setattr(cli, "_pause", runner.pause)
    code, _, err = ogai(capsys, "pipeline", "run", pipeline_spec(tmp_path), "-f",
                        "--interval", 60, failure_is_an_error=False)
    assert code == 1
    run = PipelineRun.objects.get()
    assert f"pipeline run {run.pk}: finishing (recording its result)" in err
    assert err.splitlines()[-1] == (f"error: pipeline run {run.pk}: its job ended but the "
                                    "runner reported no result within 120 s; see `ogai job "
                                    f"logs {run.job_id}`")


@pytest.mark.parametrize(("changes", "words"), [
    ({"steps": [{"type": "frobnicate"}]},
     "error: steps[0].type: unknown step type 'frobnicate'; known: normalize, "),
    ({"steps": [{"type": "length_filter", "params": {"min_chars": -5}}]},
     "error: steps[0].params.min_chars: must be "),
    ({"dataset": "nope"}, "error: dataset: No such dataset version."),
    ({"replica": 2}, "error: replica: Unknown field."),
    ({"dataset_version": 1}, "error: dataset_version: give dataset_version (a version's id) "
                             "or dataset"),
])
def test_an_api_400_names_the_field(corpus, cluster, capsys, tmp_path, changes, words):
    code, out, err = ogai(capsys, "pipeline", "run", pipeline_spec(tmp_path, **changes))
    assert code == 1 and not out
    assert err.startswith(words), err
    assert not PipelineRun.objects.exists()


def test_a_spec_that_is_not_a_mapping_says_so(as_member, cluster, capsys, tmp_path):
    code, _, err = ogai(capsys, "pipeline", "run", tmp_path / "missing.yaml")
    assert code == 1 and "cannot read" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("steps: [normalize\n")
    code, _, err = ogai(capsys, "pipeline", "run", broken)
    assert code == 1 and "not valid YAML" in err and "line" in err
    listing = tmp_path / "list.json"
    listing.write_text('["normalize"]')
    code, _, err = ogai(capsys, "train", listing)
    assert code == 1 and "a training spec must be a mapping" in err and "kind" in err
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    code, _, err = ogai(capsys, "pipeline", "run", empty)
    assert code == 1 and "empty" in err and "steps" in err


def test_pipeline_steps_lists_the_catalogue(as_member, capsys):
    code, out, err = ogai(capsys, "pipeline", "steps")
    assert code == 0, err
    for step in ("normalize", "length_filter", "minhash_dedup", "tokenize"):
        assert any(line.startswith(step) for line in out.splitlines()), step
    assert "min_chars" in out
    code, out, _ = ogai(capsys, "pipeline", "steps", "--json")
    assert "exact_dedup" in [step["type"] for step in json.loads(out)]


# -- training -----------------------------------------------------------------------------------

@pytest.fixture
def shards(corpus):
    """A token-shard version of the corpus, as a tokenize step would leave it."""
    return DatasetVersion.objects.create(
        dataset=corpus.dataset, number=2, format="tokens", path="datasets/shards",
        content_hash="f" * 64, documents=25, bytes=1700, tokens=1800, parent=corpus,
        stats={"seq_len": 64, "eos_id": 256, "vocab_size": 257, "token_size": 2})


def train_spec(tmp_path, **changes):
    spec = {"kind": "pretrain", "dataset": "corpus", "name": "tiny-gpt",
            "model": {"preset": "tiny", "architecture": "gpt2"},
            "training": {"max_steps": 40, "batch_size": 2, "checkpoint_every": 20,
                         "log_every": 10}}
    spec.update(changes)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(spec))
    return path


def test_train_follow_prints_progress_and_exits_0(shards, cluster, capsys, tmp_path,
                                                  monkeypatch):
    checkpoint = tmp_path / "ckpt" / "step-20"  # listed while its folder is there
    checkpoint.mkdir(parents=True)
    def progress(step, loss, eta):
        return [event("metric", step=step, loss=loss, lr=3e-4, tokens=step * 128,
                      tokens_per_s=1500.0),
                event("progress", step=step, total_steps=40, tokens=step * 128,
                      tokens_per_s=1500.0, eta_s=eta)]

    runner = Runner(cluster, lambda: TrainingRun.objects.get(), [
        [],
        [event("started", attempt=1, world_size=1, resumed_from_step=None),
         *progress(10, 5.25, 90)],
        [*progress(20, 4.5, 60), event("checkpoint", step=20, path=str(checkpoint),
                                       bytes=4096)],
        [*progress(40, 3.75, 0), event("done", output={
            "path": "/out", "artifact": "model", "parameters": 123456, "final_loss": 3.75,
            "steps": 40, "tokens": 5120})],
        job_exits(0),
    ])
    monkeypatch.setattr(cli, "_pause", runner.pause)
    code, out, err = ogai(capsys, "train", "-f", train_spec(tmp_path), "--queue", "default")
    assert code == 0, err
    run = TrainingRun.objects.get()
    assert run.dataset_version == shards  # the newest version of corpus
    assert out.startswith(f"training run {run.pk} started: pretrain on corpus v2, 40 steps")
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert lines[0] == ("step 10/40 (25%)  loss 5.2500  lr 3.00e-04  1,280 tokens  "
                        "1,500 tokens/s  ETA 1m30s")
    assert lines[1].startswith("step 20/40 (50%)  loss 4.5000")
    run.refresh_from_db()
    # The long output path may wrap the last line.
    assert " ".join(" ".join(out.splitlines()[-2:]).split()).endswith(
        f"training run {run.pk} succeeded: model (123,456 parameters) at {run.output_path}; "
        "final loss 3.7500 after 40 steps")
    assert f"training run {run.pk}: running" in err

    code, out, err = ogai(capsys, "train", "show", run.pk)
    assert code == 0, err
    assert "checkpoints" in out and str(checkpoint) in out
    assert f"model at {run.output_path} (123,456 parameters)" in " ".join(out.split())
    code, out, _ = ogai(capsys, "train", "metrics", run.pk, "--after-step", 10)
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["20", "4.5000"],
                                                                   ["40", "3.7500"]]
    code, out, _ = ogai(capsys, "train", "list", "--kind", "pretrain")
    row = next(line.split() for line in out.splitlines() if "tiny-gpt" in line)
    assert row[2:7] == ["pretrain", "corpus", "v2", "succeeded", "40/40"]


def test_a_training_run_that_fails_exits_1_with_its_message(shards, cluster, capsys,
                                                            tmp_path, monkeypatch):
    runner = Runner(cluster, lambda: TrainingRun.objects.get(), [
        [], [event("failed", message="CUDA out of memory at step 3")],
        *[job_exits(1)] * 4,  # max_restarts 3
    ])
    monkeypatch.setattr(cli, "_pause", runner.pause)
    code, _, err = ogai(capsys, "train", "run", train_spec(tmp_path), "--follow",
                        "--name", "oom", failure_is_an_error=False)
    assert code == 1
    run = TrainingRun.objects.get()
    assert run.name == "oom"
    assert err.splitlines()[-1] == (f"error: training run {run.pk} failed: CUDA out of "
                                    "memory at step 3")

    code, _, err = ogai(capsys, "train", train_spec(tmp_path, model={"preset": "huge"}))
    assert code == 1 and err.startswith("error: model.preset: "), err
    code, _, err = ogai(capsys, "train", "cancel", run.pk)
    assert code == 1 and "already failed" in err


def test_train_spec_can_come_first_or_after_options():
    assert train_argv(["train", "spec.yaml"]) == ["train", "run", "spec.yaml"]
    assert train_argv(["train", "-f", "--tenant", "alpha", "s.yaml"]) == \
        ["train", "run", "-f", "--tenant", "alpha", "s.yaml"]
    assert train_argv(["train", "list"]) == ["train", "list"]
    assert train_argv(["train", "show", "3"]) == ["train", "show", "3"]
    assert train_argv(["train", "--help"]) == ["train", "--help"]
    assert train_argv(["job", "list"]) == ["job", "list"]


# -- multi-task prompt tuning ---------------------------------------------------------------

@pytest.fixture
def mpt_spec(as_member, cluster, world, tmp_path, settings):
    """Alpha's source-task and target-task instruction datasets, a pretrained base, and the
    recipe's spec naming them."""
    from django.core.files.base import ContentFile

    from ylink.services.datasets import dataset_create, dataset_upload

    def instructions(name, *tasks):
        dataset = dataset_create(actor=world.alpha_member, tenant=world.alpha, name=name,
                                 kind="instruction")
        rows = "".join(json.dumps({"prompt": "q", "response": "a", "task": task}) + "\n"
                       for task in tasks)
        return dataset_upload(actor=world.alpha_member, dataset=dataset,
                              upload=ContentFile(rows.encode(), name=f"{name}.jsonl"))

    version = instructions("sources", "a", "b")
    instructions("target", "t")
    base = Path(settings.DATA_DIR) / "base"
    base.mkdir(parents=True)
    run = TrainingRun.objects.create(
        tenant=world.alpha, created_by=world.alpha_member, name="base", kind="pretrain",
        dataset_version=version, spec={"model": {"preset": "tiny"}}, succeeded=True,
        artifact="model", output_path=str(base), parameters=100_000)
    spec = {"base_run": run.pk, "source": {"dataset": "sources"},
            "target": {"dataset": "target"},
            "prompt_tuning": {"num_virtual_tokens": 4, "num_ranks": 2},
            "source_training": {"max_steps": 10}}
    path = tmp_path / "mpt.yaml"
    path.write_text(json.dumps(spec))
    return path, spec


def test_train_mpt_starts_both_stages_the_target_after_the_source(mpt_spec, capsys):
    path, _ = mpt_spec
    code, out, err = ogai(capsys, "train", "mpt", path, "--name", "tasks")
    assert code == 0, err
    source, target = (TrainingRun.objects.get(name=f"tasks-{stage}")
                      for stage in ("source", "target"))
    assert target.after_run == source and target.job is None and source.job is not None
    lines = out.splitlines()
    assert lines[0].startswith(f"source tasks: training run {source.pk} "
                               "multitask_prompt_tuning from training run")
    assert lines[1].startswith(f"target task: training run {target.pk} ")
    assert f"starts after run {source.pk}, queued" in " ".join(out.split())
    code, out, _ = ogai(capsys, "train", "list", "--kind", "multitask_prompt_tuning")
    assert code == 0 and "tasks-source" in out and "tasks-target" in out


def test_a_bad_mpt_spec_is_one_line_naming_the_field(mpt_spec, capsys, tmp_path):
    path, spec = mpt_spec
    path.write_text(json.dumps({**spec, "target_init": "exact_source_task"}))
    code, _, err = ogai(capsys, "train", "mpt", path)
    assert code == 1 and err.startswith("error: source_task: "), err
    assert list(TrainingRun.objects.values_list("name", flat=True)) == ["base"]
