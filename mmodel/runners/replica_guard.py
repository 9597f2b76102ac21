"""The key in front of every model server the platform runs (serve_transformers, serve_embeddings,
serve_pool): requests without `Authorization: Bearer <key>` (the deployment's key, from the
environment variable KEY_ENV) are refused in OpenAI's shape, but for OPEN ones (the platform's
readiness probe), so nothing reaches a replica around the gateway's roles, limits and usage.

The standard library only. A runner imports it by the line IMPORT_LINE; where a cluster runs
images, which have no platform code, `mmodel.runtimes` hands the image this file's text with
the runner's after it, that line taken out.
"""

import hmac
import json
import os
import sys

KEY_ENV = "OGAI_REPLICA_API_KEY"
OPEN = frozenset({("GET", "/health")})
IMPORT_LINE = "from mmodel.runners.replica_guard import guarded, take_key\n"
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


def take_key() -> str:
    """The deployment's key, taken out of the environment its own children would inherit;
    without one the server does not start."""
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        sys.exit(f"{KEY_ENV} is not set: this server answers only the platform's gateway, "
                 "with the deployment's key.")
    return key
