"""The registry through its API: imports refused with their reason, a good import run by its
task, GGUF, isolation between tenants, list query counts, the import_model command."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from django.core.management import CommandError, call_command
from safetensors.torch import load_file, save_file

from mmodel.models import Model, ModelImport, ModelVersion
from mmodel.services.registry import model_create
from mmodel.tests import registry_fixtures
from mmodel.tests.tiny_gguf import tiny_gguf

roots = registry_fixtures.roots
tiny_source = registry_fixtures.tiny_source
tiny_copy = registry_fixtures.tiny_copy
eager = registry_fixtures.eager

BASE = "/api/v1/mmodel"


@pytest.fixture
def model(world, roots):
    return model_create(actor=world.alpha_member, tenant=world.alpha, name="tiny")


def start(api, user, model, path, django_capture_on_commit_callbacks, **extra):
    with django_capture_on_commit_callbacks(execute=True):
        return api.as_user(user).post(f"{BASE}/models/{model.pk}/import/",
                                      {"source_path": str(path), **extra}, format="json")


def refusal(response) -> str:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid" and list(body["fields"]) == ["source_path"]
    return body["fields"]["source_path"][0]


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "expected"), [
    (lambda f: (f / "modeling_llama2.py").write_text("import os"),
     "modeling_llama2.py is Python code: models that bring their own code "
     "(trust_remote_code) are not imported."),
    (lambda f: _edit_json(f / "config.json", auto_map={"AutoModel": "x.Model"}),
     "config.json names code of its own (auto_map)"),
    (lambda f: _edit_json(f / "tokenizer_config.json", auto_map={"AutoTokenizer": ["x", None]}),
     "tokenizer_config.json names code of its own (auto_map)"),
    (lambda f: torch.save({}, f / "pytorch_model.bin"),
     "pytorch_model.bin holds pickle weights: pickle weights run code when loaded; an operator "
     "must set OGAI_MODEL_ALLOW_PICKLE."),
    (lambda f: (f / "tokenizer.json").unlink(), "No tokenizer: the folder needs tokenizer.json"),
    (lambda f: (f / "config.json").unlink(), "No config.json"),
])
def test_an_import_is_refused_with_its_reason(api, world, model, roots, tiny_copy, change,
                                              expected, django_capture_on_commit_callbacks):
    folder = tiny_copy(roots / "m")
    change(folder)
    response = start(api, world.alpha_member, model, folder,
                     django_capture_on_commit_callbacks, allow_pickle=True)
    assert expected in refusal(response)
    assert not ModelImport.objects.exists() and not ModelVersion.objects.exists()


def test_paths_outside_the_roots_or_missing_are_refused(api, world, model, roots, tiny_copy,
                                                        tmp_path,
                                                        django_capture_on_commit_callbacks):
    outside = tiny_copy(tmp_path / "outside")
    message = refusal(start(api, world.alpha_member, model, outside,
                            django_capture_on_commit_callbacks))
    assert message == f"{outside} is outside the import roots: {roots}."
    (roots / "sneaky").symlink_to(outside)
    message = refusal(start(api, world.alpha_member, model, roots / "sneaky",
                            django_capture_on_commit_callbacks))
    assert message == (f"{roots / 'sneaky'} (really {outside}) is outside the import roots: "
                       f"{roots}.")
    message = refusal(start(api, world.alpha_member, model, roots / "nope",
                            django_capture_on_commit_callbacks))
    assert message == f"{roots / 'nope'} does not exist."


def test_pickle_needs_both_the_request_and_the_operator(api, world, model, roots, tiny_copy,
                                                        settings, eager,
                                                        django_capture_on_commit_callbacks):
    folder = tiny_copy(roots / "m")
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    settings.OGAI_MODEL_ALLOW_PICKLE = True
    assert "set allow_pickle on the import as well" in refusal(
        start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks))

    response = start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks,
                     allow_pickle=True)
    assert response.status_code == 202, response.content
    version = ModelVersion.objects.get()
    assert (version.status, version.format) == ("ready", "pickle"), version.message
    names = [entry["path"] for entry in version.files]
    # Converted: the version serves safetensors, never the pickle file.
    assert "model.safetensors" in names and "pytorch_model.bin" not in names
    assert "Converted from pickle weights" in version.message


def test_a_good_import_is_checked_copied_and_described(api, world, model, roots, tiny_copy,
                                                       tiny_source, eager, settings,
                                                       django_capture_on_commit_callbacks):
    folder = tiny_copy(roots / "tiny")
    response = start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["model"] == "tiny" and body["version_number"] == 1 and body["state"] == "queued"

    job = api.get(f"{BASE}/model-imports/{body['id']}/").json()
    assert job["state"] == "succeeded", job["message"]
    assert job["started_at"] and job["finished_at"] and job["message"] == "Imported as tiny:v1."
    version = api.get(f"{BASE}/model-versions/{body['version']}/").json()
    weights = load_file(str(tiny_source / "model.safetensors"))
    assert version["status"] == "ready" and version["message"] == ""
    assert (version["source"], version["format"]) == ("import", "safetensors")
    assert (version["architecture"], version["model_type"]) == ("LlamaForCausalLM", "llama")
    assert version["parameters"] == sum(t.numel() for t in weights.values())
    assert (version["context_length"], version["dtype"]) == (256, "float32")
    assert version["tokenizer"]
    files = {entry["path"]: entry["bytes"] for entry in version["files"]}
    assert files["model.safetensors"] == (tiny_source / "model.safetensors").stat().st_size
    assert {"config.json", "tokenizer.json"} <= set(files)
    assert version["bytes"] == sum(files.values())

    # The platform's own copy, hashed over names and contents.
    artifact = Path(settings.DATA_DIR) / version["artifact_path"]
    assert artifact.parent == Path(settings.DATA_DIR) / "models" / "alpha" / f"{model.pk}-tiny"
    assert artifact.name == f"v1-{version['content_hash'][:12]}"
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + (artifact / name).read_bytes())
    assert version["content_hash"] == digest.hexdigest()
    assert version["lineage"] == {"nodes": [{"id": f"model_version:{version['id']}",
                                             "kind": "model_version", "label": "tiny:v1",
                                             "pk": version["id"]}], "edges": []}

    # The same folder again: a second version with the same content hash.
    start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks)
    second = ModelVersion.objects.get(model=model, number=2)
    assert second.status == "ready" and second.content_hash == version["content_hash"]
    listed = api.get(f"{BASE}/models/", {"name": "tiny"}).json()["results"]
    assert listed[0]["versions"] == 2
    assert listed[0]["latest_version"] == {"id": second.pk, "number": 2, "status": "ready"}


def test_a_renamed_tensor_fails_the_import_naming_it(api, world, model, roots, tiny_copy, eager,
                                                     django_capture_on_commit_callbacks):
    folder = tiny_copy(roots / "broken")
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.0.self_attn.q_proj.weight_renamed"] = weights.pop(
        "model.layers.0.self_attn.q_proj.weight")
    save_file(weights, str(folder / "model.safetensors"))
    response = start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks)
    assert response.status_code == 202
    job = ModelImport.objects.get()
    version = job.version
    assert job.state == "failed" and version.status == "failed"
    assert "missing tensors: model.layers.0.self_attn.q_proj.weight;" in version.message
    assert "unexpected tensors: model.layers.0.self_attn.q_proj.weight_renamed" in job.message
    assert version.artifact_path == ""
    assert not list((Path(roots.parent) / "data" / "models").glob("alpha/*"))


def test_a_gguf_file_is_converted_on_import(api, world, model, roots, tiny_source, eager,
                                            settings, django_capture_on_commit_callbacks):
    gguf = tiny_gguf(tiny_source, roots / "gguf" / "tiny.Q.gguf")
    response = start(api, world.alpha_member, model, gguf, django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.content
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.message
    assert (version.format, version.architecture, version.dtype) == \
        ("gguf", "LlamaForCausalLM", "float32")
    assert "Converted from tiny.Q.gguf (dequantised) to safetensors in float32." in \
        version.message
    assert "given a plain one" in version.message
    converted = load_file(str(Path(settings.DATA_DIR) / version.artifact_path
                              / "model.safetensors"))
    original = load_file(str(tiny_source / "model.safetensors"))
    assert all(torch.equal(original[name], converted[name]) for name in original)


def test_members_of_other_tenants_see_nothing(api, world, model, roots, tiny_copy, eager,
                                              django_capture_on_commit_callbacks):
    folder = tiny_copy(roots / "tiny")
    job = start(api, world.alpha_member, model, folder, django_capture_on_commit_callbacks).json()
    beta = api.as_user(world.beta_member)
    for path in (f"models/{model.pk}/", f"model-versions/{job['version']}/",
                 f"model-imports/{job['id']}/"):
        assert beta.get(f"{BASE}/{path}").status_code == 404
    for path in ("models/", "model-versions/", "model-imports/"):
        assert beta.get(f"{BASE}/{path}").json()["count"] == 0
    assert beta.post(f"{BASE}/models/{model.pk}/import/", {"source_path": str(folder)},
                     format="json").status_code == 404
    assert beta.delete(f"{BASE}/model-versions/{job['version']}/").status_code == 404
    viewer = api.as_user(world.alpha_viewer)
    assert viewer.post(f"{BASE}/models/{model.pk}/import/", {"source_path": str(folder)},
                       format="json").status_code == 403


def test_models_are_created_in_the_callers_tenant(api, world, roots):
    response = api.as_user(world.alpha_member).post(f"{BASE}/models/", {"name": "mine"},
                                                    format="json")
    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == "alpha" and response.json()["latest_version"] is None
    again = api.post(f"{BASE}/models/", {"name": "mine"}, format="json")
    assert again.json()["fields"]["name"] == ["alpha already has a model 'mine'."]
    both = api.as_user(world.both).post(f"{BASE}/models/", {"name": "x", "tenant": "beta"},
                                        format="json")
    assert both.status_code == 403  # a viewer of beta
    bad = api.as_user(world.alpha_member).post(f"{BASE}/models/", {"name": "Bad Name"},
                                               format="json")
    assert bad.status_code == 400 and "name" in bad.json()["fields"]


def test_list_endpoints_pin_their_query_counts(api, world, roots,
                                               django_assert_max_num_queries):
    for index in range(4):
        model = model_create(actor=world.alpha_member, tenant=world.alpha, name=f"m{index}")
        for number in (1, 2):
            version = ModelVersion.objects.create(model=model, number=number, source="import",
                                                  format="safetensors", status="ready")
            ModelImport.objects.create(tenant=world.alpha, model=model, version=version,
                                       source_path="/x", created_by=world.alpha_member)
    client = api.as_user(world.alpha_member)
    for path, queries in (("models/", 5), ("model-versions/", 6), ("model-imports/", 5)):
        with django_assert_max_num_queries(queries):
            response = client.get(f"{BASE}/{path}", {"tenant": "alpha"})
        assert response.status_code == 200 and response.json()["count"] in (4, 8)
    assert client.get(f"{BASE}/model-versions/", {"model": Model.objects.first().pk}) \
        .json()["count"] == 2


def test_the_import_model_command_runs_an_import_at_once(world, roots, tiny_copy, capsys):
    folder = tiny_copy(roots / "tiny")
    call_command("import_model", "--tenant", "alpha", "--name", "cli", str(folder))
    out = capsys.readouterr().out
    assert "checking the weights against config.json" in out
    assert "Ready: cli:v1 (LlamaForCausalLM, 30,880 parameters, float32, context 256" in out
    assert ModelVersion.objects.get(model__name="cli").status == "ready"
    with pytest.raises(CommandError, match="does not exist"):
        call_command("import_model", "--tenant", "alpha", "--name", "cli", str(roots / "no"))
