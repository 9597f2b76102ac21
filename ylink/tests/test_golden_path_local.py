"""The toolchain's part of the golden path, as a user runs it: a corpus cleaned, deduplicated
and tokenized by a pipeline job, a tiny GPT pretrained on it as a job that is killed mid-run
and resumes from its checkpoint, then a LoRA fine-tune of the result. Real processes on the
local driver, a real Celery worker, the runners reporting to the live API with their job
tokens."""

import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest
from django.core.files.base import ContentFile

from aistation.choices import FINAL_STATES, JobState
from tests.processes import job_processes
from ylink.models import PipelineRun, TrainingRun
from ylink.services.datasets import dataset_create, dataset_upload
from ylink.services.pipelines import pipeline_run_start
from ylink.services.training import training_run_start
from ylink.tests.corpus import demo_steps, uploaded_corpus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]



def _wait(run, condition, what: str, timeout: float = 180.0, poll_s: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        run.job.refresh_from_db()
        if condition(run):
            return run
        if run.job.state in FINAL_STATES and not run.succeeded and run.job.state != \
                JobState.SUCCEEDED:
            break
        time.sleep(poll_s)
    raise AssertionError(f"{run} never {what}: job {run.job.state} ({run.job.reason}); "
                         f"message: {run.message}")



def test_corpus_to_pipeline_to_pretraining_with_a_kill_to_lora(
        world, local_queue, live_server, settings, celery_worker_process):
    settings.OGAI_INTERNAL_URL = live_server.url
    member = world.alpha_member
    source = uploaded_corpus(actor=member, tenant=world.alpha)
    steps = demo_steps(seq_len=128)
    pipeline = pipeline_run_start(actor=member, version=source, steps=steps,
                                  queue=local_queue, memory_mib=1024)
    pipeline = _wait(pipeline, lambda r: r.succeeded, "finished")
    tokens = pipeline.output_version
    assert tokens.format == "tokens" and tokens.parent == source
    assert 0 < tokens.documents < source.documents and tokens.tokens > 100_000
    counts = [(s["docs_in"], s["docs_out"]) for s in pipeline.step_results]
    assert counts[0][0] == source.documents
    assert all(a[1] == b[0] for a, b in itertools.pairwise(counts))

    run = training_run_start(
        actor=member, dataset_version=tokens, queue=local_queue, kind="pretrain",
        name="tiny", model={"preset": "tiny"}, memory_mib=2048, max_restarts=2,
        training={"max_steps": 150, "batch_size": 16, "checkpoint_every": 20, "log_every": 2,
                  "warmup_steps": 5, "lr": 3e-3},
    )
    # Killed once it has checkpointed and trained on past it.
    run = _wait(run, lambda r: r.checkpoints.exists() and r.step
                >= r.checkpoints.order_by("-step").first().step + 2, "checkpointed",
                poll_s=0.1)
    victims = job_processes(run.job.pk)
    assert victims, "the run ended before it could be killed"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    run = _wait(run, lambda r: r.succeeded, "finished after its kill")
    assert run.job.attempts.count() == 2
    assert run.resumed_from_step and run.resumed_from_step % 20 == 0
    steps_logged = list(run.metrics.values_list("step", flat=True))
    assert steps_logged == list(range(2, 151, 2))
    losses = list(run.metrics.values_list("loss", flat=True))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    assert run.artifact == "model" and Path(run.output_path, "config.json").exists()

    chat = dataset_create(actor=member, tenant=world.alpha, name="chat", kind="instruction")
    pairs = "".join(json.dumps({"prompt": f"Name a number after {n}.",
                                "response": f"{n + 1}."}) + "\n" for n in range(40))
    chat_version = dataset_upload(actor=member, dataset=chat,
                                  upload=ContentFile(pairs.encode(), name="chat.jsonl"))
    lora = training_run_start(
        actor=member, dataset_version=chat_version, queue=local_queue, kind="lora",
        base_run=run, memory_mib=2048,
        training={"max_steps": 8, "batch_size": 4, "checkpoint_every": 4, "log_every": 2},
    )
    lora = _wait(lora, lambda r: r.succeeded, "finished")
    assert lora.artifact == "adapter"
    assert Path(lora.output_path, "adapter_config.json").exists()
    assert TrainingRun.objects.count() == 2 and PipelineRun.objects.count() == 1
