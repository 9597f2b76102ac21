"""Presets, size and memory estimates, fit checks and train spec validation (ylink/presets.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from ylink.presets import (
    GIB,
    PRESETS,
    FitError,
    SpecError,
    check_fits,
    estimate_parameters,
    training_memory,
    validate_train_spec,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
@pytest.mark.parametrize(("preset", "vocab_size", "context_length"),
                         [("tiny", 257, 256), ("tiny", 4096, 64), ("small", 8192, 512)])
def test_parameter_estimate_matches_the_real_model(architecture, preset, vocab_size,
                                                   context_length):
    from transformers import AutoModelForCausalLM

    from ylink.runners.training.common import build_config

    config = build_config(architecture, preset, vocab_size, context_length, eos_id=0)
    real = AutoModelForCausalLM.from_config(config).num_parameters()
    estimate = estimate_parameters(architecture, preset, vocab_size,
                                   context_length=context_length)
    assert abs(estimate - real) / real < 0.02, (estimate, real)


def test_preset_sizes_are_what_their_names_say():
    assert estimate_parameters("gpt2", "tiny", 257) < 1_000_000
    assert estimate_parameters("llama", "tiny", 257) < 1_000_000
    assert 5e6 < estimate_parameters("gpt2", "small", 8192) < 15e6
    assert 120e6 < estimate_parameters("gpt2", "gpt2-124m", 50257) < 130e6
    assert 300e6 < estimate_parameters("gpt2", "350m", 50257) < 400e6
    assert 0.8e9 < estimate_parameters("llama", "1b", 50257) < 1.3e9
    assert 6.5e9 < estimate_parameters("llama", "7b", 32000) < 7.2e9
    assert set(PRESETS) >= {"tiny", "small", "gpt2-124m", "350m", "1b", "7b"}


def test_memory_estimate_counts_adam_state_and_shards_it():
    params = 1_000_000_000
    full = training_memory(params, "pretrain", "fp32")
    assert full["weights"] + full["gradients"] + full["optimizer"] == 16 * params
    sharded = training_memory(params, "pretrain", "fp32", shards=4)
    assert sharded["total"] == full["total"] // 4
    lora = training_memory(params, "lora", "fp32", trainable_parameters=1_000_000)
    assert lora["total"] == 4 * params + 12 * 1_000_000
    with_activations = training_memory(params, "pretrain", "bf16", batch_size=8,
                                       context_length=1024, hidden=2048, layers=16,
                                       vocab_size=50257)
    checkpointed = training_memory(params, "pretrain", "bf16", batch_size=8,
                                   context_length=1024, hidden=2048, layers=16,
                                   vocab_size=50257, gradient_checkpointing=True)
    assert with_activations["activations"] > checkpointed["activations"] > 0


def test_check_fits_refuses_7b_on_one_80gib_gpu_naming_numbers():
    with pytest.raises(FitError) as caught:
        check_fits(architecture="llama", preset="7b", vocab_size=32000, context_length=4096,
                   kind="pretrain", gpus=1, gpu_memory_mib=80 * 1024, cpu_memory_mib=None)
    error = caught.value
    assert error.field == "resources.gpus"
    assert "7b" in error.message and "80 GiB" in error.message
    assert "at least 2 GPUs with FSDP" in error.message
    # ~6.7B parameters x 16 bytes: the message names the state's size.
    assert "100 GiB" in error.message


def test_check_fits_accepts_7b_sharded_over_8_gpus_but_not_replicated():
    check_fits(architecture="llama", preset="7b", vocab_size=32000, context_length=4096,
               kind="pretrain", gpus=8, gpu_memory_mib=80 * 1024, cpu_memory_mib=None)
    with pytest.raises(FitError) as caught:
        check_fits(architecture="llama", preset="7b", vocab_size=32000, context_length=4096,
                   kind="pretrain", gpus=8, gpu_memory_mib=80 * 1024, cpu_memory_mib=None,
                   distributed="ddp")
    assert caught.value.field == "training.distributed"
    assert "fsdp" in caught.value.message


def test_check_fits_accepts_tiny_on_cpu_and_refuses_a_big_model_in_little_memory():
    assert check_fits(architecture="gpt2", preset="tiny", vocab_size=4096, context_length=256,
                      kind="pretrain", gpus=0, gpu_memory_mib=None,
                      cpu_memory_mib=2048) is None
    with pytest.raises(FitError) as caught:
        check_fits(architecture="gpt2", preset="1b", vocab_size=50257, context_length=None,
                   kind="pretrain", gpus=0, gpu_memory_mib=None, cpu_memory_mib=8192)
    assert caught.value.field == "resources.memory_mib"
    assert "8.0 GiB" in caught.value.message


def test_check_fits_lora_of_7b_fits_where_full_training_does_not():
    args = {"architecture": "llama", "preset": "7b", "vocab_size": 32000, "context_length": 2048,
            "gpus": 1, "gpu_memory_mib": 80 * 1024, "cpu_memory_mib": None, "batch_size": 4}
    check_fits(kind="lora", **args)
    with pytest.raises(FitError):
        check_fits(kind="sft", **args)


def test_check_fits_with_a_known_parameter_count_for_fine_tuning():
    with pytest.raises(FitError) as caught:
        check_fits(architecture="llama", preset=None, parameters=13_000_000_000,
                   vocab_size=32000, context_length=2048, kind="sft", gpus=1,
                   gpu_memory_mib=80 * 1024, cpu_memory_mib=None)
    assert "13.0B parameters" in caught.value.message
    assert 13e9 * 16 / GIB > 80


def _spec(**changes):
    spec = {"run": 3, "kind": "pretrain",
            "data": {"path": "/data/tokens", "format": "tokens"},
            "output_dir": "/data/out", "model": {"preset": "tiny"},
            "training": {"max_steps": 20}}
    spec.update(changes)
    return spec


def test_validate_fills_defaults_and_keeps_only_the_kinds_sections():
    spec = validate_train_spec(_spec(lora={"r": 8}))
    assert spec["training"]["batch_size"] == 8
    assert spec["training"]["max_steps"] == 20
    assert spec["training"]["precision"] == "auto"
    assert spec["model"] == {"preset": "tiny", "architecture": "gpt2", "context_length": None,
                             "vocab_size": None}
    assert "lora" not in spec and "tokenizer" not in spec
    lora = validate_train_spec({"kind": "lora", "data": {"path": "/d", "format": "jsonl"},
                                "output_dir": "/o", "base_model_path": "/m"})
    assert lora["lora"] == {"r": 8, "alpha": 16.0, "dropout": 0.05, "target_modules": None}


def test_validate_names_every_problem_by_its_place():
    with pytest.raises(SpecError) as caught:
        validate_train_spec(_spec(
            training={"lr": 5, "batch_size": True, "max_step": 3, "precision": "fp8"},
            model={"preset": "huge"}, output_dir="relative/out",
        ))
    errors = caught.value.errors
    assert errors["training.lr"] == "must be between 1e-08 and 1"
    assert errors["training.batch_size"] == "must be an integer"
    assert errors["training.max_step"].startswith("unknown setting 'max_step'; known: max_steps")
    assert "fp8" in errors["training.precision"] and "bf16" in errors["training.precision"]
    assert "huge" in errors["model.preset"] and "tiny" in errors["model.preset"]
    assert errors["output_dir"] == "must be an absolute path"


def test_validate_checks_kind_data_format_and_base_model():
    with pytest.raises(SpecError) as caught:
        validate_train_spec({"kind": "sft", "data": {"path": "/d", "format": "tokens"},
                             "output_dir": "/o", "trainig": {}})
    errors = caught.value.errors
    assert "jsonl" in errors["data.format"]
    assert errors["base_model_path"] == "is required"
    assert "unknown key 'trainig'" in errors["trainig"]
    with pytest.raises(SpecError) as caught:
        validate_train_spec({"kind": "dpo"})
    assert "pretrain" in caught.value.errors["kind"]
    with pytest.raises(SpecError) as caught:
        validate_train_spec({"kind": "lora", "data": {"path": "/d", "format": "jsonl"},
                             "output_dir": "/o", "base_model_path": "/m",
                             "training": {"distributed": "fsdp"}})
    assert "ddp" in caught.value.errors["training.distributed"]


def test_presets_module_imports_neither_torch_nor_django():
    code = ("import sys, ylink.presets; "
            "bad = [m for m in ('torch', 'django', 'transformers') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            check=False)
    assert result.returncode == 0, result.stderr
