"""Refusals in the console are the user's doing, not the server's.

A service refuses with PermissionDenied (the role does not allow it) or ValidationError (the
request does not make sense). A console view that lets one through would have Django log a
traceback (PermissionDenied) or answer a 500 (ValidationError). Here it becomes the error page
with the reason (403 or 400) and one log line: who tried what, and why it was refused.
"""

import logging

from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import render

logger = logging.getLogger("frontend.refused")

# exception class → (status, the error page's title)
REFUSALS = {PermissionDenied: (403, "Not allowed"), ValidationError: (400, "Not done")}


class RefusalMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

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
