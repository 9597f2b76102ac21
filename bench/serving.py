"""Throughput of the transformers runtime as deployments run it: 16 chat requests of 64 tokens
sent at once (continuous batching) against the same 16 sent one at a time.

The server is started with the exact command a local deployment replica gets
(`mmodel.runtimes.server_spec`: continuous batching, a KV cache bounded by the replica's
memory, OMP threads = the cores given), on a small random Llama built here (hidden 128,
4 layers, ~0.64M parameters). Every request asks for exactly N tokens: a generation config
without an end-of-sequence token, so a random model cannot stop early; the tokens counted are
the server's own `usage.completion_tokens`.

    .venv/bin/python bench/serving.py [--requests 16] [--tokens 64] [--threads N]

Last line: {"batched_tokens_s", "sequential_tokens_s", "ratio", ...}. Target: ratio >= 4.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_model(folder: Path) -> int:
    """The model folder; returns its parameter count."""
    from safetensors.torch import load_file

    from mmodel.tests.tiny import tiny_model

    tiny_model(folder, hidden=128, layers=4)
    return sum(tensor.numel() for tensor in load_file(folder / "model.safetensors").values())


def start_server(folder: Path, threads: int) -> tuple[subprocess.Popen, str, str, list[str]]:
    from mmodel.runtimes import ServeTarget, server_spec

    spec = server_spec(runtime="transformers", cluster_driver="local",
                       target=ServeTarget(folder), name="bench", gpus=0, cpu=threads,
                       memory_mib=4096)
    log = open(folder.parent / "server.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(spec.command, env={**os.environ, **spec.env},  # noqa: S603
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    upstream = f"http://127.0.0.1:{spec.port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{upstream}/health", timeout=2).status_code == 200:
                return process, upstream, spec.served_model, spec.command
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit("the server did not start:\n"
                             + (folder.parent / "server.log").read_text()[-3000:])
        time.sleep(0.25)


def chat(client: httpx.Client, upstream: str, model: str, index: int, tokens: int) -> int:
    response = client.post(f"{upstream}/v1/chat/completions", timeout=600, json={
        "model": model,
        "messages": [{"role": "user", "content": f"Request {index}: count from one to ten."}],
        "max_tokens": tokens,
        # No end-of-sequence token: exactly `tokens` tokens, greedy.
        "generation_config": json.dumps({"max_new_tokens": tokens, "do_sample": False}),
    })
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def sequential(upstream: str, model: str, requests: int, tokens: int) -> tuple[int, float]:
    with httpx.Client() as client:
        start = time.perf_counter()
        produced = sum(chat(client, upstream, model, i, tokens) for i in range(requests))
        return produced, time.perf_counter() - start


def batched(upstream: str, model: str, requests: int, tokens: int) -> tuple[int, float]:
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=requests)
    with httpx.Client(limits=limits) as client, ThreadPoolExecutor(requests) as pool:
        start = time.perf_counter()
        produced = sum(pool.map(lambda i: chat(client, upstream, model, i, tokens),
                                range(requests)))
        return produced, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="OMP threads of the server (default: every core)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        folder = Path(tmp) / "model"
        parameters = build_model(folder)
        process, upstream, model, command = start_server(folder, args.threads)
        try:
            chat(httpx.Client(), upstream, model, -1, 8)  # warm-up
            seq_tokens, seq_s = sequential(upstream, model, args.requests, args.tokens)
            print(f"sequential: {seq_tokens} tokens in {seq_s:.2f} s", flush=True)
            bat_tokens, bat_s = batched(upstream, model, args.requests, args.tokens)
            print(f"batched:    {bat_tokens} tokens in {bat_s:.2f} s", flush=True)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    batched_rate, sequential_rate = bat_tokens / bat_s, seq_tokens / seq_s
    print(json.dumps({
        "batched_tokens_s": round(batched_rate, 1),
        "sequential_tokens_s": round(sequential_rate, 1),
        "ratio": round(batched_rate / sequential_rate, 2),
        "requests": args.requests, "tokens_per_request": args.tokens,
        "completion_tokens_batched": bat_tokens, "completion_tokens_sequential": seq_tokens,
        "parameters": parameters, "threads": args.threads, "cores": os.cpu_count(),
        "kv_blocks": int(command[command.index("--cb-num-blocks") + 1]),
    }))


if __name__ == "__main__":
    main()
