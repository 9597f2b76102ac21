"""The pool runtime: one replica serving many versions of a model family, each under its own
model name, at OpenAI's `POST /v1/chat/completions` and `/v1/completions` (streamed or not),
answering only requests that carry `Authorization: Bearer <key>` (the key from
OGAI_REPLICA_API_KEY); `GET /health` stays open and says what the replica holds.

    python -m mmodel.runners.serve_pool --base NAME=DIR [--model NAME=DIR …]
        [--adapter NAME=DIR …] --memory-budget-mib N --max-loras N --host … --port …

- Whole models (the base, and each --model) are loaded when a request names them and stay
  while the sum of their weights fits `--memory-budget-mib`; loading one more evicts the least
  recently used first. A model larger than the budget alone is loaded alone.
- LoRA adapters (each --adapter, a PEFT folder trained on the base) are loaded on the one copy
  of the base, at most `--max-loras` at once (the least recently used is unloaded for another).

One worker runs the models, batching continuously (`mmodel.runners.decoding`): the rows of a
model decode together, one token each per forward pass, and a waiting request joins them at the
next pass (its prompt run first), in order of arrival, while there are fewer than `--max-batch`
rows, its model fits the budget beside those in use, and its adapter is one of at most
`--max-loras` in use. Requests to the base and to any of its adapters are rows of the same
passes, each with its own adapter (`mmodel.runners.lora_bank`), so the fine-tunes of one base
share every forward pass; rows of other whole models decode on theirs, pass for pass in turn.
Nothing in use is evicted or unloaded. Each row ends at its own end of text, stop string or
max_tokens, and keeps its own sampling settings.

Self-contained (torch, transformers, PEFT, Starlette, uvicorn and the standard library only,
with the runner modules it imports): where a cluster runs images, the platform hands the
image's `python -c` their text and this file's.
"""

import argparse
import asyncio
import collections
import json
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmodel.runners.decoding import Decoding
from mmodel.runners.lora_bank import LoraBank
from mmodel.runners.replica_guard import guarded, take_key

DEFAULT_MAX_TOKENS = 256
SWITCHES_KEPT = 1000  # recent adapter switch and load times, for /health's p99


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def weights_bytes(folder: str) -> int:
    """The size of a model folder's weights (what loading it costs in memory, near enough)."""
    files = list(Path(folder).glob("*.safetensors")) or list(Path(folder).glob("*.bin"))
    return sum(path.stat().st_size for path in files)


@dataclass
class Pending:
    """One request: its prompt's tokens, its settings, and where its text goes."""

    model: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: tuple  # (temperature, top_p, seed): its own, whatever its batch's rows use
    stops: list[str]
    ignore_eos: bool
    emit: Callable[[tuple], object]  # safe to call from the worker thread
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    done: bool = False
    cancelled: bool = False


class Row:
    """A request's share of a batch: its new tokens as text, its own end."""

    def __init__(self, pending: Pending, tokenizer, eos: set[int]) -> None:
        self.pending, self.tokenizer = pending, tokenizer
        self.eos = set() if pending.ignore_eos else eos

    def add(self, token: int) -> None:
        item = self.pending
        if item.done:
            return
        if item.cancelled:
            self.finish("cancelled")
            return
        if token in self.eos:
            self.finish("stop")
            return
        item.tokens.append(token)
        text = self.tokenizer.decode(item.tokens, skip_special_tokens=True)
        cut = min((found for found in (text.find(stop) for stop in item.stops) if found >= 0),
                  default=-1)
        if cut >= 0:
            item.text = text[:cut]
            self.finish("stop")
        elif len(item.tokens) >= item.max_tokens:
            item.text = text
            self.finish("length")
        else:
            item.text = text
            if not text.endswith("\ufffd"):  # half of a character: wait for the rest
                # What could still become the start of a stop string waits too.
                self.flush(len(text) - max((len(stop) - 1 for stop in item.stops), default=0))

    def flush(self, upto: int | None = None) -> None:
        item = self.pending
        end = len(item.text) if upto is None else upto
        if end > item.sent:
            item.emit(("text", item.text[item.sent:end]))
            item.sent = end

    def fail(self, message: str) -> None:
        self.pending.done = True
        self.pending.emit(("error", message))

    def finish(self, reason: str) -> None:
        item = self.pending
        item.done = True
        self.flush()
        item.emit(("done", reason, len(item.tokens)))


