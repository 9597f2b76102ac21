"""The one error envelope of the API: `{"code", "message", "fields"}` for every error.

Services raise Django's ValidationError, PermissionDenied and Http404; DRF raises its own
APIException subclasses; anything else is a 500 that is logged and never leaks a traceback.
"""

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger("ogai.api")


def envelope(code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict:
    return {"code": code, "message": message, "fields": fields or {}}


def _as_messages(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        messages: list[str] = []
        for item in value:
            messages.extend(_as_messages(item))
        return messages
    if isinstance(value, dict):
        return [f"{key}: {msg}" for key, inner in value.items() for msg in _as_messages(inner)]
    return [str(value)]


def _field_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Nested serializers' errors are named by their path: {"resources.gpus": [...]}."""
    if not isinstance(detail, dict):
        return {prefix or "non_field_errors": _as_messages(detail)}
    fields: dict[str, list[str]] = {}
    for field, errors in detail.items():
        name = f"{prefix}.{field}" if prefix else str(field)
        if isinstance(errors, dict):
            fields.update(_field_errors(errors, name))
        else:
            fields[name] = _as_messages(errors)
    return fields


def _validation_response(fields: dict[str, list[str]]) -> Response:
    first_field, first_errors = next(iter(fields.items()))
    where = "" if first_field in {"non_field_errors", "__all__"} else f"{first_field}: "
    message = f"{where}{first_errors[0]}" if first_errors else "The request is not valid."
    return Response(envelope("invalid", message, fields), status=status.HTTP_400_BAD_REQUEST)


def exception_handler(exc: Exception, context: dict) -> Response:
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            envelope("request_too_large",
                     f"The request body is larger than the limit of {limit} bytes."),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        # Django's guards against a body of countless fields; the request, not the server,
        # is at fault.
        what, limit = (("files", settings.DATA_UPLOAD_MAX_NUMBER_FILES)
                       if isinstance(exc, TooManyFilesSent)
                       else ("fields", settings.DATA_UPLOAD_MAX_NUMBER_FIELDS))
        return Response(
            envelope(f"too_many_{what}", f"The request has more than {limit} {what}."),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, SuspiciousOperation):
        logger.warning("Refused a suspicious request: %s", exc)
        return Response(envelope("bad_request", "The request is not valid."),
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        return _validation_response(_field_errors(detail))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)

    if isinstance(exc, exceptions.ValidationError):
        return _validation_response(_field_errors(exc.detail))
    if isinstance(exc, exceptions.APIException):
        detail = exc.detail
        message = str(detail) if not isinstance(detail, dict | list) else "; ".join(
            _as_messages(detail)
        )
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        response = Response(envelope(str(code), message), status=exc.status_code)
        if getattr(exc, "auth_header", None):
            response["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))
        return response

    view = context.get("view")
    logger.exception("Unhandled error in %s", type(view).__name__ if view else "the API")
    return Response(
        envelope("server_error", "The server failed to answer this request; it was logged."),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def json_error(code: str, message: str, http_status: int) -> JsonResponse:
    """For errors raised outside DRF views (unknown API URLs, Django's 400 and 500 handlers)."""
    return JsonResponse(envelope(code, message), status=http_status)
