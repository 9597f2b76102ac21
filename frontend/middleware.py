"""Refusals in the console are the user's doing, not the server's.

A service refuses with PermissionDenied (the role does not allow it) or ValidationError (the
request does not make sense). A console view that lets one through would have Django log a
traceback (PermissionDenied) or answer a 500 (ValidationError). Here it becomes the error page
with the reason (403 or 400) and one log line: who tried what, and why it was refused.

A wrong method (a bookmarked or reloaded POST-only address, `require_POST`) gets Django's empty
405; here it becomes the error page saying what to do, or the API's envelope under /api/.
"""

import logging

from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseNotAllowed
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme

from ogai.api.errors import json_error

logger = logging.getLogger("frontend.refused")

# exception class → (status, the error page's title)
REFUSALS = {PermissionDenied: (403, "Not allowed"), ValidationError: (400, "Not done")}


class RefusalMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if isinstance(response, HttpResponseNotAllowed) and not response.content:
            return _not_allowed(request, response["Allow"])
        return response

    def process_exception(self, request, exception):
        refusal = next((answer for kind, answer in REFUSALS.items()
                        if isinstance(exception, kind)), None)
        # The API answers its own errors, in its envelope.
        if refusal is None or request.path.startswith("/api/"):
            return None
        status, title = refusal
        reason = _reason(exception)
        user = getattr(request, "user", None)
        who = user.get_username() if user is not None and user.is_authenticated else "anonymous"
        logger.warning("Refused %s %s for %s (%s): %s", request.method, request.path, who,
                       status, reason)
        response = render(request, "frontend/error.html",
                          {"status": status, "title": title, "message": reason}, status=status)
        # Logged above, with who and why: Django would log it again ("Forbidden: /path").
        response._has_been_logged = True
        return response


def _reason(exception) -> str:
    if isinstance(exception, ValidationError):
        text = " ".join(exception.messages)
    else:
        text = str(exception)
    return " ".join(text.split()) or "You may not do this."


def _not_allowed(request, allow: str):
    if request.path.startswith("/api/"):
        response = json_error("method_not_allowed",
                              f"{request.method} is not allowed here; use {allow}.", 405)
    else:
        back = request.headers.get("referer", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
            back = ""
        if "POST" in allow:
            message = ("This address takes a form submission, not a visit: go back to the "
                       "page it came from and use its button there.")
        else:
            message = f"This address does not take a {request.method} request; it takes {allow}."
        response = render(request, "frontend/error.html",
                          {"status": 405, "title": "Not a page to open", "message": message,
                           "back": back}, status=405)
    response["Allow"] = allow
    return response
