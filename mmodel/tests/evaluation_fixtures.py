"""Fixtures of the evaluation tests: their own DATA_DIR, ready model versions (a real tiny model,
all-MiniLM-L6-v2 as an embedding model, or only their config for tests that never load them),
small benchmarks of each kind."""

import json
import shutil
from pathlib import Path

import pytest

from mmodel import storage
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import Model, ModelVersion
from mmodel.services.evaluation import benchmark_create
from mmodel.tests.minilm import minilm_folder
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
# A retrieval benchmark: passages, then queries naming their relevant passages.
RETRIEVAL_DOCS = [
    {"id": "gpu", "text": "The GPU ran out of memory while loading the checkpoint."},
    {"id": "nccl", "text": "NCCL timed out waiting for rank 3 during all-reduce."},
    {"id": "cat", "text": "A cat sat on the mat in the sun."},
    {"id": "lr", "text": "The learning rate decays with a cosine schedule after warm-up."},
    {"query": "CUDA out of memory", "relevant": ["gpu"]},
    {"query": "collective communication hangs", "relevant": ["nccl"]},
    {"query": "a pet resting on a rug", "relevant": ["cat", "lr"]},
]


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
def embedding_version(settings):
    """`embedding_version(tenant, real=False)`: a ready version that is an embedding model (a
    sentence-transformers folder): all-MiniLM-L6-v2 itself when `real`, else only its
    modules.json and config.json (it is never loaded)."""

    def make(tenant, name="minilm", number=1, real=False):
        folder = Path(settings.DATA_DIR) / "models" / tenant.name / f"{name}-v{number}"
        if real:
            shutil.copytree(minilm_folder(), folder)
        else:
            folder.mkdir(parents=True)
            for file in ("modules.json", "config.json"):
                shutil.copy(minilm_folder() / file, folder / file)
        version = _version(tenant, name, folder, number)
        version.architecture = "BertModel"
        version.save(update_fields=["architecture"])
        return version

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