class Pool:
    """The models and adapters of one replica, and the one worker that runs them."""

    def __init__(self, *, base: tuple[str, str], models: dict[str, str],
                 adapters: dict[str, str], budget_bytes: int, max_loras: int, device: str,
                 max_batch: int = 16) -> None:
        self.base_name, self.base_folder = base
        self.folders = {self.base_name: self.base_folder, **models}
        self.adapters = dict(adapters)
        self.budget_bytes, self.max_loras = budget_bytes, max(1, max_loras)
        self.device, self.max_batch = device, max(1, max_batch)
        self.sizes = {name: weights_bytes(folder) for name, folder in self.folders.items()}
        # name -> model, least recently used first
        self.loaded: collections.OrderedDict = collections.OrderedDict()
        self.bank: Any = None  # the adapters loaded on the base (a LoraBank), once one is
        self.held_adapters: collections.OrderedDict = collections.OrderedDict()
        self.tokenizers: dict[str, Any] = {}
        self.contexts: dict[str, int] = {}
        self.running: dict[str, Decoding] = {}  # whole model -> the rows decoding on it
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: list[Pending] = []
        self.loads = self.evictions = self.steps = self.rows = 0
        # Times of adapter switches: to one held, and to one loaded for it.
        self.switch_ms: collections.deque = collections.deque(maxlen=SWITCHES_KEPT)
        self.load_ms: collections.deque = collections.deque(maxlen=SWITCHES_KEPT)
        self.lock = threading.Lock()  # what /health reads
        self.thread = threading.Thread(target=self._work, name="pool-worker", daemon=True)
        if self.adapters:  # imported now, not in the first switch
            import peft  # noqa: F401

    # -- what requests see --------------------------------------------------------------------

    def names(self) -> list[str]:
        return [*self.folders, *self.adapters]

    def tokenizer(self, name: str):
        """The tokenizer of a model or adapter (an adapter's own when it saved one)."""
        found = self.tokenizers.get(name)
        if found is None:
            from transformers import AutoTokenizer

            folder = self.folders.get(name) or self.adapters[name]
            if name in self.adapters and not any(
                    (Path(folder) / file).exists()
                    for file in ("tokenizer.json", "tokenizer_config.json")):
                folder = self.base_folder
            found = AutoTokenizer.from_pretrained(folder)
            self.tokenizers[name] = found
        return found

    def context(self, name: str) -> int:
        """How many tokens the model behind `name` reads at most."""
        found = self.contexts.get(name)
        if found is None:
            from transformers import AutoConfig

            folder = self.folders.get(name, self.base_folder)
            found = getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings",
                            None) or 1 << 30
            self.contexts[name] = found
        return found

    def holds(self) -> dict:
        with self.lock:
            adapters = list(self.held_adapters) if self.base_name in self.loaded else []
            return {"models": list(self.loaded), "adapters": adapters}

    def health(self) -> dict:
        with self.lock:
            switches, loads = sorted(self.switch_ms), sorted(self.load_ms)
        return {"status": "ok", "holds": self.holds(), "loads": self.loads,
                "evictions": self.evictions, "steps": self.steps, "rows": self.rows,
                "switches": len(switches), "switch_ms_p99": _p99(switches),
                "adapter_loads": len(loads), "adapter_load_ms_p99": _p99(loads),
                "budget_mib": self.budget_bytes // 2**20,
                "used_mib": sum(self.sizes[name] for name in self.loaded) // 2**20}

    def submit(self, pending: Pending) -> None:
        if not self.thread.is_alive():
            self.thread.start()
        self.inbox.put(pending)

    # -- the worker -----------------------------------------------------------------------------

    def _family(self, name: str) -> bool:
        """Served on the base: the base itself and its adapters, decoding together."""
        return name == self.base_name or name in self.adapters

    def _work(self) -> None:
        while True:
            self._take(wait=not self.waiting and not self.running)
            self._admit()
            for name, decoding in list(self.running.items()):
                try:
                    decoding.step()
                except Exception as exc:  # every request of its rows hears of it
                    decoding.fail(f"{type(exc).__name__}: {exc}")
                with self.lock:
                    self.steps += 1
                if not decoding.rows:
                    del self.running[name]

    def _take(self, wait: bool) -> None:
        if wait:
            self.waiting.append(self.inbox.get())
        while True:
            try:
                self.waiting.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        self.waiting = [item for item in self.waiting if not item.cancelled]

    def _admit(self) -> None:
        """Waiting requests join the rows decoding, in order of arrival (none passes an earlier
        one) while there is room: at most max_batch rows, whole models that fit the budget
        beside those in use, at most max_loras adapters in use."""
        room = self.max_batch - sum(len(decoding) for decoding in self.running.values())
        joining: dict[str, list[Pending]] = {}
        while self.waiting and room > 0 and self._fits(self.waiting[0], joining):
            item = self.waiting.pop(0)
            joining.setdefault(self._whole_of(item.model), []).append(item)
            room -= 1
        for name, items in joining.items():
            try:
                decoding = self._decoding(name, items)
                rows = [Row(item, self.tokenizer(item.model), self._eos(decoding.model, item))
                        for item in items]
                decoding.join(rows, [item.model if item.model in self.adapters else None
                                     for item in items])
            except Exception as exc:  # each of them hears of it; the rows decoding go on
                for item in items:
                    if not item.done:
                        item.done = True
                        item.emit(("error", f"{type(exc).__name__}: {exc}"))
                continue
            with self.lock:
                self.steps += 1
                self.rows += len(items)
            if decoding.rows:
                self.running[name] = decoding

    def _eos(self, model, item: Pending) -> set[int]:
        found = getattr(model.generation_config, "eos_token_id", None)
        eos = set(found if isinstance(found, list) else [found] if found is not None else [])
        tokenizer = self.tokenizer(item.model)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        return eos

    def _whole_of(self, name: str) -> str:
        return self.base_name if self._family(name) else name

    def _fits(self, item: Pending, joining: dict[str, list[Pending]]) -> bool:
        name = self._whole_of(item.model)
        used = set(self.running) | set(joining)
        if used - {name} and \
                sum(self.sizes[other] for other in used | {name}) > self.budget_bytes:
            return False  # it waits until the models in use are done
        if item.model not in self.adapters:
            return True
        in_use = {adapter for adapter in self._running_adapters() if adapter}
        in_use |= {other.model for other in joining.get(self.base_name, [])
                   if other.model in self.adapters}
        return len(in_use | {item.model}) <= self.max_loras

    def _running_adapters(self) -> list:
        decoding = self.running.get(self.base_name)
        return decoding.adapters if decoding else []

    def _decoding(self, name: str, items: list[Pending]) -> Decoding:
        """The rows decoding on model `name`, it and the items' adapters loaded."""
        model = self._whole(name)
        wanted = [item.model for item in items if item.model in self.adapters]
        if wanted:
            self._hold(model, list(dict.fromkeys(wanted)))
        found = self.running.get(name)
        if found is not None:
            return found
        tokenizer = self.tokenizer(name)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.eos_token_id
        plan = self._plan if name == self.base_name and self.adapters else lambda rows: None
        return Decoding(model, self.device, pad or 0, plan)

    def _plan(self, adapters: list) -> None:
        """Each row of the base's next forward pass with its adapter; a change of the adapters
        in use is a switch."""
        if self.bank is None:
            return
        before = self.bank.plan
        started = time.perf_counter()
        self.bank.use(adapters)
        if self.bank.plan is not None and self.bank.plan is not before and \
                set(self.bank.plan) != set(before or ()):
            with self.lock:
                self.switch_ms.append((time.perf_counter() - started) * 1000)

    def _whole(self, name: str):
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return self.loaded[name]
        need = self.sizes[name]
        while True:
            spare = [other for other in self.loaded if other not in self.running]
            if not spare or sum(self.sizes[n] for n in self.loaded) + need <= self.budget_bytes:
                break
            self._evict(spare[0])
        import torch
        from transformers import AutoModelForCausalLM

        dtype = "auto" if self.device != "cpu" else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(self.folders[name], dtype=dtype)
        model = model.to(self.device).eval()
        with self.lock:
            self.loaded[name] = model
            self.loads += 1
        return model

    def _evict(self, name: str) -> None:
        with self.lock:
            self.loaded.pop(name)
            self.evictions += 1
            if name == self.base_name:  # its adapters were loaded on it
                self.bank = None
                self.held_adapters.clear()
        _free_memory(self.device)

    def _hold(self, base, wanted: list[str]) -> None:
        """Every adapter in `wanted` loaded on the base; past max_loras the least recently
        used ones no row uses are unloaded."""
        if self.bank is None:
            self.bank = LoraBank(base)
        in_use = set(self._running_adapters()) | set(wanted)
        for name in wanted:
            if name not in self.held_adapters:
                spare = [held for held in self.held_adapters if held not in in_use]
                while spare and len(self.held_adapters) >= self.max_loras:
                    oldest = spare.pop(0)
                    with self.lock:
                        self.held_adapters.pop(oldest)
                    self.bank.unload(oldest)
                started = time.perf_counter()
                self.bank.load(name, self.adapters[name])
                with self.lock:
                    self.load_ms.append((time.perf_counter() - started) * 1000)
            with self.lock:
                self.held_adapters[name] = True
                self.held_adapters.move_to_end(name)


def _p99(ordered: list[float]) -> float:
    if not ordered:
        return 0.0
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3)


