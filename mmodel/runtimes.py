"""The model server each runtime runs for one replica, by the kind of cluster it runs on.

On the local driver a replica is a process of this machine: `transformers serve` from the
platform's own environment (its interpreter, `-m transformers.cli.transformers`, so no console
script has to be on PATH), `vllm serve` only from the environment an operator names in
OGAI_VLLM_COMMAND (vLLM cannot be installed beside the platform's CPU torch). On a driver whose
nodes pick a service's port (Slurm's) the replica is a process of a node, in the nodes' own
environment (the platform's `python`, vLLM at OGAI_VLLM_COMMAND there too), answering on every
address at the port its node gives it. Anywhere else the replica is a container: the vLLM
image, or an image with transformers[serving] (OGAI_TRANSFORMERS_IMAGE), each answering on
SERVER_PORT.

Every server requires its deployment's key (`Authorization: Bearer`) on all but `/health`, read
from the environment variable `key_env` (the replica's job gets it in its secret environment,
never in its command): vLLM from VLLM_API_KEY, its own mechanism; transformers serve, which has
none, behind `mmodel.runners.serve_transformers`, which checks it in the same process.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError

from mmodel.choices import Runtime
from mmodel.runners import replica_guard, serve_embeddings, serve_pool, serve_transformers
from podsys.drivers import DriverError, driver_class
from podsys.drivers.base import SERVICE_PORT_ARG

SERVER_PORT = 8000  # inside a container
# transformers' continuous batching stores the KV cache in pages of this many tokens (its
# default), one page per layer in each block.
PAGE_TOKENS = 256
# On CPU the KV cache is sized from the replica's memory (by default transformers sizes it from
# the whole machine's RAM): this share of it, within these bounds.
KV_SHARE_OF_MEMORY = 0.25
MIN_BLOCKS, MAX_BLOCKS, DEFAULT_BLOCKS = 4, 1024, 64
CPU_BATCH_TOKENS = 1024
GPU_KV_MEMORY_PERCENT = 0.8
# vLLM's own: the key, like --api-key, but out of the command line.
VLLM_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True)
class ServerSpec:
    """What a replica's job runs: `command` with `env` (in `image` where the cluster runs
    images), answering on `port` (0: the one its node gives it) under the model name
    `served_model` to requests with the key it reads from the environment variable
    `key_env`."""

    command: list[str]
    port: int
    served_model: str
    key_env: str
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolEntry:
    """A model a pool serves beside its base, under `name`: a LoRA adapter of the base, or a
    whole model."""

    name: str
    folder: Path
    adapter: bool


@dataclass(frozen=True)
class ServeTarget:
    """What to serve: a folder of weights, and a LoRA adapter folder on top of it for runtimes
    that apply adapters themselves (vLLM); `attach`: an adapter that is never merged (a tuned
    prompt), which the transformers runtime loads on its base itself. A pool serves `folder`
    and every entry of `pool`, holding whole models within `pool_memory_mib` and at most
    `max_loras` adapters at once."""

    folder: Path
    adapter: Path | None = None
    attach: bool = False
    pool: tuple[PoolEntry, ...] = ()
    pool_memory_mib: int = 0
    max_loras: int = 8

    def folders(self) -> list[Path]:
        return [self.folder, *([self.adapter] if self.adapter else []),
                *(entry.folder for entry in self.pool)]


def runs_locally(cluster_driver: str) -> bool:
    """The local driver runs the command in this machine's environment."""
    return cluster_driver == "local"


def runs_on_nodes(cluster_driver: str) -> bool:
    """The driver runs the command in its nodes' own environment, at a port the node picks
    (Slurm's); the others (Kubernetes, and the fake one, which stands for a cluster) run it
    in an image."""
    try:
        return driver_class(cluster_driver).assigns_ports
    except DriverError:
        return False


def runs_images(cluster_driver: str) -> bool:
    return not runs_locally(cluster_driver) and not runs_on_nodes(cluster_driver)


