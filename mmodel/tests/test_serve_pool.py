"""The pool runtime (mmodel.runners.serve_pool) in this process: LoRA adapters on one shared
base answer as each adapter alone does, and whole models are evicted and reloaded within the
memory budget without failing a request."""

import asyncio
import json
import queue
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mmodel.runners.serve_pool import Pending, Pool, build_app, weights_bytes
from mmodel.tests.test_deployments_adapters import lora_adapter
from mmodel.tests.tiny import tiny_model

torch = pytest.importorskip("torch")

KEY = "pool-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
PROMPTS = ["The quick brown fox", "Paris is the capital of", "1 2 3 4 5",
           "A model answers questions;"]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """A tiny base and four LoRA fine-tunes of it, each with its own weights."""
    root = tmp_path_factory.mktemp("family")
    base = tiny_model(root / "base")
    adapters = {f"tune-{index}": str(lora_adapter(base, root / f"tune-{index}", seed=index))
                for index in range(4)}
    return str(base), adapters


def alone(base: str, adapter: str | None, prompt: str, max_tokens: int,
          ignore_eos: bool = False) -> str:
    """Greedy text of the base with one adapter (or none), by PEFT directly."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False,
                             min_new_tokens=max_tokens if ignore_eos else None,
                             pad_token_id=tokenizer.pad_token_id)
    tokens = out[0, ids["input_ids"].shape[1]:].tolist()
    if not ignore_eos and tokenizer.eos_token_id in tokens:
        tokens = tokens[:tokens.index(tokenizer.eos_token_id)]
    return tokenizer.decode(tokens, skip_special_tokens=True)


def family_pool(family) -> Pool:
    """One replica's pool of the base and its four tunes, with room for all."""
    base, adapters = family
    return Pool(base=("base", base), models={}, adapters=adapters, budget_bytes=1 << 30,
                max_loras=4, device="cpu")


def in_own_loop(coroutine):
    """Run it in a thread of its own: a test before may leave this thread's loop running."""
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(asyncio.run, coroutine).result()


def client(pool: Pool) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(pool, KEY)),
                             base_url="http://pool", headers=HEADERS, timeout=60)