def _free_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# -- HTTP ---------------------------------------------------------------------------------------


def _error(status: int, message: str, code: str, param: str | None = None):
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


def _number(body: dict, name: str, default, low: float, high: float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequest(f"`{name}` must be a number from {low:g} to {high:g}.", name)
    return value


def request_of(pool: Pool, body, chat: bool) -> dict:
    """What to generate, or BadRequest saying what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    name = body.get("model")
    if name not in pool.names():
        raise BadRequest(f"This pool serves no model {name!r}.", "model")
    for unsupported in ("tools", "logprobs", "functions"):
        if body.get(unsupported):
            raise BadRequest(f"`{unsupported}` is not supported by the pool runtime.",
                             unsupported)
    if body.get("n", 1) not in (1, None):
        raise BadRequest("`n` must be 1: ask again for more answers.", "n")
    tokenizer = pool.tokenizer(name)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise BadRequest("`messages` must be a non-empty list of {role, content} with text "
                             "content.", "messages")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("`prompt` must be one non-empty string.", "prompt")
        ids = tokenizer(prompt)["input_ids"]
    if len(ids) >= pool.context(name):
        raise BadRequest(f"The prompt is {len(ids)} tokens: {name} reads at most "
                         f"{pool.context(name)}.", "messages" if chat else "prompt")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = DEFAULT_MAX_TOKENS if limit is None else \
        int(_number(body, "max_completion_tokens" if "max_completion_tokens" in body
                    else "max_tokens", DEFAULT_MAX_TOKENS, 1, 1 << 20))
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > 4:
        raise BadRequest("`stop` must be a string or up to 4 strings.", "stop")
    temperature = float(_number(body, "temperature", 1.0, 0, 2))
    top_p = float(_number(body, "top_p", 1.0, 0, 1))
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("`seed` must be an integer.", "seed")
    options = body.get("stream_options") or {}
    return {"model": name, "ids": ids, "max_tokens": max_tokens, "stops": stops,
            # vLLM's extension: generate max_tokens whatever the model says.
            "ignore_eos": body.get("ignore_eos") is True,
            "sampling": (temperature, top_p if temperature else 1.0, seed),
            "stream": bool(body.get("stream")),
            "usage_in_stream": isinstance(options, dict) and bool(options.get("include_usage"))}


def build_app(pool: Pool, key: str):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def health(request: Request):
        return JSONResponse(pool.health())

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "ogai"} for name in pool.names()]})

    async def complete(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "The body is not JSON.", "invalid_json")
        try:
            wanted = request_of(pool, body, chat)
        except BadRequest as exc:
            return _error(400, str(exc), "invalid_request", exc.param)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        pending = Pending(model=wanted["model"], prompt_ids=wanted["ids"],
                          max_tokens=wanted["max_tokens"], sampling=wanted["sampling"],
                          stops=wanted["stops"], ignore_eos=wanted["ignore_eos"],
                          emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        pool.submit(pending)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        prompt_tokens = len(wanted["ids"])
        if wanted["stream"]:
            return StreamingResponse(
                _stream(events, pending, chat=chat, ident=ident, created=created,
                        name=wanted["model"], prompt_tokens=prompt_tokens,
                        usage=wanted["usage_in_stream"]),
                media_type="text/event-stream")
        parts = []
        try:
            while True:
                event = await events.get()
                if event[0] == "text":
                    parts.append(event[1])
                elif event[0] == "error":
                    return _error(500, event[1], "generation_failed")
                else:
                    break
        finally:
            if not pending.done:
                pending.cancelled = True
        _, reason, completion_tokens = event
        text = "".join(parts)
        choice = {"index": 0, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": wanted["model"], "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}})

    async def chat(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/completions", completions, methods=["POST"])])
    return guarded(app, key)


async def _stream(events: asyncio.Queue, pending: Pending, *, chat: bool, ident: str,
                  created: int, name: str, prompt_tokens: int, usage: bool):
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, reason: str | None, first: bool = False) -> bytes:
        if chat:
            delta = {"role": "assistant", "content": text or ""} if first else \
                ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": reason}
        data = {"id": ident, "object": kind, "created": created, "model": name,
                "choices": [choice]}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    try:
        if chat:
            yield chunk("", None, first=True)
        while True:
            event = await events.get()
            if event[0] == "text":
                yield chunk(event[1], None)
            elif event[0] == "error":
                error = {"error": {"message": event[1], "type": "server_error",
                                   "param": None, "code": "generation_failed"}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
                return
            else:
                _, reason, completion_tokens = event
                yield chunk(None, reason)
                break
        if usage:
            data = {"id": ident, "object": kind, "created": created, "model": name,
                    "choices": [], "usage": {
                        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens}}
            yield b"data: " + json.dumps(data).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not pending.done:  # the client went away: the worker drops its row
            pending.cancelled = True


def _named(values: list[str], flag: str) -> dict[str, str]:
    found = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"{flag} takes NAME=FOLDER, not {value!r}")
        found[name] = folder
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="NAME=FOLDER: the model adapters are on")
    parser.add_argument("--model", action="append", default=[], help="NAME=FOLDER")
    parser.add_argument("--adapter", action="append", default=[], help="NAME=FOLDER")
    parser.add_argument("--memory-budget-mib", type=int, required=True)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    key = take_key()
    import uvicorn
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a model's load is no news in a server's log
    base = next(iter(_named([args.base], "--base").items()))
    pool = Pool(base=base, models=_named(args.model, "--model"),
                adapters=_named(args.adapter, "--adapter"),
                budget_bytes=args.memory_budget_mib * 2**20, max_loras=args.max_loras,
                device=args.device, max_batch=args.max_batch)
    uvicorn.run(build_app(pool, key), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
