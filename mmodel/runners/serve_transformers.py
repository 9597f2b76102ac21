"""The transformers runtime's model server with a key in front: `transformers serve` with the
same options, its app answering only requests that carry `Authorization: Bearer <key>` (the key
from the environment variable OGAI_REPLICA_API_KEY); `GET /health` stays open for the
platform's readiness probe. transformers serve has no key option of its own, so this wraps the
app it builds, in the same process.

    python -m mmodel.runners.serve_transformers serve MODEL_DIR --host … --port …

Self-contained (transformers and the standard library only): where a cluster runs images, the
platform hands this file's text to the image's `python -c`.
"""

import hmac
import json
import os
import sys

KEY_ENV = "OGAI_REPLICA_API_KEY"
OPEN = frozenset({("GET", "/health")})
REFUSAL = json.dumps({"error": {
    "message": "This model server answers only the platform's gateway: call the model there.",
    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()


def guarded(app, key: str):
    """`app` (ASGI) answering only requests with the key, but for OPEN ones."""
    expected = b"Bearer " + key.encode()

    async def asgi(scope, receive, send):
        kind = scope["type"]
        if kind in ("http", "websocket") and (scope.get("method"), scope["path"]) not in OPEN:
            sent = next((value for name, value in scope["headers"] if name == b"authorization"),
                        b"")
            if not hmac.compare_digest(sent, expected):
                if kind == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(REFUSAL)).encode())]})
                await send({"type": "http.response.body", "body": REFUSAL})
                return
        await app(scope, receive, send)

    return asgi


def main() -> None:
    # Out of the environment its own children would inherit.
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        sys.exit(f"{KEY_ENV} is not set: this server answers only requests with the key")
    from transformers.cli.serving import server

    build = server.build_server
    # `transformers serve` looks build_server up when it starts: it gets the guarded app.
    server.build_server = lambda *args, **kwargs: guarded(build(*args, **kwargs), key)
    from transformers.cli.transformers import main as cli

    cli()


if __name__ == "__main__":
    main()
