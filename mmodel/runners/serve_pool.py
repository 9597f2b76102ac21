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

One worker runs the models: requests queue, and each batch takes the oldest waiting request and
those that can run with it (up to `--max-batch`, same sampling settings): requests to the same
whole model, or requests to the base and any of its adapters together, each row with its own
adapter (PEFT's mixed-adapter batch), so the fine-tunes of one base share every forward pass.
Loads and evictions happen only between batches: nothing is evicted under a request that runs.
Each row of a batch ends at its own end of text, stop string or max_tokens.

Self-contained (torch, transformers, PEFT, Starlette, uvicorn and the standard library only,
with `mmodel.runners.replica_guard`): where a cluster runs images, the platform hands the
image's `python -c` the guard's text and this file's.
"""

import argparse
import asyncio
import collections
import contextlib
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

from mmodel.runners.replica_guard import guarded, take_key

DEFAULT_MAX_TOKENS = 256
BASE_ROW = "__base__"  # PEFT's name for a row of a mixed batch that takes no adapter
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
    sampling: tuple  # (temperature, top_p, seed): requests batch only with equal ones
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

    def finish(self, reason: str) -> None:
        item = self.pending
        item.done = True
        self.flush()
        item.emit(("done", reason, len(item.tokens)))


def _streamer(rows: list[Row]):
    from transformers.generation.streamers import BaseStreamer

    class Streamer(BaseStreamer):
        """Hands each step's token of every row to its request (the first put is the
        prompt)."""

        def __init__(self) -> None:
            self.started = False

        def put(self, value) -> None:
            if not self.started:
                self.started = True
                return
            for row, token in zip(rows, value.view(-1).tolist(), strict=True):
                row.add(int(token))

        def end(self) -> None:
            for row in rows:
                if not row.pending.done:
                    row.finish("length")

    return Streamer()


def _rows_done(rows: list[Row]):
    import torch
    from transformers import StoppingCriteria

    class RowsDone(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([row.pending.done for row in rows], device=input_ids.device)

    return RowsDone()


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
        # name -> (model, tokenizer), least recently used first
        self.loaded: collections.OrderedDict = collections.OrderedDict()
        self.peft: Any = None  # the base wrapped by PEFT once an adapter is loaded on it
        self.held_adapters: collections.OrderedDict = collections.OrderedDict()
        self.tokenizers: dict[str, Any] = {}
        self.active: set[str] = set()  # the adapters of the last batch: others, a switch
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: list[Pending] = []
        self.loads = self.evictions = self.batches = self.rows = 0
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

    def holds(self) -> dict:
        with self.lock:
            adapters = list(self.held_adapters) if self.base_name in self.loaded else []
            return {"models": list(self.loaded), "adapters": adapters}

    def health(self) -> dict:
        with self.lock:
            switches, loads = sorted(self.switch_ms), sorted(self.load_ms)
        return {"status": "ok", "holds": self.holds(), "loads": self.loads,
                "evictions": self.evictions, "batches": self.batches, "rows": self.rows,
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
        """Served on the base: the base itself and its adapters, batched together."""
        return name == self.base_name or name in self.adapters

    def _work(self) -> None:
        while True:
            if not self.waiting:
                self.waiting.append(self.inbox.get())
            while True:
                try:
                    self.waiting.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            self.waiting = [item for item in self.waiting if not item.cancelled]
            if not self.waiting:
                continue
            batch = self._next_batch()
            chosen = {id(item) for item in batch}
            self.waiting = [item for item in self.waiting if id(item) not in chosen]
            try:
                self._generate(batch)
            except Exception as exc:  # every request of the batch hears of it
                for item in batch:
                    if not item.done:
                        item.done = True
                        item.emit(("error", f"{type(exc).__name__}: {exc}"))

    def _next_batch(self) -> list[Pending]:
        """The oldest request and those that can run with it, in order of arrival: the same
        sampling, and the same whole model, or the base and adapters (at most max_loras
        different ones)."""
        first = self.waiting[0]
        family = self._family(first.model)
        batch: list[Pending] = []
        adapters: set[str] = set()
        for item in self.waiting:
            same = self._family(item.model) if family else item.model == first.model
            if not same or item.sampling != first.sampling:
                continue
            if item.model in self.adapters and item.model not in adapters:
                if len(adapters) >= self.max_loras:
                    continue
                adapters.add(item.model)
            batch.append(item)
            if len(batch) >= self.max_batch:
                break
        return batch

    def _generate(self, batch: list[Pending]) -> None:
        import torch

        names = [item.model for item in batch]
        model, extra, mode = self._ready(names)
        base_tokenizer = self.tokenizer(names[0])
        pad = base_tokenizer.pad_token_id if base_tokenizer.pad_token_id is not None else \
            base_tokenizer.eos_token_id
        width = max(len(item.prompt_ids) for item in batch)
        ids = [[pad] * (width - len(item.prompt_ids)) + item.prompt_ids for item in batch]
        mask = [[0] * (width - len(item.prompt_ids)) + [1] * len(item.prompt_ids)
                for item in batch]
        rows = []
        for item in batch:
            tokenizer = self.tokenizer(item.model)
            rows.append(Row(item, tokenizer, self._eos(model, tokenizer)))
        temperature, top_p, seed = batch[0].sampling
        sampling = {"do_sample": False} if not temperature else \
            {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if seed is not None:
            torch.manual_seed(seed)
        with torch.inference_mode(), mode:
            model.generate(
                input_ids=torch.tensor(ids, device=self.device),
                attention_mask=torch.tensor(mask, device=self.device),
                max_new_tokens=max(item.max_tokens for item in batch), pad_token_id=pad,
                # Each row ends at its own end of text (RowsDone): generate() stops at none,
                # so a row asked to ignore it goes on.
                eos_token_id=None, streamer=_streamer(rows),
                stopping_criteria=[_rows_done(rows)], **sampling, **extra)
        with self.lock:
            self.batches += 1
            self.rows += len(batch)

    @staticmethod
    def _eos(model, tokenizer) -> set[int]:
        found = getattr(model.generation_config, "eos_token_id", None)
        eos = set(found if isinstance(found, list) else [found] if found is not None else [])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        return eos

    def _ready(self, names: list[str]):
        """The module that generates the batch's rows (each of `names`), loaded; what
        generate() needs beside; the context it runs in. Rows of one adapter run with it active
        and rows of the base with adapters off: PEFT's mixed-adapter batch (each row's adapter
        passed) costs about half a plain step more, so only a mixed batch pays it."""
        plain = contextlib.nullcontext()
        if not self._family(names[0]):
            return self._whole(names[0]), {}, plain
        base = self._whole(self.base_name)
        wanted = [name for name in dict.fromkeys(names) if name in self.adapters]
        if wanted:
            missing = [name for name in wanted if name not in self.held_adapters]
            changed = set(wanted) != self.active
            started = time.perf_counter()
            self._hold(base, wanted)
            if missing or changed:  # adapters made ready: from memory, or loaded first
                with self.lock:
                    (self.load_ms if missing else self.switch_ms).append(
                        (time.perf_counter() - started) * 1000)
            self.active = set(wanted)
        if self.peft is None:
            return base, {}, plain
        kinds = set(names)
        if kinds == {self.base_name}:
            return self.peft, {}, self.peft.disable_adapter()
        if len(kinds) == 1:  # one adapter, made active by _hold
            return self.peft, {}, plain
        return self.peft, {"adapter_names": [name if name in self.adapters else BASE_ROW
                                             for name in names]}, plain

    def _whole(self, name: str):
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return self.loaded[name]
        need = self.sizes[name]
        while self.loaded and sum(self.sizes[n] for n in self.loaded) + need > self.budget_bytes:
            self._evict(next(iter(self.loaded)))
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
                self.peft = None
                self.held_adapters.clear()
        _free_memory(self.device)

    def _hold(self, base, wanted: list[str]) -> None:
        """Every adapter in `wanted` loaded on the base; past max_loras the least recently
        used others are unloaded."""
        from peft import PeftModel

        for name in wanted:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(base, self.adapters[name],
                                                      adapter_name=name).eval()
            elif name not in self.held_adapters:
                self.peft.load_adapter(self.adapters[name], adapter_name=name)
            with self.lock:
                self.held_adapters[name] = True
                self.held_adapters.move_to_end(name)
        self.peft.set_adapter(wanted[-1])  # never one about to be unloaded
        with self.lock:
            while len(self.held_adapters) > self.max_loras:
                oldest = next(name for name in self.held_adapters if name not in wanted)
                self.held_adapters.pop(oldest)
                self.peft.delete_adapter(oldest)


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
