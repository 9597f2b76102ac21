"""The server command of each runtime, by the kind of cluster it runs on."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from mmodel.runners import serve_embeddings, serve_pool, serve_transformers
from mmodel.runtimes import (
    CPU_BATCH_TOKENS,
    MAX_BLOCKS,
    PAGE_TOKENS,
    SERVER_PORT,
    ServeTarget,
    _launcher_source,
    check_runtime,
    kv_block_bytes,
    server_spec,
)
from mmodel.tests.tiny import tiny_model
from podsys.drivers.base import SERVICE_PORT_ARG


def arg(command, flag):
    return command[command.index(flag) + 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("runtimes") / "tiny")


def spec(runtime="transformers", driver="local", folder=Path("/models/m"), **kwargs):
    values = {"gpus": 0, "cpu": 2.0, "memory_mib": 4096, "name": "chat", **kwargs}
    target = values.pop("target", ServeTarget(folder))
    return server_spec(runtime=runtime, cluster_driver=driver, target=target, **values)


def test_transformers_locally_runs_from_the_platforms_interpreter_with_a_bounded_cache(tiny):
    server = spec(folder=tiny, cpu=2.5, memory_mib=1024)
    command = server.command
    # Behind the launcher that requires the deployment's key, read from the environment.
    assert command[:4] == [sys.executable, "-m", "mmodel.runners.serve_transformers", "serve"]
    assert server.key_env == "OGAI_REPLICA_API_KEY" and server.key_env not in server.env
    assert command[4] == str(tiny) and server.served_model == str(tiny)
    assert arg(command, "--host") == "127.0.0.1" and int(arg(command, "--port")) == server.port
    assert arg(command, "--device") == "cpu" and "--continuous-batching" in command
    # Keys and values of 2 layers x 2 KV heads x 8 dims, fp32, per page of 256 tokens.
    assert kv_block_bytes(tiny) == 2 * 2 * 2 * 8 * PAGE_TOKENS * 4
    assert arg(command, "--cb-num-blocks") == str(MAX_BLOCKS)  # tiny: the cap, not all RAM
    assert arg(command, "--cb-max-batch-tokens") == str(CPU_BATCH_TOKENS)
    assert server.image == "" and server.env["OMP_NUM_THREADS"] == "3"
    assert server.env["HF_HUB_OFFLINE"] == "1" and server.env["CUDA_VISIBLE_DEVICES"] == ""
    assert spec(folder=tiny).port != server.port  # each replica its own port


def test_the_kv_cache_fits_a_share_of_the_replicas_memory(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    # A 30-layer model with 3 KV heads of 64 dims in bfloat16: 5.9 MB a block.
    (folder / "config.json").write_text(
        '{"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, '
        '"hidden_size": 576, "torch_dtype": "bfloat16"}')
    block = 2 * 30 * 3 * 64 * PAGE_TOKENS * 2
    assert kv_block_bytes(folder) == block
    command = spec(folder=folder, memory_mib=2048).command
    assert int(arg(command, "--cb-num-blocks")) == int(2048 * 2**20 * 0.25 // block)
    assert arg(spec(folder=tmp_path / "none").command, "--cb-num-blocks") == "64"


@pytest.mark.slow
def test_the_transformers_command_is_one_the_installed_cli_accepts(tiny, settings):
    settings.OGAI_TRANSFORMERS_IMAGE = "registry.example/serving:5.24"
    local = spec(folder=tiny).command
    # In an image: its python runs the launcher's text (here the platform's stands for it).
    in_image = [sys.executable, *spec(folder=tiny, driver="kubernetes").command[1:]]
    for command in (local, in_image):
        # The same program and options, asked for help instead of serving: all exist.
        probe = [*command[:command.index("serve") + 1], "--help"]
        shown = subprocess.run(probe, capture_output=True, text=True, timeout=120,
                               env={"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                                    "COLUMNS": "200", "PATH": "/usr/bin:/bin",
                                    "OGAI_REPLICA_API_KEY": "k"}).stdout
        for option in [part for part in command[command.index("serve") + 2:]
                       if part.startswith("--")]:
            assert option in shown, option


def test_with_gpus_transformers_uses_cuda_and_a_share_of_gpu_memory():
    server = spec(gpus=1)
    assert arg(server.command, "--device") == "cuda"
    assert "--cb-max-memory-percent" in server.command and "--cb-num-blocks" not in server.command
    assert "CUDA_VISIBLE_DEVICES" not in server.env


def test_in_an_image_the_server_answers_on_the_fixed_port(settings):
    settings.OGAI_TRANSFORMERS_IMAGE = "registry.example/serving:5.24"
    server = spec(driver="kubernetes")
    # The image has transformers, not the platform: the launcher comes as its source.
    assert server.command[:2] == ["python", "-c"] and server.command[3] == "serve"
    assert server.command[2] == _launcher_source(serve_transformers)
    assert server.image == "registry.example/serving:5.24"
    assert server.port == SERVER_PORT and arg(server.command, "--host") == "0.0.0.0"  # noqa: S104

    settings.OGAI_TRANSFORMERS_IMAGE = ""
    with pytest.raises(ValidationError) as caught:
        check_runtime("transformers", "kubernetes")
    assert "OGAI_TRANSFORMERS_IMAGE" in caught.value.message_dict["runtime"][0]


def test_on_slurm_the_server_is_a_nodes_process_on_the_port_its_node_gives_it(settings):
    settings.OGAI_TRANSFORMERS_IMAGE = "registry.example/serving:5.24"  # not for Slurm's nodes
    server = spec(driver="slurm")
    # The nodes' own environment: the platform's `python` (the driver puts it first on PATH).
    assert server.command[:4] == ["python", "-m", "mmodel.runners.serve_transformers", "serve"]
    assert server.image == "" and server.port == 0
    # On every address (the platform's host reaches it), at the port the node picks.
    assert arg(server.command, "--host") == "0.0.0.0"  # noqa: S104
    assert arg(server.command, "--port") == SERVICE_PORT_ARG

    settings.OGAI_VLLM_COMMAND = ""
    with pytest.raises(ValidationError) as caught:
        spec("vllm", driver="slurm")
    assert caught.value.message_dict["runtime"][0].startswith(
        "vLLM is not installed on the nodes: set OGAI_VLLM_COMMAND")
    settings.OGAI_VLLM_COMMAND = "/opt/vllm/bin/vllm"
    server = spec("vllm", driver="slurm")
    assert server.command[:2] == ["/opt/vllm/bin/vllm", "serve"] and server.image == ""
    assert arg(server.command, "--port") == SERVICE_PORT_ARG


def test_vllm_locally_needs_its_own_environment(settings):
    settings.OGAI_VLLM_COMMAND = ""
    with pytest.raises(ValidationError) as caught:
        spec("vllm")
    assert caught.value.message_dict["runtime"][0].startswith("vLLM is not installed here")
    settings.OGAI_VLLM_COMMAND = "/opt/vllm/bin/python -m vllm.entrypoints.cli.main"
    server = spec("vllm", gpus=2)
    assert server.command[:4] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main",
                                  "serve"]
    assert arg(server.command, "--served-model-name") == "chat" == server.served_model
    assert arg(server.command, "--tensor-parallel-size") == "2"
    # Its own key mechanism, from the environment: never `--api-key` on the command line.
    assert server.key_env == "VLLM_API_KEY" and "--api-key" not in server.command


def test_vllm_serves_an_adapter_on_its_base(settings):
    settings.OGAI_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
    server = spec("vllm", driver="kubernetes", gpus=1,
                  target=ServeTarget(Path("/data/base"), adapter=Path("/data/lora")))
    assert server.image == "vllm/vllm-openai:v0.33.0"
    assert server.command[:3] == ["vllm", "serve", "/data/base"]
    assert "--enable-lora" in server.command
    assert arg(server.command, "--lora-modules") == "chat=/data/lora"
    assert arg(server.command, "--served-model-name") == "chat-base"
    assert server.served_model == "chat"  # requests name the adapter
    assert "--tensor-parallel-size" not in server.command  # one GPU: no parallelism


def test_unknown_runtimes_are_refused():
    with pytest.raises(ValidationError) as caught:
        check_runtime("llama.cpp", "local")
    assert "runtime" in caught.value.message_dict


def test_a_sentence_embedding_model_is_served_by_the_embeddings_runtime(settings):
    from mmodel.tests.minilm import minilm_folder

    folder = minilm_folder()
    server = spec(folder=folder)
    assert server.command[:4] == [sys.executable, "-m", "mmodel.runners.serve_embeddings",
                                  str(folder)]
    assert server.key_env == "OGAI_REPLICA_API_KEY" and server.served_model == str(folder)
    assert arg(server.command, "--device") == "cpu"
    assert int(arg(server.command, "--port")) == server.port
    settings.OGAI_TRANSFORMERS_IMAGE = "ogai/transformers:1"
    pod = spec(folder=folder, driver="kubernetes", gpus=1)
    assert pod.command[:2] == ["python", "-c"] and "class Batcher" in pod.command[2]
    assert pod.image == "ogai/transformers:1" and arg(pod.command, "--device") == "cuda"
    settings.OGAI_VLLM_COMMAND = "vllm"
    with pytest.raises(ValueError, match="transformers runtime"):
        spec(runtime="vllm", folder=folder)


@pytest.mark.parametrize(("module", "args"), [
    (serve_transformers, ["serve", "/models/x", "--port", "8000"]),
    (serve_embeddings, ["/models/x", "--port", "8000"]),
    (serve_pool, ["--base", "x=/models/x", "--memory-budget-mib", "64", "--port", "8000"]),
])
def test_an_images_runner_is_one_program_with_its_key_guard_and_no_platform_code(
        module, args, tmp_path):
    """What an image's `python -c` gets runs with the standard library alone (no site, so no
    platform code either) up to its refusal to start without the deployment's key."""
    source = _launcher_source(module)
    assert source.count("def guarded(") == 1
    done = subprocess.run([sys.executable, "-I", "-S", "-c", source, *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "OGAI_REPLICA_API_KEY is not set" in done.stderr, done.stderr
