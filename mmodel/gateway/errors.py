"""OpenAI-style error answers: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON = b"application/json"


class GatewayError(Exception):
    """Answer the request with this error (and these extra headers)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = list(headers)

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.type,
                                       "param": self.param, "code": self.code}})


def retry_after(seconds: float) -> tuple[bytes, bytes]:
    return (b"retry-after", str(max(1, int(seconds + 0.999))).encode())


def invalid_api_key(message: str = "Invalid API key: send `Authorization: Bearer <API token>` "
                    "with an active token.") -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key",
                        headers=[(b"www-authenticate", b"Bearer")])


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404, f"The model `{model}` does not exist or you do not have access to it.",
        param="model", code="model_not_found")


def may_not_call(tenant_name: str) -> GatewayError:
    return GatewayError(
        403, f"Your role in {tenant_name} may not call its models: a viewer reads only, and a "
             "call spends the tenant's token budget. Ask a tenant admin for the member role.",
        param="model", code="insufficient_permissions")


def context_too_long(*, limit: int, prompt: int, completion: int | None, param: str,
                     at_least: bool = False) -> GatewayError:
    """As OpenAI (and vLLM) say it; `prompt` may be a lower bound (`at_least`)."""
    where = "messages" if param == "messages" else "prompt"
    many = f"at least {prompt}" if at_least else str(prompt)
    if completion is None:
        message = (f"This model's maximum context length is {limit} tokens. However, your "
                   f"{where} resulted in {many} tokens. Please reduce the length of the "
                   f"{where}.")
    else:
        total = f"at least {prompt + completion}" if at_least else str(prompt + completion)
        message = (f"This model's maximum context length is {limit} tokens. However, you "
                   f"requested {total} tokens ({many} in the {where}, {completion} in the "
                   f"completion). Please reduce the length of the {where} or completion.")
    return GatewayError(400, message, param=param, code="context_length_exceeded")


def unavailable(message: str, code: str, after_s: float | None) -> GatewayError:
    headers = [retry_after(after_s)] if after_s is not None else []
    return GatewayError(503, message, type="server_error", code=code, headers=headers)


def upstream_failed(message: str) -> GatewayError:
    return GatewayError(502, message, type="server_error", code="upstream_error")


async def send_json(send: Send, status: int, body: bytes,
                    headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    head = [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]
    head.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: GatewayError) -> None:
    await send_json(send, error.status, error.body(), error.headers)
