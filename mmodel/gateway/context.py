"""The context check: a request whose prompt and completion (`max_tokens`) do not fit the
model's context is refused here, 400 `context_length_exceeded` in OpenAI's shape, before it
reaches a replica (one such prompt could break a transformers server for every caller).

Counted as vLLM counts: a completion's prompt tokenized with the tokenizer's special tokens (or
its token ids as they are); a missing `max_tokens` is OpenAI's 16 for completions, and for chat
means "at least one token". A chat's messages are never run through the model's chat template
here (it is code from the model's folder; only the sandboxed replica runs it): they count as
their texts' tokens plus an allowance for the template's own text, which is its literal text
(read by Jinja's lexer, nothing executed) and PER_MESSAGE tokens a message. So a conversation
within that allowance of the context may be refused though the model would just take it; a
larger one never passes.

Per model folder, its tokenizer (`tokenizer.json` through the `tokenizers` library: no torch in
the web process) and its context length (config.json, derived as vLLM derives it) are loaded
once, in a thread, and kept (the last MAX_MODELS). Per request, tokens are counted only where
cheap bounds do not decide: a token covers at least one byte of the normalized text, so B
bytes are at most B + SPECIAL tokens; and no token covers more than the vocabulary's longest,
so B bytes are at least B / longest. Counting runs in a thread (the tokenizer releases the GIL),
never on the event loop. A folder without a readable tokenizer.json or context length is not
checked (the replica judges)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmodel.gateway.errors import context_too_long

logger = logging.getLogger("mmodel.gateway")

MAX_MODELS = 32
# Tokens a chat template may add per message beyond the message's texts (role markers,
# separators: ChatML, Llama 3, Gemma and Mistral add 3 to 5).
PER_MESSAGE = 8
# Special tokens a tokenizer or template may add to a text (BOS, EOS, a SentencePiece prefix).
SPECIAL = 4
# OpenAI's default `max_tokens` for /v1/completions (vLLM's too).
COMPLETIONS_MAX_TOKENS = 16
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")
# vLLM stretches the context by the rope scaling factor except for these kinds.
UNSCALED_ROPE = {None, "default", "su", "longrope", "llama3", "mrope"}
TEXT_FIELDS = ("content", "name", "reasoning", "reasoning_content")

_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-tokens")


@dataclass(frozen=True, slots=True)
class ModelText:
    limit: int
    tokenizer: Any  # tokenizers.Tokenizer
    # Tokens of the chat template's literal text; bytes of the longest token.
    template_tokens: int
    longest: int


_models: OrderedDict[str, ModelText | None] = OrderedDict()
_loading: dict[str, asyncio.Future] = {}


def context_limit(config: dict) -> int | None:
    """The context length vLLM derives from a config.json: the smallest of its length keys,
    times the rope scaling factor (of YaRN's original length)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    found = [value for key in CONTEXT_KEYS
             if isinstance(value := text.get(key), int) and not isinstance(value, bool)
             and value > 0]
    if not found:
        return None
    limit = min(found)
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if kind not in UNSCALED_ROPE and isinstance(factor, int | float) and factor > 1:
            original = rope.get("original_max_position_embeddings")
            if kind == "yarn" and isinstance(original, int) and original > 0:
                limit = original
            limit = int(limit * factor)
    return limit


def _template(folder: Path) -> str:
    """The chat template's source, where transformers keeps it ("" without one)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) else ""


def _literal_text(template: str) -> list[str]:
    """The template's literal pieces, as Jinja's lexer reads them (nothing is run)."""
    from jinja2 import Environment

    environment = Environment(trim_blocks=True, lstrip_blocks=True)  # noqa: S701 - lexed only
    return [value for _, kind, value in environment.lex(template) if kind == "data"]


def load(folder: str) -> ModelText | None:
    """The folder's tokenizer and context (in a thread; None: not checked)."""
    from tokenizers import Tokenizer

    path = Path(folder)
    try:
        limit = context_limit(json.loads((path / "config.json").read_text()))
        tokenizer_file = path / "tokenizer.json"
        if limit is None or not tokenizer_file.is_file():
            logger.info("gateway: %s has no context length or tokenizer.json: prompts to it "
                        "are not checked", folder)
            return None
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        literal = _literal_text(_template(path))
    except Exception:  # a model the replica may still serve: only the check is lost
        logger.exception("gateway: the tokenizer of %s cannot be read: prompts to it are not "
                         "checked", folder)
        return None
    pieces = [piece for piece in literal if piece]
    template_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(
        pieces, add_special_tokens=False)) if pieces else 0
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    longest = max((len(token.encode()) for token in vocabulary), default=1)
    return ModelText(limit=limit, tokenizer=tokenizer, template_tokens=template_tokens,
                     longest=max(1, longest))


