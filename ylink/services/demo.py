"""The demo's corpus and its one-click run: the demo pipeline, then a tiny pretraining.

The corpus is English text every Python installation carries (the documentation topics of
`pydoc_data` and the docstrings of the standard library's modules), with planted copies,
near-copies, personal data and junk so the pipeline has something to remove. Nothing is
downloaded.
"""

import ast
import json
import random
import sysconfig
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction

from aistation.models import Queue
from infra_os.models import Tenant
from ylink import storage
from ylink.models import Dataset, PipelineRun
from ylink.services.datasets import dataset_create, dataset_upload
from ylink.services.pipelines import pipeline_run_start
from ylink.steps import DEFAULT_PIPELINE

DEMO_TENANT = "demo"
DEMO_DATASET = "python-docs"
# The default pipeline, loosened where Python's documentation is not web prose: code samples
# have few alphabetic words, lines without full stops and curly brackets.
DEMO_OVERRIDES: dict[str, dict] = {
    "gopher_quality": {"min_alpha_words_ratio": 0.5},
    "c4_lines": {"filter_no_terminal_punct": False, "filter_curly_bracket": False,
                 "min_num_sentences": 1},
}
DEMO_PIPELINE = [{"type": step["type"],
                  "params": {**step["params"], **DEMO_OVERRIDES.get(step["type"], {})}}
                 for step in DEFAULT_PIPELINE]
DEMO_TRAINING = {
    "kind": "pretrain",
    "name": "demo-tiny-gpt",
    "model": {"preset": "tiny", "architecture": "gpt2"},
    "training": {"max_steps": 150, "batch_size": 8, "checkpoint_every": 50, "log_every": 5},
    "memory_mib": 2048,
}


def _stdlib_docstrings(limit: int = 300) -> list[str]:
    folder = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(folder.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and len(doc) >= 400:
            texts.append(doc)
        if len(texts) >= limit:
            break
    return texts


def _near_copy(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    for index in rng.sample(range(len(words)), max(1, len(words) // 40)):
        words[index] = words[index].upper()
    return " ".join(words)


def demo_corpus() -> list[dict]:
    """About 350 documents: real prose plus what a cleaning pipeline should drop."""
    from pydoc_data.topics import topics

    rng = random.Random(7)  # noqa: S311 - a fixed demo corpus, not a secret
    texts = [text for _, text in sorted(topics.items()) if len(text) >= 400]
    texts += _stdlib_docstrings()
    documents = [{"text": text} for text in texts]
    documents += [{"text": text} for text in rng.sample(texts, 15)]  # exact copies
    documents += [{"text": _near_copy(text, rng)} for text in rng.sample(texts, 15)]
    for number, text in enumerate(rng.sample(texts, 10)):
        documents.append({"text": f"{text}\n\nQuestions? Write to maintainer{number}@example.org "
                                  f"or call +1 415 555 01{number:02d}; the mirror is at "
                                  f"192.0.2.{number + 10}."})
    documents += [
        {"text": "click here " * 120},
        {"text": "$$$ %%% ### @@@ " * 60},
        {"text": "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20},
        {"text": "too short"},
    ]
    rng.shuffle(documents)
    return documents


@transaction.atomic
def demo_seed(*, stdout) -> None:
    """The demo tenant's `python-docs` dataset, once."""
    tenant = Tenant.objects.filter(name=DEMO_TENANT).first()
    admin = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if tenant is None or admin is None or Dataset.objects.filter(
            tenant=tenant, name=DEMO_DATASET).exists():
        return
    dataset = dataset_create(actor=admin, tenant=tenant, name=DEMO_DATASET,
                             description="Python's own documentation, with planted copies, "
                             "personal data and junk for the demo pipeline to remove.")
    path = storage.data_root() / "demo" / f"{DEMO_DATASET}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for document in demo_corpus():
            out.write(json.dumps(document, ensure_ascii=False) + "\n")
    with path.open("rb") as stream:
        version = dataset_upload(actor=admin, dataset=dataset,
                                 upload=File(stream, name=path.name))
    stdout.write(f"  dataset         {tenant.name}/{DEMO_DATASET} v{version.number}: "
                 f"{version.documents} documents\n")


def demo_run(*, actor, tenant: Tenant) -> PipelineRun:
    """The demo pipeline on the newest version of the demo dataset, then a tiny pretraining
    on its token shards, on the tenant's default queue."""
    dataset = Dataset.objects.filter(tenant=tenant, name=DEMO_DATASET).first()
    queue = Queue.objects.filter(tenant=tenant, name="default").first()
    if dataset is None or queue is None:
        raise ValidationError(f"{tenant.name} has no {DEMO_DATASET} dataset or default queue: "
                              "run `manage.py seed_demo`.")
    version = dataset.versions.filter(parent__isnull=True).order_by("-number").first()
    if version is None:
        raise ValidationError(f"The {DEMO_DATASET} dataset has no uploaded version.")
    return pipeline_run_start(
        actor=actor, version=version, steps=DEMO_PIPELINE, queue=queue,
        name="demo-pipeline", memory_mib=2048, then_train=DEMO_TRAINING,
    )