async def complete(http, model: str, prompt: str, max_tokens: int = 12, **extra) -> dict:
    response = await http.post("/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_four_lora_tunes_on_one_base_answer_as_each_adapter_alone(family):
    base, adapters = family
    expected = {(name, prompt): alone(base, folder, prompt, 12)
                for name, folder in [("base", None), *adapters.items()] for prompt in PROMPTS}
    # The adapters really differ: otherwise this test could not fail.
    assert len({expected[(name, PROMPTS[0])] for name in ["base", *adapters]}) > 1
    pool = family_pool(family)

    async def run():
        async with client(pool) as http:
            # Interleaved: every adapter and the base at once, each prompt, in mixed order.
            asks = [(name, prompt) for prompt in PROMPTS for name in [*adapters, "base"]]
            answers = await asyncio.gather(*(complete(http, name, prompt)
                                             for name, prompt in asks))
            health = (await http.get("/health")).json()
            return dict(zip(asks, answers, strict=True)), health

    answers, health = in_own_loop(run())
    for ask, answer in answers.items():
        assert answer["choices"][0]["text"] == expected[ask], ask
        assert answer["model"] == ask[0]
    assert health["holds"] == {"models": ["base"], "adapters": sorted(adapters)} or \
        sorted(health["holds"]["adapters"]) == sorted(adapters)
    assert health["loads"] == 1  # one copy of the base for all of them
    # Rows shared forward passes: alone, each would have taken one per token.
    assert health["steps"] < sum(a["usage"]["completion_tokens"] for a in answers.values())


def test_at_most_max_loras_adapters_are_held_and_an_unloaded_one_comes_back(family):
    base, adapters = family
    pool = Pool(base=("base", base), models={}, adapters=adapters, budget_bytes=1 << 30,
                max_loras=2, device="cpu")
    prompt = PROMPTS[1]

    async def run():
        async with client(pool) as http:
            texts = []
            for name in ["tune-0", "tune-1", "tune-2", "tune-0"]:
                texts.append((await complete(http, name, prompt))["choices"][0]["text"])
            return texts, (await http.get("/health")).json()

    texts, health = in_own_loop(run())
    assert texts[0] == texts[3] == alone(base, adapters["tune-0"], prompt, 12)
    assert texts[2] == alone(base, adapters["tune-2"], prompt, 12)
    assert sorted(health["holds"]["adapters"]) == ["tune-0", "tune-2"]
    # tune-0, 1 and 2 loaded; tune-0 unloaded for tune-2, so loaded again.
    assert health["adapter_loads"] == 4 and health["adapter_load_ms_p99"] > 0


def test_a_budget_for_two_models_serving_three_evicts_the_least_recently_used(tmp_path):
    folders = {name: str(tiny_model(tmp_path / name, seed=seed))
               for seed, name in enumerate(["one", "two", "three"])}
    size = weights_bytes(folders["one"])
    expected = {name: alone(folder, None, PROMPTS[0], 8) for name, folder in folders.items()}
    pool = Pool(base=("one", folders["one"]), models={"two": folders["two"],
                                                       "three": folders["three"]},
                adapters={}, budget_bytes=int(size * 2.5), max_loras=1, device="cpu")

    async def run():
        async with client(pool) as http:
            await complete(http, "one", PROMPTS[0], 8)
            await complete(http, "two", PROMPTS[0], 8)
            await complete(http, "one", PROMPTS[0], 8)  # "two" is now the least recent
            await complete(http, "three", PROMPTS[0], 8)
            held = (await http.get("/health")).json()["holds"]["models"]
            # All three at once, many times over: swaps under load, and none may fail.
            asks = [name for _ in range(4) for name in ["two", "three", "one"]]
            answers = await asyncio.gather(*(complete(http, name, PROMPTS[0], 8)
                                             for name in asks))
            return held, list(zip(asks, answers, strict=True)), \
                (await http.get("/health")).json()

    held, answers, health = in_own_loop(run())
    assert sorted(held) == ["one", "three"]  # "two" was evicted
    for name, answer in answers:
        assert answer["choices"][0]["text"] == expected[name]
    assert len(health["holds"]["models"]) == 2
    assert health["evictions"] >= 2 and health["loads"] >= 4  # "two" came back
    assert health["used_mib"] <= health["budget_mib"] or size * 2 <= int(size * 2.5)


def test_chat_streams_with_usage_and_bad_requests_are_refused(family):
    pool = family_pool(family)

    async def run():
        async with client(pool) as http:
            chunks = []
            async with http.stream("POST", "/v1/chat/completions", json={
                    "model": "tune-1", "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 6, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
            whole = await http.post("/v1/chat/completions", json={
                "model": "tune-1", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 6, "temperature": 0})
            unknown = await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
            bad = await http.post("/v1/completions", json={"model": "base", "prompt": "x",
                                                           "temperature": 9})
            too_long = await http.post("/v1/completions", json={
                "model": "tune-0", "prompt": "word " * 300, "max_tokens": 2})
            keyless = await http.post("/v1/completions", headers={"Authorization": "Bearer x"},
                                      json={"model": "base", "prompt": "x"})
            return chunks, whole.json(), unknown, bad, too_long, keyless

    chunks, whole, unknown, bad, too_long, keyless = in_own_loop(run())
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(chunk) for chunk in chunks[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in parsed if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert parsed[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] <= 6
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "model"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
    assert "reads at most 256" in too_long.json()["error"]["message"]
    assert keyless.status_code == 401


class _Letters:
    """A tokenizer whose token i is the i-th character of ALPHABET."""

    ALPHABET = "ab\nc"

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(self.ALPHABET[token] for token in tokens)


def test_a_stop_string_is_never_streamed_even_in_part():
    from mmodel.runners.serve_pool import Pending, Row

    events = []
    pending = Pending(model="m", prompt_ids=[1], max_tokens=10, sampling=(0, 1, None),
                      stops=["\n\n"], ignore_eos=False, emit=events.append)
    row = Row(pending, _Letters(), eos={99})
    for token in (0, 1, 2, 2, 3):  # a b \n \n (stop) c
        row.add(token)
    assert "".join(event[1] for event in events if event[0] == "text") == "ab"
    assert events[-1] == ("done", "stop", 4)


def test_a_request_joins_rows_already_decoding_and_leaves_before_them(family):
    """Continuous batching: a short request sent while a long one decodes does not wait for
    it, and each answers as it would alone."""
    base, adapters = family
    pool = family_pool(family)
    long_prompt, short_prompt = PROMPTS[0], PROMPTS[3]
    events: queue.Queue = queue.Queue()  # (model, event), in the order the worker sends them

    def send(model: str, prompt: str, max_tokens: int) -> None:
        ids = pool.tokenizer(model)(prompt)["input_ids"]
        pool.submit(Pending(model=model, prompt_ids=ids, max_tokens=max_tokens,
                            sampling=(0, 1.0, None), stops=[], ignore_eos=True,
                            emit=lambda event: events.put((model, event))))

    send("tune-0", long_prompt, 200)
    model, event = events.get(timeout=60)
    assert (model, event[0]) == ("tune-0", "text")  # it decodes: now the short ones come
    send("tune-1", short_prompt, 4)
    send("base", short_prompt, 4)
    text = {"tune-0": event[1]}
    ended = []
    while len(ended) < 3:
        model, event = events.get(timeout=60)
        if event[0] == "text":
            text[model] = text.get(model, "") + event[1]
        else:
            assert event[0] == "done", event
            ended.append((model, event[2]))
    assert ended[-1] == ("tune-0", 200)  # the short ones did not wait for the long one's end
    assert text["tune-1"] == alone(base, adapters["tune-1"], short_prompt, 4, ignore_eos=True)
    assert text["base"] == alone(base, None, short_prompt, 4, ignore_eos=True)
    assert text["tune-0"] == alone(base, adapters["tune-0"], long_prompt, 200, ignore_eos=True)
    health = pool.health()
    assert health["rows"] == 3 and health["steps"] < 200 + 4 + 4  # they shared steps


def test_each_row_samples_with_its_own_settings_and_seed(family):
    base, adapters = family
    pool = family_pool(family)

    async def run():
        async with client(pool) as http:
            def sampled(seed):
                return complete(http, "tune-2", PROMPTS[1], 16, temperature=1.5, seed=seed,
                                ignore_eos=True)

            # In one batch: greedy rows beside sampled ones with seeds, twice over.
            first = await asyncio.gather(sampled(7), sampled(8),
                                         complete(http, "tune-2", PROMPTS[1], 16))
            second = await asyncio.gather(complete(http, "tune-3", PROMPTS[2], 16),
                                          sampled(8), sampled(7))
            return first, second

    (seven, eight, greedy), (_, eight_again, seven_again) = in_own_loop(run())
    text = [answer["choices"][0]["text"] for answer in (seven, eight, seven_again, eight_again)]
    assert text[0] == text[2] and text[1] == text[3]  # a seed draws the same, whatever beside
    assert text[0] != text[1]
    assert greedy["choices"][0]["text"] == alone(base, adapters["tune-2"], PROMPTS[1], 16)
