"""The embeddings runtime (mmodel/runners/serve_embeddings.py) as a replica runs it: its vectors
are sentence-transformers' own, in both encodings, concurrent requests share model calls, and
it answers only the gateway's key."""

import base64
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from mmodel.runners.serve_embeddings import texts_of
from mmodel.tests.minilm import minilm_folder

KEY = "replica-key"
TEXTS = ["The GPU ran out of memory while loading the checkpoint.",
         "NCCL timed out waiting for rank 3.", "A cat sat on the mat."]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = {**os.environ, "OGAI_REPLICA_API_KEY": KEY, "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mmodel.runners.serve_embeddings", str(minilm_folder()),
         "--port", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "the embeddings server exited"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the embeddings server did not start"
        time.sleep(0.3)
    yield url
    process.terminate()
    process.wait(15)


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)


def embed(url, body, key=KEY):
    return httpx.post(f"{url}/v1/embeddings", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"})


def test_vectors_are_sentence_transformers_own_in_both_encodings(server, reference):
    answer = embed(server, {"model": "minilm", "input": TEXTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    got = np.array([item["embedding"] for item in body["data"]])
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    assert got.shape == (3, 384)
    assert np.abs(got - expected).max() < 1e-5
    tokens = int(reference.preprocess(TEXTS)["attention_mask"].sum())
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    # The same texts packed: the same float32 values, bit for bit (a text's vector in
    # another batch may differ in its last bits, as the model's own do).
    packed = embed(server, {"model": "minilm", "input": TEXTS,
                            "encoding_format": "base64"}).json()
    for item, plain in zip(packed["data"], body["data"], strict=True):
        vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert np.array_equal(vector, np.array(plain["embedding"], dtype="<f4"))


def test_concurrent_requests_share_model_calls_and_each_gets_its_own(server, reference):
    texts = [f"request number {i} about shard {i * 7}" for i in range(24)]
    before = httpx.get(f"{server}/health").json()
    with ThreadPoolExecutor(max_workers=24) as pool:
        answers = list(pool.map(lambda text: embed(server, {"model": "m", "input": text}),
                                texts))
    after = httpx.get(f"{server}/health").json()
    got = np.array([answer.json()["data"][0]["embedding"] for answer in answers])
    assert np.abs(got - reference.encode(texts, convert_to_numpy=True)).max() < 1e-5
    assert after["texts"] - before["texts"] == 24
    assert after["batches"] - before["batches"] < 24  # some requests shared a model call


def test_only_the_gateways_key_and_clear_refusals(server):
    assert embed(server, {"input": "x"}, key="wrong").status_code == 401
    assert httpx.post(f"{server}/v1/embeddings", json={"input": "x"}).status_code == 401
    for body, param in (({"input": []}, "input"), ({"input": [101, 2023]}, "input"),
                        ({"input": ""}, "input"),
                        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                        ({"input": "x", "dimensions": 64}, "dimensions")):
        refused = embed(server, body)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["param"] == param


def test_input_shapes():
    assert texts_of({"input": "one"}) == ["one"]
    assert texts_of({"input": ["a", "b"]}) == ["a", "b"]
    with pytest.raises(ValueError, match="at most 2048"):
        texts_of({"input": ["x"] * 2049})
