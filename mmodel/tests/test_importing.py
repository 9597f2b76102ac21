"""Checking model folders (mmodel.importing): what is refused and why, weights against their
config, GGUF conversion. No database."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmodel import importing
from mmodel.importing import ImportRefused
from mmodel.tests import registry_fixtures
from mmodel.tests.tiny_gguf import tiny_gguf

tiny_source = registry_fixtures.tiny_source
tiny_copy = registry_fixtures.tiny_copy


def refused(path, root, *, allow_pickle=False, pickle_allowed=False) -> str:
    with pytest.raises(ImportRefused) as caught:
        real = importing.locate(str(path), [str(root)])
        importing.inspect(real, roots=[str(root)], allow_pickle=allow_pickle,
                          pickle_allowed=pickle_allowed)
    return str(caught.value)


def test_a_good_folder_is_read_as_safetensors(tiny_copy, tmp_path):
    folder = tiny_copy(tmp_path / "m")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "junk.py").write_text("print('never read')")
    source = importing.inspect(importing.locate(str(folder), [str(tmp_path)]),
                               roots=[str(tmp_path)], allow_pickle=False, pickle_allowed=False)
    assert source.format == "safetensors"
    assert "model.safetensors" in source.files and "tokenizer.json" in source.files
    assert not any(name.startswith(".cache") for name in source.files)


def test_paths_outside_the_roots_are_refused_even_through_a_link(tiny_copy, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tiny_copy(tmp_path / "elsewhere")
    assert "outside the import roots" in refused(outside, root)
    (root / "link").symlink_to(outside)
    message = refused(root / "link", root)
    assert "outside the import roots" in message and str(outside) in message
    assert refused(root / "nothing-here", root) == f"{root / 'nothing-here'} does not exist."
    assert "absolute path" in refused("relative/path", root)


def test_a_file_linked_from_outside_the_roots_is_refused(tiny_copy, tmp_path):
    root = tmp_path / "root"
    folder = tiny_copy(root / "m")
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    os.symlink(secret, folder / "extra.json")
    assert "extra.json links outside the import roots" in refused(folder, root)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda f: (f / "modeling_evil.py").write_text("import os"),
     "modeling_evil.py is Python code"),
    (lambda f: _edit_json(f / "config.json", auto_map={"AutoModel": "evil.Model"}),
     "config.json names code of its own (auto_map)"),
    (lambda f: _edit_json(f / "tokenizer_config.json", auto_map={"AutoTokenizer": ["x", None]}),
     "tokenizer_config.json names code of its own (auto_map)"),
    (lambda f: (f / "tokenizer.json").unlink(), "No tokenizer"),
    (lambda f: (f / "config.json").unlink(), "No config.json"),
    (lambda f: (f / "model.safetensors").unlink(), "No weights"),
])
def test_refusals_name_their_reason(tiny_copy, tmp_path, change, expected):
    folder = tiny_copy(tmp_path / "m")
    change(folder)
    assert expected in refused(folder, tmp_path)


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_pickle_needs_the_request_and_the_operator(tiny_copy, tmp_path):
    folder = tiny_copy(tmp_path / "m")
    torch.save({"x": torch.zeros(1)}, folder / "pytorch_model.bin")
    message = refused(folder, tmp_path, allow_pickle=True, pickle_allowed=False)
    assert "pytorch_model.bin holds pickle weights" in message
    assert "an operator must set OGAI_MODEL_ALLOW_PICKLE" in message
    assert "set allow_pickle on the import" in refused(folder, tmp_path, pickle_allowed=True)
    source = importing.inspect(folder, roots=[str(tmp_path)], allow_pickle=True,
                               pickle_allowed=True)
    # Beside safetensors the pickle file is never read nor copied.
    assert source.format == "safetensors" and "pytorch_model.bin" not in source.files


def test_several_gguf_files_must_be_named_and_an_adapter_is_not_imported(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (folder / name).write_bytes(b"GGUF" + bytes(16))
    assert "several GGUF files (a.gguf, b.gguf)" in refused(folder, tmp_path)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file")
    assert "fake.gguf is not a GGUF file" in refused(fake, tmp_path)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert "LoRA adapter" in refused(adapter, tmp_path)


def test_weights_are_checked_against_the_config(tiny_copy, tmp_path):
    folder = tiny_copy(tmp_path / "m")
    _, tensors = importing.check_weights(folder)
    assert importing.parameter_count(tensors) == sum(
        t.numel() for t in load_file(str(folder / "model.safetensors")).values())
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.1.mlp.up_proj.renamed"] = weights.pop("model.layers.1.mlp.up_proj.weight")
    weights["model.norm.weight"] = torch.ones(7)
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ImportRefused) as caught:
        importing.check_weights(folder)
    message = str(caught.value)
    assert "missing tensors: model.layers.1.mlp.up_proj.weight" in message
    assert "unexpected tensors: model.layers.1.mlp.up_proj.renamed" in message
    assert "model.norm.weight (file [7], model [32])" in message


def test_sharded_weights_and_a_truncated_file(tiny_copy, tmp_path):
    folder = tiny_copy(tmp_path / "m")
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[:5],
              "model-00002-of-00002.safetensors": names[5:]}
    for shard, keys in halves.items():
        save_file({k: weights[k] for k in keys}, str(folder / shard))
    index = {"metadata": {}, "weight_map": {k: s for s, keys in halves.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _, tensors = importing.check_weights(folder)
    assert set(tensors) == set(weights)

    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ImportRefused, match=r"model-00002-of-00002\.safetensors is truncated"):
        importing.check_weights(folder)


def test_a_gguf_file_converts_to_the_same_weights_and_tokenizer(tiny_source, tmp_path):
    from transformers import AutoTokenizer

    gguf = tiny_gguf(tiny_source, tmp_path / "in" / "tiny.gguf")
    source = importing.inspect(importing.locate(str(gguf.parent), [str(tmp_path)]),
                               roots=[str(tmp_path)], allow_pickle=False, pickle_allowed=False)
    assert (source.format, source.gguf_file) == ("gguf", "tiny.gguf")
    out = tmp_path / "out"
    out.mkdir()
    description = importing.prepare_model(source, out, progress=lambda step: None)
    assert (description.architecture, description.model_type) == ("LlamaForCausalLM", "llama")
    assert description.context_length == 256 and description.dtype == "float32"
    assert any("chat template" in note for note in description.notes)
    original = load_file(str(tiny_source / "model.safetensors"))
    converted = load_file(str(out / "model.safetensors"))
    assert set(converted) == set(original)
    assert all(torch.equal(original[name], converted[name]) for name in original)
    text = "Paris is the capital of France. 1 2 3"
    assert AutoTokenizer.from_pretrained(str(out))(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(str(tiny_source))(text)["input_ids"]
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == importing.PLAIN_CHAT_TEMPLATE
