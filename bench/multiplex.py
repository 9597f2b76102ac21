"""A pool of LoRA adapters on one replica against a deployment per fine-tune: 8 LoRA adapters
of one small base, served by one pool replica (`mmodel.runners.serve_pool`, as a local pool
deployment's replica runs it), against 8 separate replicas of the adapters merged into the
base (`transformers serve` with continuous batching, as a local deployment of a merged adapter
runs it), all on this machine.

The same requests go to both: `--requests` completions of `--tokens` tokens (greedy, the end
of text ignored so every request costs the same) whose adapter is drawn from a Zipf law
(`--zipf`: the k-th adapter's share is proportional to 1/k^s), sent by `--clients` clients at
once. The machine's cores are shared as a scheduler would share them: the pool's one replica
gets them all, each of the separate replicas its share (cores / adapters, so one OMP thread
each here, and no thread fights another for a core). Every replica gets `--memory-mib` of
memory, from which transformers serve sizes its KV cache (a quarter of it), as a deployment's
is.

- tokens/s: completion tokens (the servers' own usage) over the wall time of the whole run.
- memory: the peak resident memory (VmHWM) of every server process, summed.
- adapter_switch_ms_p99: the pool's own measure of a change of the adapters its running rows
  use (its /health): preparing the next forward pass for the new set. Loading an adapter
  from disk is apart (adapter_load_ms_p99).

The base is a random Llama built here (`--hidden`, `--layers`): no download. Each adapter is
a rank-16 LoRA of q, k, v and o with its own random weights.

    .venv/bin/python bench/multiplex.py [--adapters 8] [--requests 192] [--tokens 32]
                                        [--clients 16] [--zipf 1.1]

Last line: {"pool_tokens_s", "separate_tokens_s", "pool_memory_mb", "separate_memory_mb",
"adapter_switch_ms_p99", ...}. Target: pool memory <= 30% of the separate deployments', at
>= 0.8x their throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = ["The quick brown fox", "Paris is the capital of", "1 2 3 4 5 6",
           "A model answers questions; a benchmark", "Python is a programming language"]


def build_family(root: Path, adapters: int, hidden: int, layers: int) -> tuple[Path, list[Path],
                                                                              int]:
    """The base, its adapters, and the base's parameter count."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmodel.tests.tiny import tiny_model

    base = tiny_model(root / "base", hidden=hidden, layers=layers)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    folders = []
    for index in range(adapters):
        torch.manual_seed(1000 + index)
        fresh = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        config = LoraConfig(r=16, lora_alpha=32, init_lora_weights=False,
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        folder = root / f"tune-{index}"
        get_peft_model(fresh, config).save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        folders.append(folder)
    return base, folders, parameters


def merge(base: Path, adapter: Path, out: Path) -> Path:
    from mmodel.services.adapters import _merge_into

    _merge_into(base, adapter, out)
    return out


def launch(spec, logs: Path, label: str) -> tuple[subprocess.Popen, str]:
    log = open(logs / f"{label}.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(spec.command,  # noqa: S603
                               env={**os.environ, **spec.env, spec.key_env: KEY},
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{spec.port}"


def wait_healthy(servers: list[tuple[subprocess.Popen, str]], logs: Path) -> None:
    deadline = time.monotonic() + 300
    for process, upstream in servers:
        while True:
            try:
                if httpx.get(f"{upstream}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                stop_all(servers)
                tails = "\n".join(path.read_text()[-2000:] for path in logs.glob("*.log"))
                raise SystemExit(f"a server did not start:\n{tails}")
            time.sleep(0.25)


def peak_memory_mb(process: subprocess.Popen) -> float:
    """VmHWM of the process and its children, in MB."""
    total = 0
    pids = [process.pid]
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    if children.exists():
        pids += [int(pid) for pid in children.read_text().split()]
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total / 1e6


def workload(names: list[str], requests: int, zipf: float, seed: int) -> list[tuple[str, str]]:
    weights = [1 / (rank + 1) ** zipf for rank in range(len(names))]
    rng = random.Random(seed)  # noqa: S311 - a workload, not a secret
    return [(rng.choices(names, weights)[0], rng.choice(PROMPTS)) for _ in range(requests)]


def run(asks: list[tuple[str, str]], where: dict[str, tuple[str, str]], tokens: int,
        clients: int, pool: bool) -> tuple[int, float]:
    """(completion tokens, seconds): each ask to its server as that server names its model."""
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    with httpx.Client(limits=limits, timeout=600, headers=AUTH) as client:

        def one(ask: tuple[str, str]) -> int:
            name, prompt = ask
            upstream, model = where[name]
            body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
            if pool:
                body["ignore_eos"] = True
            else:  # transformers serve's own way to the same: no end of text, greedy
                body["generation_config"] = json.dumps({
                    "max_new_tokens": tokens, "do_sample": False, "eos_token_id": None})
            response = client.post(f"{upstream}/v1/completions", json=body)
            if response.status_code != 200:
                raise SystemExit(f"{name}: {response.status_code} {response.text[:500]}")
            return int(response.json()["usage"]["completion_tokens"])

        with ThreadPoolExecutor(clients) as workers:
            start = time.perf_counter()
            produced = sum(workers.map(one, asks))
            return produced, time.perf_counter() - start


def stop_all(servers: list[tuple[subprocess.Popen, str]]) -> None:
    for process, _ in servers:
        process.terminate()
    for process, _ in servers:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--memory-mib", type=int, default=1024,
                        help="memory of every replica (default 1024)")
    args = parser.parse_args()
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
    django.setup()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from mmodel.runtimes import PoolEntry, ServeTarget, server_spec

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-multiplex-") as tmp:
        root = Path(tmp)
        base, adapters, parameters = build_family(root, args.adapters, args.hidden, args.layers)
        names = [folder.name for folder in adapters]
        asks = workload(names, args.requests, args.zipf, args.seed)
        shares = {name: sum(1 for n, _ in asks if n == name) for name in names}
        print(f"base: {parameters / 1e6:.1f}M parameters; requests per adapter: {shares}",
              flush=True)

        target = ServeTarget(base, pool=tuple(PoolEntry(name=f.name, folder=f, adapter=True)
                                              for f in adapters),
                             pool_memory_mib=args.memory_mib // 2, max_loras=args.adapters)
        spec = server_spec(runtime="transformers", cluster_driver="local", target=target,
                           name="base", gpus=0, cpu=cores, memory_mib=args.memory_mib)
        servers = [launch(spec, root, "pool")]
        try:
            wait_healthy(servers, root)
            upstream = servers[0][1]
            where = {name: (upstream, name) for name in names}
            run([(name, PROMPTS[0]) for name in names], where, 4, 1, True)  # each once
            pool_tokens, pool_s = run(asks, where, args.tokens, args.clients, True)
            health = httpx.get(f"{upstream}/health").json()
            pool_memory = peak_memory_mb(servers[0][0])
        finally:
            stop_all(servers)
        print(f"pool: {pool_tokens} tokens in {pool_s:.1f} s, {pool_memory:.0f} MB, "
              f"{health['steps']} forward passes, switch p99 {health['switch_ms_p99']} ms",
              flush=True)

        servers, where = [], {}
        try:
            for folder in adapters:
                merged = merge(base, folder, root / f"merged-{folder.name}")
                spec = server_spec(runtime="transformers", cluster_driver="local",
                                   target=ServeTarget(merged), name=folder.name, gpus=0,
                                   cpu=cores / len(adapters), memory_mib=args.memory_mib)
                servers.append(launch(spec, root, f"separate-{folder.name}"))
                where[folder.name] = (servers[-1][1], spec.served_model)
            wait_healthy(servers, root)
            run([(name, PROMPTS[0]) for name in names], where, 4, 1, False)
            separate_tokens, separate_s = run(asks, where, args.tokens, args.clients, False)
            separate_memory = sum(peak_memory_mb(process) for process, _ in servers)
        except httpx.HTTPError as exc:
            dead = [path.read_text()[-3000:] for path, (process, _) in zip(
                sorted(root.glob("separate-*.log")), servers, strict=True)
                if process.poll() is not None]
            raise SystemExit(f"a separate server failed ({exc}):\n" + "\n".join(dead)) \
                from None
        finally:
            stop_all(servers)
        print(f"separate: {separate_tokens} tokens in {separate_s:.1f} s, "
              f"{separate_memory:.0f} MB", flush=True)

    pool_rate, separate_rate = pool_tokens / pool_s, separate_tokens / separate_s
    print(json.dumps({
        "pool_tokens_s": round(pool_rate, 1),
        "separate_tokens_s": round(separate_rate, 1),
        "pool_memory_mb": round(pool_memory, 1),
        "separate_memory_mb": round(separate_memory, 1),
        "adapter_switch_ms_p99": health["switch_ms_p99"],
        "throughput_ratio": round(pool_rate / separate_rate, 3),
        "memory_ratio": round(pool_memory / separate_memory, 3),
        "pool_steps": health["steps"], "pool_switches": health["switches"],
        "adapters": args.adapters, "requests": args.requests, "tokens_per_request": args.tokens,
        "clients": args.clients, "zipf": args.zipf, "base_parameters": parameters,
        "cores": cores, "replica_memory_mib": args.memory_mib,
        "adapter_load_ms_p99": health["adapter_load_ms_p99"],
        "meets_memory": pool_memory <= 0.3 * separate_memory,
        "meets_throughput": pool_rate >= 0.8 * separate_rate,
    }))


if __name__ == "__main__":
    main()
