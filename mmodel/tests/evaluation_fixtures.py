"""Fixtures of the evaluation tests: their own DATA_DIR, ready model versions (a real tiny model,
or only its config for tests that never load it), small benchmarks of each kind."""

import json
import shutil
from pathlib import Path

import pytest

from mmodel import storage
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Model, ModelVersion
from mmodel.services.evaluation import benchmark_create
from mmodel.tests.tiny import tiny_model

MC_DOCS = [
    {"question": "What is the capital of France?", "choices": ["Paris", "Rome", "Oslo"],
     "answer": 0},
    {"question": "What is 1 plus 1?", "choices": ["3", "2", "5"], "answer": 1},
    {"question": "Which animal barks?", "choices": ["cat", "fish", "dog"], "answer": 2},
    {"question": "What colour is the sky?", "choices": ["blue", "green", "red"], "answer": 0},
    {"question": "How many legs has a dog?", "choices": ["two", "four", "six"], "answer": 1},
]
GEN_DOCS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)}
            for a, b in [(1, 1), (2, 3), (4, 4), (3, 5), (6, 1)]]
PPL_DOCS = [{"text": "The quick brown fox jumps over the lazy dog."},
            {"text": "Paris is the capital of France. Berlin is the capital of Germany."},
            {"text": "Python is a programming language that lets you work quickly."}]


def jsonl(docs) -> bytes:
    return "".join(json.dumps(doc) + "\n" for doc in docs).encode()


@pytest.fixture(autouse=True)
def _own_data_dir(settings, tmp_path):
    """Each test's files in a folder of its own: files outlive a rolled-back transaction."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-eval") / "model")


def _version(tenant, name: str, folder: Path, number: int = 1) -> ModelVersion:
    model, _ = Model.objects.get_or_create(tenant=tenant, name=name)
    return ModelVersion.objects.create(
        model=model, number=number, status=VersionStatus.READY, source=VersionSource.IMPORT,
        artifact_path=storage.relative(folder), format=WeightsFormat.SAFETENSORS,
        architecture="LlamaForCausalLM", content_hash=storage.content_hash(folder),
        bytes=sum(p.stat().st_size for p in folder.iterdir()))


@pytest.fixture
def make_version(settings):
    """`make_version(tenant, name, number=1, config={})`: a ready version whose folder holds only
    a config.json (it is never loaded)."""

    def make(tenant, name="tiny", number=1, config=None):
        folder = Path(settings.DATA_DIR) / "models" / tenant.name / f"{name}-v{number}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
        return _version(tenant, name, folder, number)

    return make


@pytest.fixture
def tiny_version(settings, tiny_weights):
    """`tiny_version(tenant)`: a ready version holding the real tiny model."""

    def make(tenant, name="tiny", number=1):
        folder = Path(settings.DATA_DIR) / "models" / tenant.name / f"{name}-v{number}"
        shutil.copytree(tiny_weights, folder)
        return _version(tenant, name, folder, number)

    return make


@pytest.fixture
def suites(world):
    """`suites(tenant, actor)`: a multiple-choice (one few-shot example), a generation and a
    perplexity benchmark of the tenant."""

    def make(tenant=None, actor=None):
        tenant = tenant or world.alpha
        actor = actor or world.alpha_member
        return [
            benchmark_create(actor=actor, tenant=tenant, name="mc", kind="multiple_choice",
                             data=jsonl(MC_DOCS), few_shot=1),
            benchmark_create(actor=actor, tenant=tenant, name="sums", kind="generation",
                             data=jsonl(GEN_DOCS), prompt_template="{{question}} Answer:",
                             generation_kwargs={"until": ["\n"], "max_gen_toks": 4}),
            benchmark_create(actor=actor, tenant=tenant, name="prose", kind="perplexity",
                             data=jsonl(PPL_DOCS)),
        ]

    return make
