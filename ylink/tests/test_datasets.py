"""Uploading corpora: what is stored, what is refused, and that a refusal leaves nothing."""

import io
import json
import zipfile

import pytest
from django.core.files.base import ContentFile

from ylink import storage
from ylink.models import Dataset, DatasetVersion
from ylink.tests.conftest import jsonl

pytestmark = pytest.mark.django_db

DATASETS = "/api/v1/ylink/datasets/"


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _dataset(api, world, name="corpus", kind="text"):
    response = api.as_user(world.alpha_member).post(
        DATASETS, {"name": name, "kind": kind, "tenant": "alpha"}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _upload(api, dataset_id, filename, content):
    return api.post(f"{DATASETS}{dataset_id}/upload/",
                    {"file": ContentFile(content, name=filename)}, format="multipart")


def _left_behind() -> list[str]:
    """Files of datasets under DATA_DIR: staging leftovers or version folders."""
    root = storage.data_root() / "datasets"
    return [str(p) for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_a_jsonl_upload_becomes_a_version_with_statistics_and_samples(api, world):
    dataset_id = _dataset(api, world)
    texts = ["short one", "x" * 100, "a document of medium length " * 10]
    response = _upload(api, dataset_id, "corpus.jsonl", jsonl(*texts) + b"\n\n")
    assert response.status_code == 201, response.json()
    version = response.json()
    assert version["number"] == 1 and version["format"] == "jsonl"
    assert version["documents"] == 3
    assert version["bytes"] == sum(len(t.encode()) for t in texts)
    histogram = version["stats"]["length_histogram"]
    assert sum(b["documents"] for b in histogram) == 3
    assert version["stats"]["longest_chars"] == 280
    assert len(version["content_hash"]) == 64 and version["source"] == "corpus.jsonl"

    page = api.get(f"/api/v1/ylink/dataset-versions/{version['id']}/samples/?offset=1&limit=5")
    assert page.status_code == 200
    body = page.json()
    assert body["count"] == 3
    assert [s["text"] for s in body["results"]] == texts[1:]

    listed = api.get(DATASETS).json()["results"]
    assert [(d["name"], d["versions"], d["latest_version"]) for d in listed] == \
        [("corpus", 1, 1)]


def test_a_zip_of_text_files_gives_one_document_per_file(api, world):
    dataset_id = _dataset(api, world)
    archive = _zip({"docs/a.txt": b"Alpha text.", "docs/b.md": "Beta \u00e9t\u00e9.".encode(),
                    "__MACOSX/._a.txt": b"\x00junk", "docs/c.jsonl": jsonl("one", "two")})
    response = _upload(api, dataset_id, "texts.zip", archive)
    assert response.status_code == 201, response.json()
    version = DatasetVersion.objects.get(pk=response.json()["id"])
    texts = sorted(d["text"] for d in storage.iter_documents(
        storage.absolute(version.path), version.format))
    assert texts == ["Alpha text.", "Beta \u00e9t\u00e9.", "one", "two"]


def test_the_same_content_gives_the_same_hash_and_numbers_go_up(api, world):
    dataset_id = _dataset(api, world)
    first = _upload(api, dataset_id, "c.jsonl", jsonl("same")).json()
    second = _upload(api, dataset_id, "c.jsonl", jsonl("same")).json()
    assert (first["number"], second["number"]) == (1, 2)
    assert first["content_hash"] == second["content_hash"]


@pytest.mark.parametrize(("filename", "content", "message"), [
    ("corpus.jsonl", b'{"text": "fine"}\n{"text": broken\n', "corpus.jsonl line 2: not JSON"),
    ("corpus.jsonl", b'{"body": "no text field"}\n', "no string field 'text'"),
    ("corpus.jsonl", b'["a list"]\n', "must be a JSON object"),
    ("corpus.jsonl", b'{"text": "a"}\n\xff\xfe\n', "line 2: not UTF-8"),
    ("corpus.zip", b"this is not a zip at all", "not a zip file"),
    ("notes.txt", b"text\x00with NUL", "NUL bytes"),
    ("image.png", b"\x89PNG....", "upload a .jsonl, .txt"),
    ("empty.jsonl", b"\n\n", "no documents found"),
    ("evil.zip", _zip({"ok.txt": b"fine", "../../escape.txt": b"out"}), "points outside"),
    ("abs.zip", _zip({"/etc/passwd.txt": b"root"}), "points outside"),
    ("nested.zip", _zip({"inner.zip": b"PK"}), "zip inside the zip"),
])
def test_a_bad_upload_is_refused_with_the_reason_and_leaves_nothing(
        api, world, filename, content, message):
    dataset_id = _dataset(api, world)
    response = _upload(api, dataset_id, filename, content)
    assert response.status_code == 400
    body = response.json()
    assert message in body["fields"]["file"][0], body
    assert not DatasetVersion.objects.exists()
    assert _left_behind() == []


def test_an_instruction_dataset_needs_prompt_and_response(api, world):
    dataset_id = _dataset(api, world, name="chat", kind="instruction")
    good = json.dumps({"prompt": "Say hi", "response": "Hi!"}) + "\n"
    bad = json.dumps({"prompt": "Say hi"}) + "\n"
    response = _upload(api, dataset_id, "chat.jsonl", (good + bad).encode())
    assert response.status_code == 400
    assert "line 2" in response.json()["fields"]["file"][0]
    response = _upload(api, dataset_id, "chat.jsonl", good.encode())
    assert response.status_code == 201
    sample = api.get(f"/api/v1/ylink/dataset-versions/{response.json()['id']}/samples/") \
        .json()["results"][0]
    assert sample["metadata"]["prompt"] == "Say hi" and sample["metadata"]["response"] == "Hi!"


def test_an_upload_over_the_limit_is_refused_before_it_is_read(api, world, settings):
    settings.OGAI_DATASET_MAX_UPLOAD_MIB = 1
    dataset_id = _dataset(api, world)
    response = _upload(api, dataset_id, "big.jsonl", jsonl("y" * (2 * 2**20)))
    assert response.status_code == 413
    assert "limited to 1 MiB" in response.json()["fields"]["file"][0]
    assert _left_behind() == []


def test_a_zip_that_unpacks_past_the_limit_is_refused(api, world, settings):
    settings.OGAI_DATASET_MAX_UPLOAD_MIB = 1
    dataset_id = _dataset(api, world)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.txt", b"0" * (3 * 2**20))  # compresses to a few KiB
    response = _upload(api, dataset_id, "bomb.zip", buffer.getvalue())
    assert response.status_code == 400
    assert "unpacks to 3 MiB" in response.json()["fields"]["file"][0]
    assert _left_behind() == []


def test_a_zip_with_too_many_files_is_refused(api, world, settings):
    settings.OGAI_DATASET_MAX_FILES = 3
    dataset_id = _dataset(api, world)
    response = _upload(api, dataset_id, "many.zip",
                       _zip({f"{n}.txt": b"text" for n in range(5)}))
    assert response.status_code == 400
    assert "at most 3" in response.json()["fields"]["file"][0]


def test_other_tenants_cannot_see_and_viewers_cannot_upload(api, world, make_version):
    version = make_version()
    dataset = version.dataset
    beta = api.as_user(world.beta_member)
    assert beta.get(f"{DATASETS}{dataset.pk}/").status_code == 404
    assert beta.get(f"/api/v1/ylink/dataset-versions/{version.pk}/samples/").status_code == 404
    assert beta.get(DATASETS).json()["results"] == []
    viewer = api.as_user(world.alpha_viewer)
    assert viewer.get(f"{DATASETS}{dataset.pk}/").status_code == 200
    assert _upload(viewer, dataset.pk, "c.jsonl", jsonl("x")).status_code == 403
    assert viewer.post(DATASETS, {"name": "mine", "tenant": "alpha"},
                       format="json").status_code == 403


def test_dataset_names_are_checked(api, world):
    client = api.as_user(world.alpha_member)
    assert client.post(DATASETS, {"name": "Bad Name!", "tenant": "alpha"},
                       format="json").status_code == 400
    _dataset(api, world, name="corpus")
    duplicate = client.post(DATASETS, {"name": "corpus", "tenant": "alpha"}, format="json")
    assert duplicate.status_code == 400 and "already has" in duplicate.json()["fields"]["name"][0]
    assert Dataset.objects.count() == 1


def _create_with_upload(api, fields, filename, content):
    return api.post(f"{DATASETS}upload/", {**fields, "file": ContentFile(content, name=filename)},
                    format="multipart")


def test_a_dataset_made_with_its_first_upload_exists_only_with_it(api, world):
    member = api.as_user(world.alpha_member)
    refused = _create_with_upload(member, {"name": "corpus", "tenant": "alpha"}, "c.jsonl",
                                  b'{"text": "fine"}\n{"text": oops}\n')
    assert refused.status_code == 400
    assert "line 2" in refused.json()["fields"]["file"][0]
    assert not Dataset.objects.exists(), "no empty dataset behind a refused upload"
    assert _left_behind() == []

    made = _create_with_upload(member, {"name": "corpus", "tenant": "alpha", "kind": "text"},
                               "c.jsonl", jsonl("one", "two"))
    assert made.status_code == 201, made.json()
    assert (made.json()["dataset"], made.json()["number"], made.json()["documents"]) == \
        ("corpus", 1, 2)
    again = _create_with_upload(member, {"name": "corpus", "tenant": "alpha"}, "c.jsonl",
                                jsonl("three"))
    assert again.status_code == 400 and "already has a dataset" in again.json()["fields"]["name"][0]
    assert DatasetVersion.objects.count() == 1


def test_another_tenant_or_a_viewer_cannot_create_with_an_upload(api, world):
    beta = api.as_user(world.beta_member)
    refused = _create_with_upload(beta, {"name": "x", "tenant": "alpha"}, "c.jsonl", jsonl("x"))
    assert refused.status_code == 400 and "tenant" in refused.json()["fields"]  # as POST /datasets/
    viewer = api.as_user(world.alpha_viewer)
    assert _create_with_upload(viewer, {"name": "x", "tenant": "alpha"}, "c.jsonl",
                               jsonl("x")).status_code == 403
    assert not Dataset.objects.exists()