def check_runtime(runtime: str, cluster_driver: str) -> None:
    """Refuse, in words, a runtime that cannot run on this kind of cluster."""
    if runtime == Runtime.VLLM:
        if not runs_images(cluster_driver) and not settings.OGAI_VLLM_COMMAND:
            where = "here" if runs_locally(cluster_driver) else "on the nodes"
            raise ValidationError({"runtime": (
                f"vLLM is not installed {where}: set OGAI_VLLM_COMMAND to the vllm executable "
                "of its own environment, or use the transformers runtime")})
        if runs_images(cluster_driver) and not settings.OGAI_VLLM_IMAGE:
            raise ValidationError({"runtime": "No vLLM image is configured: set "
                                   "OGAI_VLLM_IMAGE, or use the transformers runtime."})
    elif runtime == Runtime.TRANSFORMERS:
        if cluster_driver == "kubernetes" and not settings.OGAI_TRANSFORMERS_IMAGE:
            raise ValidationError({"runtime": (
                "No image for the transformers runtime is configured: set "
                "OGAI_TRANSFORMERS_IMAGE to an image with transformers[serving], or use vLLM")})
    else:
        raise ValidationError({"runtime": f"Unknown runtime {runtime!r}."})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_spec(*, runtime: str, cluster_driver: str, target: ServeTarget, name: str,
                gpus: int, cpu: float, memory_mib: int) -> ServerSpec:
    """The server of one replica. `name` is the deployment's name (the model name vLLM is told
    to answer to); a local replica gets a free port of this machine."""
    check_runtime(runtime, cluster_driver)
    local, images = runs_locally(cluster_driver), runs_images(cluster_driver)
    port = free_port() if local else SERVER_PORT if images else 0
    # A pod answers its Service; a node's process the platform's host.
    host = "127.0.0.1" if local else "0.0.0.0"  # noqa: S104
    port_arg = str(port) if port else SERVICE_PORT_ARG
    threads = str(max(1, math.ceil(cpu)))
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           # A CUDA image shows every GPU of the node unless told otherwise.
           **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})}
    embeds = target.adapter is None and is_embedding_model(target.folder)
    if target.pool:
        return _pool(target, runtime=runtime, name=name, host=host, port=port,
                     port_arg=port_arg, gpus=gpus, local=local, images=images, env=env)
    if runtime == Runtime.VLLM:
        if target.attach:
            raise ValueError("vLLM cannot serve prompt-tuning adapters")
        if embeds:
            raise ValueError("embedding models are served by the transformers runtime")
        return _vllm(target, name=name, host=host, port=port, gpus=gpus, images=images,
                     env=env)
    if target.adapter is not None and not target.attach:
        raise ValueError("transformers serves LoRA adapters merged into their base "
                         "(mmodel.merge)")
    if embeds:
        return _embeddings(target, host=host, port_arg=port_arg, port=port, gpus=gpus,
                           local=local, images=images, env=env)
    launcher = _launcher(serve_transformers, local=local, images=images)
    if target.attach and target.adapter is not None:
        # The launcher loads the adapter folder as PEFT's model on its base (the base's folder,
        # as adapter_config.json names it). Continuous batching runs the base model's forward
        # alone, which would drop the prompt: generate() prepends it.
        served = target.adapter
        batching = [serve_transformers.ATTACH_FLAG]
    else:
        served = target.folder
        batching = ["--continuous-batching",
                    *_kv_cache_args(target.folder, gpus=gpus, memory_mib=memory_mib)]
    command = [*launcher,
               "serve", str(served), "--host", host, "--port", port_arg,
               "--device", "cuda" if gpus else "cpu", *batching,
               "--log-level", "warning"]
    # transformers serve names the model by the path it was given.
    return ServerSpec(command=command, port=port, served_model=str(served),
                      key_env=replica_guard.KEY_ENV,
                      image=settings.OGAI_TRANSFORMERS_IMAGE if images else "", env=env)


def _launcher(module, *, local: bool, images: bool) -> list[str]:
    """How a replica runs a runner module: an image has transformers but not the platform, so
    there the module goes as its source text."""
    if local:
        return [sys.executable, "-m", module.__name__]
    if images:
        return ["python", "-c", _launcher_source(module)]
    return ["python", "-m", module.__name__]


RUNNER_IMPORT = re.compile(r"^from mmodel\.runners\.(\w+) import [\w, ]+\n", re.MULTILINE)


@cache
def _launcher_source(module) -> str:
    """A runner as one program: the text of each runner module it imports (the key guard, and
    any other: they import none but the standard library, torch and transformers), then the
    runner's without those imports."""
    text = Path(module.__file__).read_text()
    if replica_guard.IMPORT_LINE not in text:
        raise ValueError(f"{module.__name__} does not import the key guard")
    folder = Path(replica_guard.__file__).parent
    parts = [(folder / f"{name}.py").read_text()
             for name in dict.fromkeys(RUNNER_IMPORT.findall(text))]
    return "\n\n".join([*parts, RUNNER_IMPORT.sub("", text)])


def is_embedding_model(folder: Path) -> bool:
    """A sentence-transformers folder (its modules: transformer, pooling, …): served at
    /v1/embeddings by mmodel.runners.serve_embeddings."""
    return (Path(folder) / "modules.json").is_file()


def _embeddings(target: ServeTarget, *, host: str, port_arg: str, port: int, gpus: int,
                local: bool, images: bool, env: dict[str, str]) -> ServerSpec:
    launcher = _launcher(serve_embeddings, local=local, images=images)
    command = [*launcher, str(target.folder), "--host", host, "--port", port_arg,
               "--device", "cuda" if gpus else "cpu", "--log-level", "warning"]
    return ServerSpec(command=command, port=port, served_model=str(target.folder),
                      key_env=replica_guard.KEY_ENV,
                      image=settings.OGAI_TRANSFORMERS_IMAGE if images else "", env=env)


