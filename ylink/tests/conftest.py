import json

import pytest
from django.core.files.base import ContentFile

from ylink.services.datasets import dataset_create, dataset_upload


def jsonl(*texts: str) -> bytes:
    return "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()


@pytest.fixture(autouse=True)
def _own_data_dir(settings, tmp_path):
    """Each test's datasets and runs in a folder of its own: files outlive a rolled-back
    transaction."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()


@pytest.fixture
def make_version(world):
    """`make_version(name, content, filename=…, kind=…)`: a dataset of alpha with one uploaded
    version."""

    def make(name="corpus", content=None, *, filename="corpus.jsonl", kind="text",
             actor=None):
        actor = actor or world.alpha_member
        dataset = dataset_create(actor=actor, tenant=world.alpha, name=name, kind=kind)
        content = content if content is not None else jsonl(
            "The first document of the corpus, long enough to count.",
            "A second document with different words in it.")
        return dataset_upload(actor=actor, dataset=dataset,
                              upload=ContentFile(content, name=filename))

    return make