async def model_text(folder: str) -> ModelText | None:
    found = _models.get(folder, _models)
    if found is not _models:
        _models.move_to_end(folder)
        return found  # type: ignore[return-value]
    loop = asyncio.get_running_loop()
    future = _loading.get(folder)
    if future is None or future.get_loop() is not loop:
        future = loop.run_in_executor(_pool, load, folder)
        _loading[folder] = future

        def loaded(done: asyncio.Future) -> None:
            if _loading.get(folder) is done:
                del _loading[folder]
            if not done.cancelled() and done.exception() is None:
                _models[folder] = done.result()
                while len(_models) > MAX_MODELS:
                    _models.popitem(last=False)

        future.add_done_callback(loaded)
    # Shared by concurrent first requests; one that leaves does not cancel the load.
    return await asyncio.shield(future)


def _max_tokens(payload: dict, chat: bool) -> int | None:
    value = payload.get("max_completion_tokens") if chat else None
    if value is None:
        value = payload.get("max_tokens")
    if value is None and not chat:
        return COMPLETIONS_MAX_TOKENS
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None  # missing or not a count (the replica refuses that): at least one token


def _chat_texts(payload: dict) -> tuple[list[str], int] | None:
    """The texts a chat's template inserts and its message count; None when they cannot be
    read (the replica refuses or judges them)."""
    messages = payload["messages"]
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        texts.append(str(message.get("role", "")))
        for key in TEXT_FIELDS:
            value = message.get(key)
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list):  # content parts: their texts (images: the replica)
                texts.extend(part["text"] for part in value
                             if isinstance(part, dict) and isinstance(part.get("text"), str))
        if message.get("tool_calls"):
            texts.append(json.dumps(message["tool_calls"], ensure_ascii=False))
    if payload.get("tools"):
        texts.append(json.dumps(payload["tools"], ensure_ascii=False))
    return texts, len(messages)


def _prompts(prompt: Any) -> list[str | list]:
    """A completion's prompts: a text, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [prompt]
    return [item for item in prompt if isinstance(item, str | list)]


def _count(model: ModelText, texts: list[str], special: bool) -> int:
    return sum(len(e.ids) for e in model.tokenizer.encode_batch(texts,
                                                                add_special_tokens=special))


def _normalized_bytes(model: ModelText, text: str) -> int:
    normalizer = model.tokenizer.normalizer
    return len((normalizer.normalize_str(text) if normalizer is not None else text).encode())


async def _tokens(model: ModelText, texts: list[str], overhead: int, budget: int,
                  special: bool) -> tuple[int, bool] | None:
    """(the texts' tokens plus `overhead`, whether that is only a lower bound), or None where
    the bytes alone say they fit `budget`; counted only when the bytes do not say."""
    size = sum(len(text.encode()) for text in texts)
    # A SentencePiece prefix may add one token per text, the tokenizer its special ones.
    slack = len(texts) + SPECIAL + overhead
    # Normalizing shrinks a character to no less than a quarter of its bytes.
    lowest = size // (4 * model.longest)
    if lowest + overhead > budget:
        return lowest + overhead, True  # far too long: not worth counting
    if size + slack <= budget and (model.tokenizer.normalizer is None or sum(
            _normalized_bytes(model, text) for text in texts) + slack <= budget):
        return None  # (normalizing may lengthen a text, NFKC: the bound is on its result)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, _count, model, texts, special) + overhead, False


async def check(folder: str, payload: dict, chat: bool) -> None:
    """Raise the 400 if the request cannot fit the model at `folder` ("": not checked)."""
    if not folder:
        return
    model = await model_text(folder)
    if model is None:
        return
    completion = _max_tokens(payload, chat)
    # With no max_tokens the model must still have room for one token.
    budget = model.limit - (completion if completion is not None else 1)
    if chat:
        found = _chat_texts(payload)
        if found is None:
            return
        texts, messages = found
        overhead = model.template_tokens + PER_MESSAGE * messages + SPECIAL
        counted = await _tokens(model, texts, overhead, budget, special=False)
        if counted is not None and counted[0] > budget:
            raise context_too_long(limit=model.limit, prompt=counted[0],
                                   completion=completion, param="messages",
                                   at_least=counted[1])
        return
    for item in _prompts(payload["prompt"]):
        if isinstance(item, list):
            ids = all(isinstance(i, int) for i in item)
            counted = (len(item), False) if ids else None
        else:
            counted = await _tokens(model, [item], 0, budget, special=True)
        if counted is not None and counted[0] > budget:
            raise context_too_long(limit=model.limit, prompt=counted[0],
                                   completion=completion, param="prompt",
                                   at_least=counted[1])


def forget() -> None:
    """Drop the loaded tokenizers (tests)."""
    _models.clear()
