"""The demo corpus as a tenant's uploaded dataset, for the tests that run the toolchain on it."""
import json

from django.core.files.base import ContentFile

from ylink.services.datasets import dataset_create, dataset_upload
from ylink.services.demo import DEMO_PIPELINE, demo_corpus


def uploaded_corpus(*, actor, tenant, name: str = "docs"):
    """Version 1 of a new dataset holding the demo corpus."""
    dataset = dataset_create(actor=actor, tenant=tenant, name=name)
    lines = "".join(json.dumps(document) + "\n" for document in demo_corpus())
    return dataset_upload(actor=actor, dataset=dataset,
                          upload=ContentFile(lines.encode(), name="docs.jsonl"))


def demo_steps(*, seq_len: int) -> list[dict]:
    """The demo pipeline, tokenizing into sequences of `seq_len`."""
    steps = [dict(step) for step in DEMO_PIPELINE]
    steps[-1] = {"type": "tokenize", "params": {"seq_len": seq_len}}
    return steps
