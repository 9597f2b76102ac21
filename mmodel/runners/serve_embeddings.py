"""The embeddings runtime: a sentence-transformers model folder (modules.json: transformer,
pooling, normalization) served at `POST /v1/embeddings` in OpenAI's shape, answering only
requests that carry `Authorization: Bearer <key>` (the key from OGAI_REPLICA_API_KEY); `GET
/health` stays open for the platform's readiness probe.

    python -m mmodel.runners.serve_embeddings MODEL_DIR --host … --port … [--device cpu]

Requests are batched as they come: while the model encodes one batch, the texts of every request
arriving meanwhile queue, and the next batch takes them all (up to `--max-batch` texts), so a
burst of one-line requests costs a few model calls, not one each. A batch that would hold fewer
texts than the last one waits for the rest a moment: at most a model call's fixed cost (what a
call costs whatever it holds, measured as the server runs), which a second call would pay.
Each text is cut to the model's `max_seq_length` tokens, as sentence-transformers does;
`usage.prompt_tokens` counts the tokens encoded.

Self-contained (sentence-transformers, Starlette, uvicorn and the standard library only, with
`mmodel.runners.replica_guard`): where a cluster runs images, the platform hands the image's
`python -c` the guard's text and this file's.
"""

import argparse
import asyncio
import base64
import json
import sys

from mmodel.runners.replica_guard import guarded, take_key

MAX_INPUTS = 2048  # OpenAI's bound on the texts of one request


def _error(status: int, message: str, code: str, param: str | None = None):
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


def texts_of(body) -> list[str]:
    """The request's texts, or ValueError saying what is wrong with its `input`."""
    if not isinstance(body, dict):
        raise ValueError("The body must be a JSON object.")
    found = body.get("input")
    texts = [found] if isinstance(found, str) else found
    if not isinstance(texts, list) or not texts:
        raise ValueError("`input` must be a string or a non-empty list of strings.")
    if not all(isinstance(text, str) for text in texts):
        raise ValueError("`input` must be text: this model server does not take token ids.")
    if len(texts) > MAX_INPUTS:
        raise ValueError(f"`input` holds {len(texts)} texts; at most {MAX_INPUTS} a request.")
    if any(not text for text in texts):
        raise ValueError("`input` holds an empty string.")
    return texts


class Batcher:
    """Texts of concurrent requests encoded together, one model call at a time."""

    def __init__(self, model, max_batch: int) -> None:
        self.model = model
        self.max_batch = max_batch
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.batches = 0  # model calls, and the texts they encoded (shown on /health)
        self.texts = 0
        self.last = 1  # texts in the last batch
        # Moving averages of a call of one text, and of what each more text adds to a call.
        self.lone_s = self.per_text_s = 0.0

    def timed(self, count: int, took: float) -> None:
        if count == 1:
            self.lone_s = took if not self.lone_s else 0.8 * self.lone_s + 0.2 * took
        elif self.lone_s:
            more = max(took - self.lone_s, 0) / (count - 1)
            self.per_text_s = more if not self.per_text_s else \
                0.8 * self.per_text_s + 0.2 * more

    def fixed_s(self) -> float:
        """What a model call costs whatever it holds (0 until both are measured)."""
        return max(self.lone_s - self.per_text_s, 0.0) if self.per_text_s else 0.0

    async def encode(self, texts: list[str]):
        """(vectors, token counts) of the texts, in order."""
        if self.task is None:
            self.task = asyncio.create_task(self.run())
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, done))
        return await done

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            waiting = [await self.queue.get()]
            count = len(waiting[0][0])
            # Fewer texts than the last batch held: their senders are likely on their way
            # (clients send again as their answers come back). Waiting for them pays while
            # the wait is shorter than what a model call costs whatever it holds (its fixed
            # cost), which a second call for them would pay again.
            deadline = loop.time() + self.fixed_s()
            while count < self.max_batch:
                if self.queue.empty():
                    left = deadline - loop.time()
                    if count >= self.last or left <= 0:
                        break
                    try:
                        waiting.append(await asyncio.wait_for(self.queue.get(), left))
                    except TimeoutError:
                        break
                else:
                    waiting.append(self.queue.get_nowait())
                count += len(waiting[-1][0])
            self.last = count
            texts = [text for item, _ in waiting for text in item]
            self.batches += 1
            self.texts += len(texts)
            started = loop.time()
            try:
                vectors, tokens = await asyncio.to_thread(self._encode, texts)
            except Exception as exc:  # every waiting request hears of it
                for _, done in waiting:
                    if not done.done():
                        done.set_exception(exc)
                continue
            self.timed(len(texts), loop.time() - started)
            start = 0
            for item, done in waiting:
                end = start + len(item)
                if not done.done():
                    done.set_result((vectors[start:end], tokens[start:end]))
                start = end

    def _encode(self, texts: list[str]):
        vectors = self.model.encode(texts, batch_size=self.max_batch, convert_to_numpy=True,
                                    show_progress_bar=False)
        mask = self.model.preprocess(texts)["attention_mask"]
        return vectors, [int(row.sum()) for row in mask]


def build_app(model, name: str, key: str, max_batch: int = 64):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    batcher = Batcher(model, max_batch)
    dimensions = model.get_embedding_dimension()

    async def health(request: Request):
        return JSONResponse({"status": "ok", "batches": batcher.batches,
                             "texts": batcher.texts})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "ogai"}]})

    async def embeddings(request: Request):
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "The body is not JSON.", "invalid_json")
        try:
            texts = texts_of(body)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_input", "input")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            return _error(400, "`encoding_format` is float or base64.", "invalid_encoding",
                          "encoding_format")
        wanted = body.get("dimensions")
        if wanted is not None and wanted != dimensions:
            return _error(400, f"This model's embeddings have {dimensions} dimensions; it "
                          "cannot shorten them.", "invalid_dimensions", "dimensions")
        vectors, tokens = await batcher.encode(texts)
        data = []
        for index, vector in enumerate(vectors):
            values = vector.astype("<f4")
            embedding = (base64.b64encode(values.tobytes()).decode() if encoding == "base64"
                         else values.tolist())
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        used = sum(tokens)
        return JSONResponse({"object": "list", "data": data, "model": name,
                             "usage": {"prompt_tokens": used, "total_tokens": used}})

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                            Route("/v1/embeddings", embeddings, methods=["POST"])])
    return guarded(app, key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    key = take_key()
    import uvicorn
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.folder, device=args.device, local_files_only=True)
    app = build_app(model, args.folder, key, args.max_batch)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