def _pool(target: ServeTarget, *, runtime: str, name: str, host: str, port: int,
          port_arg: str, gpus: int, local: bool, images: bool,
          env: dict[str, str]) -> ServerSpec:
    """The base under the deployment's name, each entry under its own."""
    adapters = [entry for entry in target.pool if entry.adapter]
    if runtime == Runtime.VLLM:
        if len(adapters) < len(target.pool):
            raise ValueError("vLLM pools LoRA adapters of its base, not whole models")
        program = ["vllm"] if images else shlex.split(settings.OGAI_VLLM_COMMAND)
        command = [*program, "serve", str(target.folder), "--host", host, "--port", port_arg,
                   "--served-model-name", name]
        if gpus > 1:
            command += ["--tensor-parallel-size", str(gpus)]
        command += ["--enable-lora", "--max-loras", str(target.max_loras),
                    # Every adapter stays in host memory; max_loras of them on the GPU.
                    "--max-cpu-loras", str(max(target.max_loras, len(adapters))),
                    "--max-lora-rank", str(vllm_lora_rank(entry.folder for entry in adapters)),
                    "--lora-modules", *(f"{entry.name}={entry.folder}" for entry in adapters)]
        return ServerSpec(command=command, port=port, served_model=name,
                          key_env=VLLM_KEY_ENV,
                          image=settings.OGAI_VLLM_IMAGE if images else "", env=env)
    command = [*_launcher(serve_pool, local=local, images=images),
               "--base", f"{name}={target.folder}"]
    for entry in target.pool:
        command += ["--adapter" if entry.adapter else "--model", f"{entry.name}={entry.folder}"]
    command += ["--memory-budget-mib", str(target.pool_memory_mib),
                "--max-loras", str(target.max_loras), "--host", host, "--port", port_arg,
                "--device", "cuda" if gpus else "cpu", "--log-level", "warning"]
    return ServerSpec(command=command, port=port, served_model=name,
                      key_env=replica_guard.KEY_ENV,
                      image=settings.OGAI_TRANSFORMERS_IMAGE if images else "", env=env)


VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(folders) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds every adapter's `r`."""
    ranks = [16]
    for folder in folders:
        try:
            ranks.append(int(json.loads((Path(folder) / "adapter_config.json").read_text())
                             .get("r") or 0))
        except (OSError, ValueError, TypeError):
            continue
    return next((rank for rank in VLLM_LORA_RANKS if rank >= max(ranks)), VLLM_LORA_RANKS[-1])


def _vllm(target: ServeTarget, *, name: str, host: str, port: int, gpus: int, images: bool,
          env: dict[str, str]) -> ServerSpec:
    program = ["vllm"] if images else shlex.split(settings.OGAI_VLLM_COMMAND)
    # With an adapter the base answers under another name and the adapter under the
    # deployment's: requests name the adapter.
    base_name = f"{name}-base" if target.adapter is not None else name
    command = [*program, "serve", str(target.folder), "--host", host,
               "--port", str(port) if port else SERVICE_PORT_ARG, "--served-model-name", base_name]
    if gpus > 1:
        command += ["--tensor-parallel-size", str(gpus)]
    if target.adapter is not None:
        command += ["--enable-lora", "--lora-modules", f"{name}={target.adapter}"]
    # vLLM checks the key on its /v1 routes; /health stays open.
    return ServerSpec(command=command, port=port, served_model=name, key_env=VLLM_KEY_ENV,
                      image=settings.OGAI_VLLM_IMAGE if images else "", env=env)


def _kv_cache_args(folder: Path, *, gpus: int, memory_mib: int) -> list[str]:
    """Always bounded: on a GPU a share of its memory (the replica's own GPUs); on CPU a number
    of blocks that fits a share of the replica's memory, from the model's shape."""
    if gpus:
        return ["--cb-max-memory-percent", str(GPU_KV_MEMORY_PERCENT)]
    block_bytes = kv_block_bytes(folder)
    if block_bytes is None:
        blocks = DEFAULT_BLOCKS
    else:
        budget = memory_mib * 2**20 * KV_SHARE_OF_MEMORY
        blocks = max(MIN_BLOCKS, min(MAX_BLOCKS, int(budget // block_bytes)))
    return ["--cb-num-blocks", str(blocks), "--cb-max-batch-tokens", str(CPU_BATCH_TOKENS)]


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def kv_block_bytes(folder: Path) -> int | None:
    """Bytes of one KV-cache block (keys and values of PAGE_TOKENS tokens in every layer), from
    config.json; None when the config does not say."""
    try:
        config = json.loads((folder / "config.json").read_text())
        config = config.get("text_config", config)
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError):
        return None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return 2 * layers * kv_heads * head_dim * PAGE_TOKENS * DTYPE_BYTES.get(dtype, 4)
